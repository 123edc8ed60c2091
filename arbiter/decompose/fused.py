"""Decompositions of PyTorch's fused inference kernels, applied to every graph when lowered.

``nn.TransformerEncoderLayer`` (and so ``nn.TransformerEncoder``) in eval mode under
``torch.no_grad()`` takes PyTorch's inference fast path (``batch_first=True``, an even
number of heads, relu or gelu; transformer.py): one ``aten._transformer_encoder_layer_fwd``
node per layer, which no backend's manifest lists, so every layer ran in eager. The op
is ``_native_multi_head_attention`` plus layer norms and a feed-forward block
(ATen's transformers/transformer.cpp and attention.cpp); ``nn.MultiheadAttention``'s own
fast path calls ``_native_multi_head_attention`` (not seen under torch.compile in torch
2.13: Dynamo traces the module's other path, tests/test_transformer_fastpath.py).

No backend takes these ops whole, so they are lowering decompositions for all
(``arbiter.run.lower``), like the config's ``decompositions:``, written as plain ATen ops
(linear, matmul, softmax, layer norm) with sizes read from the tensors, so they trace for
symbolic shapes too. They compute what the CPU kernels compute, masks included:

* ``mask`` is read as a boolean, True where attention is masked out; a floating mask is
  converted (``masked_softmax`` in attention.cpp: any nonzero value masks, ``-inf`` and
  ``-1.0`` alike, so it is not added as a bias). ``mask_type`` says its shape: 0 an
  attention mask ``(L, S)``, 1 a key-padding mask ``(B, S)``, 2 (or None) ``(B, H, L, S)``.
  A row whose keys are all masked is NaN, as the kernel's.
* a key-padding mask leaves the padded positions' outputs computed (attending to the
  unpadded keys), as the kernel does on a dense input. Only eager's nested-tensor path
  zeroes them (``nn.TransformerEncoder`` converts the input to a nested tensor there);
  under torch.compile that path is never taken (transformer.py skips it while compiling),
  with any backend: the compiled model's padded positions differ from uncompiled eager's.
* gelu is exact on CPU and tanh-approximated on CUDA (``_addmm_activation``'s epilogue).

Each returns ``NotImplemented`` for arguments the kernel refuses or that these do not
cover (nested tensors, a mask of another shape than its ``mask_type`` says): the op
then stays whole, and eager runs it as before.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

aten = torch.ops.aten


def table() -> dict:
    """{OpOverload: decomposition} of the fused inference ops, for ``aot_autograd``."""
    return {aten._native_multi_head_attention.default: native_multi_head_attention,
            aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer_fwd}


def _nested(*ts: Any) -> bool:
    return any(isinstance(t, torch.Tensor) and t.is_nested for t in ts)


def _mask(mask: torch.Tensor, mask_type: Any, scores: list) -> Any:
    """The mask as a boolean broadcastable to the scores (``scores``: B, H, L, S), or
    None where the kernel refuses it: a shape other than its ``mask_type`` says (sizes
    only compared where known to differ: symbolic ones get no new guard)."""
    b, _, length, source = scores
    want = {0: [length, source], 1: [b, source], 2: scores, None: scores}.get(mask_type)
    if want is None or mask.dim() != len(want) or any(
            statically_known_true(m != w) for m, w in zip(mask.shape, want)):
        return None
    if mask_type == 1:  # (B, S): every head and query row; (L, S) broadcasts as it is
        mask = aten.unsqueeze.default(aten.unsqueeze.default(mask, 1), 1)
    if mask.dtype != torch.bool:  # the kernel's `mask.to(kBool)`: nonzero masks
        mask = aten._to_copy.default(mask, dtype=torch.bool)
    return mask


def _heads(x: torch.Tensor, num_head: int) -> torch.Tensor:
    """(B, T, D) -> (B, H, T, D / H)."""
    b, t, d = x.shape
    return aten.transpose.int(aten.view.default(x, [b, t, num_head, d // num_head]), 1, 2)


def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias,
                                proj_weight, proj_bias, mask=None, need_weights=True,
                                average_attn_weights=True, mask_type=None):
    """``_native_multi_head_attention``: the in-projection (one matmul for
    self-attention), q scaled by 1/sqrt(head dim), softmax of q k^T with the mask's
    positions at -inf, the heads merged and projected. Returns (output, weights):
    weights (B, H, L, S) or their mean over heads, or an empty tensor without
    ``need_weights`` (what the op's fake kernel says, the graph's metadata)."""
    if _nested(query, key, value) or query.dim() != 3 or key.dim() != 3 or value.dim() != 3 \
            or embed_dim % num_head != 0:
        return NotImplemented
    d = embed_dim
    keep = None
    if mask is not None:
        keep = _mask(mask, mask_type, [query.shape[0], num_head, query.shape[1], key.shape[1]])
        if keep is None:
            return NotImplemented
    if query is key and key is value:  # self-attention: one projection, split
        q, k, v = aten.split.Tensor(aten.linear.default(query, qkv_weight, qkv_bias), d, -1)
    else:
        ws = aten.split.Tensor(qkv_weight, d, 0)
        bs = aten.split.Tensor(qkv_bias, d, 0)
        q, k, v = (aten.linear.default(x, w, b) for x, w, b in zip((query, key, value), ws, bs))
    head_dim = d // num_head
    # the kernel's scale, 1 / sqrt(head dim), on q (after its bias) before q k^T
    q = aten.mul.Tensor(_heads(q, num_head), 1.0 / math.sqrt(head_dim))
    k, v = _heads(k, num_head), _heads(v, num_head)
    scores = aten.matmul.default(q, aten.transpose.int(k, -2, -1))
    if keep is not None:
        scores = aten.masked_fill.Scalar(scores, keep, float("-inf"))
    probs = aten._softmax.default(scores, -1, False)
    ctx = aten.transpose.int(aten.matmul.default(probs, v), 1, 2)  # (B, L, H, head dim)
    b, length = ctx.shape[0], ctx.shape[1]
    out = aten.linear.default(aten.reshape.default(ctx, [b, length, d]), proj_weight, proj_bias)
    if not need_weights:
        return out, aten.new_empty.default(out, [0])
    if average_attn_weights:
        probs = aten.div.Tensor(aten.sum.dim_IntList(probs, [1]), num_head)
    return out, probs


def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                  proj_bias, use_gelu, norm_first, eps, norm_weight_1,
                                  norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1,
                                  ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                                  mask_type=None):
    """``_transformer_encoder_layer_fwd``: self-attention (``native_multi_head_attention``,
    no weights) and the feed-forward block, each added to its input, with the layer norms
    before each block (``norm_first``) or after each sum."""
    if _nested(src) or src.dim() != 3:
        return NotImplemented

    def norm(x, weight, bias):
        return aten.layer_norm.default(x, [embed_dim], weight, bias, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    attn = native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias,
                                       proj_weight, proj_bias, mask, False, True, mask_type)
    if attn is NotImplemented:
        return NotImplemented
    x = aten.add.Tensor(attn[0], src)
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    hidden = aten.linear.default(x, ffn_weight_1, ffn_bias_1)
    if use_gelu:  # _addmm_activation: exact on CPU, tanh in CUDA's GEMM epilogue
        hidden = aten.gelu.default(hidden, approximate="tanh" if src.is_cuda else "none")
    else:
        hidden = aten.relu.default(hidden)
    x = aten.add.Tensor(aten.linear.default(hidden, ffn_weight_2, ffn_bias_2), residual)
    if not norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    return x
