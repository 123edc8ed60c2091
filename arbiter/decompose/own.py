"""Arbiter's own decompositions, for ops PyTorch's table lacks or cannot serve.

For ops ``torch._decomp`` has no decomposition for, or decomposes into prims no exporter
takes. Each returns ``NotImplemented`` where it does not apply (the node then stays
whole).
"""
from __future__ import annotations

import torch


def extra() -> dict:
    """Decompositions arbiter adds where PyTorch's table (``torch._decomp``) has none:
    {OpOverload: function}. Each returns ``NotImplemented`` where it does not apply
    (the node then stays whole, and the backend that asked refuses it)."""
    return {torch.ops.aten.convolution_backward.default: _convolution_backward,
            torch.ops.aten.var_mean.correction: _var_mean,
            torch.ops.aten.squeeze.dims: _squeeze_dims,
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default:
                _flash_attention_for_cpu,
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default:
                _flash_attention_for_cpu_backward,
            torch.ops.aten._safe_softmax.default: _safe_softmax,
            **_quantization()}


def _quantization() -> dict:
    """The quantization ops' entries, where torch has registered them (a graph holding
    one has: its module registers them on import, which is not done here)."""
    try:
        choose = torch.ops.quantized_decomposed.choose_qparams.tensor
    except (AttributeError, RuntimeError):
        return {}
    return {choose: _choose_qparams}


def _choose_qparams(x, quant_min, quant_max, eps, dtype):
    """``quantized_decomposed.choose_qparams.tensor`` (dynamic quantization's scale and
    zero point of an activation, computed at run time) as eager computes it
    (``torch.ao.quantization.utils.determine_qparams``, affine): the range widened to
    take in 0, over the codes' span, at least ``eps``; the zero point rounded and clamped
    to the codes. Inductor's own decomposition leaves 0 out of the range: on an input
    whose every value is above 0 its scale and zero point differ from eager's (the
    probe's positive samples: every code off). Float32 inputs only (eager computes in the
    input's dtype)."""
    aten = torch.ops.aten
    if x.dtype != torch.float32 or x.numel() == 0:
        return NotImplemented
    low = aten.clamp_max.default(aten.min.default(x), 0.0)
    high = aten.clamp_min.default(aten.max.default(x), 0.0)
    scale = aten.div.Tensor(aten.sub.Tensor(high, low), float(quant_max - quant_min))
    scale = aten.view.default(aten.clamp_min.default(scale, eps), [1])
    codes = aten.round.default(aten.div.Tensor(aten.view.default(low, [1]), scale))
    zero_point = aten.clamp.default(aten.rsub.Scalar(codes, quant_min), quant_min, quant_max)
    return (aten._to_copy.default(scale, dtype=torch.float64),
            aten._to_copy.default(zero_point, dtype=torch.int64))


def _safe_softmax(x, dim, dtype=None):
    """``_safe_softmax`` (SDPA's math path: a row whose every entry is -inf gives 0, not
    NaN) as ``_softmax`` and a ``where`` on the row's maximum (``max.dim``, which both
    ONNX Runtime's and OpenVINO's manifests hold) being -inf. PyTorch's decomposition
    finds those rows with ``all.dim`` of ``eq(x, -inf)``, which OpenVINO's frontend does
    not list: Falcon-style attention kept every ``_safe_softmax`` in eager (a four-layer
    one ran as nine partitions, 0.85x eager). A NaN row stays NaN, as in the kernel.
    Floating inputs computed in their own dtype only."""
    aten = torch.ops.aten
    if not x.is_floating_point() or (dtype is not None and dtype != x.dtype):
        return NotImplemented
    probs = aten._softmax.default(x, dim, False)
    dead = aten.eq.Scalar(aten.max.dim(x, dim, True)[0], float("-inf"))
    return aten.where.self(dead, aten.zeros_like.default(probs), probs)


def _squeeze_dims(x, dims):
    """``squeeze.dims`` as a ``view`` (PyTorch's decomposition ends in
    ``prims.squeeze``): the named dimensions of size 1 dropped."""
    rank = max(x.dim(), 1)
    drop = {d % rank for d in ([dims] if isinstance(dims, int) else dims)}
    shape = [s for i, s in enumerate(x.shape) if not (i in drop and s == 1)]
    return torch.ops.aten.view.default(x, shape)


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    """``var_mean`` as ATen reductions (PyTorch's decomposition ends in ``prims.var``,
    which no exporter takes): the mean, then the mean-centred sum of squares divided by
    the element count less ``correction`` (1 when None). Training batch norm's batch
    statistics come through it."""
    aten = torch.ops.aten
    if not x.is_floating_point() or x.is_complex():
        return NotImplemented
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        dims = list(range(x.dim()))
    else:
        dims = [dim] if isinstance(dim, int) else list(dim)
    dims = [d % max(x.dim(), 1) for d in dims]
    n = 1
    for d in dims:
        n *= x.shape[d]
    c = 1 if correction is None else correction
    if not dims or n - c < 0:
        return NotImplemented
    centred = aten.sub.Tensor(x, aten.mean.dim(x, dims, True))
    var = aten.div.Scalar(aten.sum.dim_IntList(aten.mul.Tensor(centred, centred), dims,
                                                 keepdim), n - c)
    return var, aten.mean.dim(x, dims, keepdim)


def _attention_scores(query, key, dropout_p, is_causal, scale, attn_mask=None):
    """S = q k^T * scale + attn_mask, -inf above the diagonal when causal (top-left
    aligned, as the CPU flash kernel does); None where that does not apply (dropout: the
    op stays whole; other than 4-d, not floating point, a mask of another dtype than the
    query's: the kernel refuses those, SDPA turns a boolean mask into an additive one
    first). ``key`` has the query's heads (``head_groups``)."""
    aten = torch.ops.aten
    if dropout_p != 0.0:
        return None
    if query.dim() != 4 or key.shape[1] != query.shape[1] or not query.is_floating_point():
        return None
    if attn_mask is not None and (attn_mask.dtype != query.dtype or attn_mask.dim() > 4):
        return None
    length, source = query.shape[2], key.shape[2]
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    s = aten.mul.Scalar(aten.matmul.default(query, aten.transpose.int(key, -2, -1)), scale)
    if attn_mask is not None:
        s = aten.add.Tensor(s, attn_mask)
    if is_causal:
        allowed = aten.tril.default(aten.ones.default([length, source], dtype=torch.bool,
                                                      device=query.device))
        s = aten.masked_fill.Scalar(s, aten.logical_not.default(allowed), float("-inf"))
    return s


def head_groups(query, key, value):
    """How many query heads share one key/value head (grouped-query attention, SDPA's
    ``enable_gqa``: the CPU flash kernel takes key and value with fewer heads, query head
    ``h`` reading key/value head ``h // groups``); None where that is not a whole number
    of static heads (the op then stays whole). Tensors or traced values (OpenVINO's
    attention fusion asks the same of a node's values: backends/_openvino_convert.py)."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return None
    hq, hk, hv = query.shape[1], key.shape[1], value.shape[1]
    if hk == hq and hv == hq:  # symbolic heads too, as before grouped heads were taken
        return 1
    if not all(isinstance(h, int) for h in (hq, hk, hv)) or hk != hv or hk < 1 or hq % hk:
        return None
    return hq // hk


def _repeat_heads(t, groups: int):
    """``t`` (batch, heads, length, dim) with each head repeated ``groups`` times in place
    (``repeat_interleave`` on the heads, as SDPA's reference does for ``enable_gqa``)."""
    if groups == 1:
        return t
    aten = torch.ops.aten
    b, h, n, d = t.shape
    wide = aten.expand.default(aten.unsqueeze.default(t, 2), [b, h, groups, n, d])
    return aten.reshape.default(wide, [b, h * groups, n, d])


def _sum_heads(grad, groups: int):
    """The gradient of ``_repeat_heads``: each group of ``groups`` heads summed."""
    if groups == 1:
        return grad
    aten = torch.ops.aten
    b, h, n, d = grad.shape
    return aten.sum.dim_IntList(aten.reshape.default(grad, [b, h // groups, groups, n, d]), [2])


def _flash_attention_for_cpu(query, key, value, dropout_p=0.0, is_causal=False, *,
                             attn_mask=None, scale=None):
    """``_scaled_dot_product_flash_attention_for_cpu`` as matmuls and a softmax, with
    its real ``logsumexp`` (batch, heads, length): PyTorch's decomposition returns the
    attention matrix in its place, which a training step's backward reads (the
    "invalid dimensions for output" ONNX Runtime failed with). With an additive mask
    (what SDPA hands the kernel), a row the mask leaves no key is the kernel's: output
    0, logsumexp 0. Without dropout only (else the op stays whole).

    The probabilities are ``_softmax`` (one fused Softmax where the backend has one) and
    the logsumexp is computed on its own: an inference graph never reads it, and the
    decomposed graph's dead-code pass then drops it (T5-small's six attentions through
    ONNX Runtime were nine ops each, the softmax written out through the logsumexp)."""
    aten = torch.ops.aten
    groups = head_groups(query, key, value)
    if groups is None:
        return NotImplemented
    key, value = _repeat_heads(key, groups), _repeat_heads(value, groups)
    s = _attention_scores(query, key, dropout_p, is_causal, scale, attn_mask)
    if s is None:
        return NotImplemented
    probs = aten._softmax.default(s, -1, False)
    top = aten.max.dim(s, -1, True)[0]
    if attn_mask is not None:  # without one every row keeps a key, causal or not
        dead = aten.eq.Scalar(top, float("-inf"))
        zero = aten.zeros_like.default(top)
        top = aten.where.self(dead, zero, top)
        probs = aten.masked_fill.Scalar(probs, dead, 0.0)
    lse = aten.add.Tensor(aten.log.default(aten.sum.dim_IntList(
        aten.exp.default(aten.sub.Tensor(s, top)), [-1], True)), top)
    if attn_mask is not None:
        lse = aten.where.self(dead, zero, lse)
    return aten.matmul.default(probs, value), aten.view.default(lse, list(lse.shape[:-1]))


def _flash_attention_for_cpu_backward(grad_out, query, key, value, out, logsumexp,
                                      dropout_p=0.0, is_causal=False, *, attn_mask=None,
                                      scale=None):
    """Its backward from the saved ``logsumexp``, as the kernel computes it: P = exp(S -
    lse), dV = P^T dO, dS = P (dO V^T - rowsum(dO * O)), dQ = dS K * scale,
    dK = dS^T Q * scale (no gradient for the mask, as the kernel)."""
    aten = torch.ops.aten
    groups = head_groups(query, key, value)
    if groups is None:
        return NotImplemented
    key, value = _repeat_heads(key, groups), _repeat_heads(value, groups)
    s = _attention_scores(query, key, dropout_p, is_causal, scale, attn_mask)
    if s is None:
        return NotImplemented
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    probs = aten.exp.default(aten.sub.Tensor(s, aten.unsqueeze.default(logsumexp, -1)))
    grad_value = aten.matmul.default(aten.transpose.int(probs, -2, -1), grad_out)
    dp = aten.matmul.default(grad_out, aten.transpose.int(value, -2, -1))
    d = aten.sum.dim_IntList(aten.mul.Tensor(grad_out, out), [-1], True)
    ds = aten.mul.Tensor(probs, aten.sub.Tensor(dp, d))
    grad_query = aten.mul.Scalar(aten.matmul.default(ds, key), scale)
    grad_key = aten.mul.Scalar(aten.matmul.default(aten.transpose.int(ds, -2, -1), query),
                               scale)
    return grad_query, _sum_heads(grad_key, groups), _sum_heads(grad_value, groups)


def _convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                          transposed, output_padding, groups, output_mask):
    """``convolution_backward`` as convolutions, grouped (depthwise) and transposed ones
    included. A plain convolution's input gradient is the transposed convolution of the
    output's gradient with the same weight (and groups), its output padding what makes
    up the input's size; a transposed convolution's is the plain convolution of the
    output's gradient with its weight. The weight's gradient is ``_weight_grad`` (for a
    transposed convolution with the roles of input and output gradient swapped); the
    bias's is the output's gradient summed."""
    aten = torch.ops.aten
    nd = input.dim() - 2
    if nd < 1 or groups < 1:
        return NotImplemented

    def per_dim(v):
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        return v * nd if len(v) == 1 else v

    stride, padding, dilation = per_dim(stride), per_dim(padding), per_dim(dilation)
    kernel = list(weight.shape[2:])
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if transposed:
            grad_input = aten.convolution(grad_output, weight, None, stride, padding, dilation,
                                          False, [0] * nd, groups)
        else:
            extra_pad = [input.shape[2 + i] - ((grad_output.shape[2 + i] - 1) * stride[i]
                                               - 2 * padding[i] + dilation[i] * (kernel[i] - 1)
                                               + 1)
                         for i in range(nd)]
            grad_input = aten.convolution(grad_output, weight, None, stride, padding, dilation,
                                          True, extra_pad, groups)
    if output_mask[1]:
        if transposed:  # the weight is (input channels, output channels / groups, ...)
            grad_weight = _weight_grad(grad_output, input, kernel, stride, padding, dilation,
                                       groups)
        else:
            grad_weight = _weight_grad(input, grad_output, kernel, stride, padding, dilation,
                                       groups)
    if output_mask[2]:
        grad_bias = grad_output.sum([0, *range(2, grad_output.dim())])
    return grad_input, grad_weight, grad_bias


def _weight_grad(input, grad, kernel, stride, padding, dilation, groups):
    """The weight gradient of a plain convolution of ``input`` (N, C, ...) whose output's
    gradient is ``grad`` (N, K, ...): (K, C / groups, *kernel). One grouped convolution:
    the batch becomes the channels (input (C / groups, groups * N, ...), the gradient as
    the weight (K, N, ...)), stride and dilation trade places, and the result is cut to
    the kernel's size (a stride that does not divide leaves a remainder)."""
    aten = torch.ops.aten
    nd = input.dim() - 2
    n, c = input.shape[0], input.shape[1]
    spatial = list(input.shape[2:])
    x = aten.view.default(input, [n, groups, c // groups, *spatial])
    x = aten.permute.default(x, [2, 1, 0, *range(3, 3 + nd)])
    x = aten.reshape.default(x, [c // groups, groups * n, *spatial])
    gw = aten.convolution(x, aten.transpose.int(grad, 0, 1), None, dilation, padding, stride,
                          False, [0] * nd, groups)
    for i in range(nd):
        if gw.shape[2 + i] != kernel[i]:
            gw = aten.narrow.default(gw, 2 + i, 0, kernel[i])
    return aten.clone.default(aten.transpose.int(gw, 0, 1),
                              memory_format=torch.contiguous_format)

