"""Per-backend decompositions: a node is decomposed only for the backend that asked.

A manifest's ``decompositions:`` lists ops the backend runs through PyTorch's own
decomposition (``torch._decomp``), e.g. ONNX Runtime's ``native_layer_norm_backward``,
which its exporter has no translation for. Two backends' wishes never meet:

* planning (``arbiter.capability``): a node of such an op is offered to that backend when
  every node of its decomposition, traced on fake tensors of the node's own shapes
  (``trace``; no tensor is computed), is a node that backend can run. Other backends are
  asked about the node as it is;
* compiling (``arbiter.run.piece``): the partition handed to that backend has those
  nodes replaced by their decompositions (``for_backend``); the next backends of the
  partition's chain, eager ATen and ``verify`` get the partition as planned.

The config's ``decompositions:`` still applies to the whole graph, before partitioning
(``arbiter.run.lower``): that is the user's choice for every backend.

A traced decomposition is kept per op, argument values and tensor shapes/strides (a
transformer's layers share one), in a bounded process-wide cache.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import torch
import torch.fx
from torch.utils import _pytree as pytree

from .ops import is_getitem, op_name, packet_name

log = logging.getLogger(__name__)

#: traced decompositions kept (per op, argument values and shapes)
CACHE_SIZE = 4096


class NotDecomposable(Exception):
    """Why a node's decomposition cannot be traced (the reason is the message)."""


#: A decomposition that declines these arguments (returns NotImplemented: SDPA's with a
#: mask, say) leaves the op itself: the node is then not decomposed, and a backend judges
#: it as it is (its manifest entry), as before it asked for the decomposition.
KEEPS_OP = "its decomposition keeps the op itself"
#: A node of symbolic shapes is not decomposed either: decompositions are traced for
#: static shapes. It is handed over whole, and judged whole (its manifest entry, which
#: says whether the op may take symbols): a decomposition that cannot serve a symbolic
#: node leaves it to the backend's own support, never pushes it to eager.
SYMBOLIC_KEEPS = "its shapes are symbolic (decompositions are traced for static shapes)"


def resolve_op(name: str) -> Any:
    """``aten.x.overload`` -> the OpOverload; ``aten.x`` -> the OpOverloadPacket."""
    ns, base, *rest = name.split(".")
    packet = getattr(getattr(torch.ops, ns), base)
    return getattr(packet, rest[0]) if rest else packet


def table(names: Iterable[str]) -> dict:
    """PyTorch's decompositions of the ops named (``aten.x`` means every overload), and
    arbiter's own (``extra()``) for ops PyTorch's table lacks."""
    from torch._decomp import get_decompositions

    ops = [resolve_op(n) for n in names]
    out = get_decompositions(ops)
    for op, fn in extra().items():  # arbiter's own win: PyTorch's may produce prims
        if op in ops or op.overloadpacket in ops:
            out[op] = fn
    return out


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
                _flash_attention_for_cpu_backward}


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
    op stays whole; other than 4-d, grouped heads, not floating point, a mask of another
    dtype than the query's: the kernel refuses those, SDPA turns a boolean mask into an
    additive one first)."""
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


def _flash_attention_for_cpu(query, key, value, dropout_p=0.0, is_causal=False, *,
                             attn_mask=None, scale=None):
    """``_scaled_dot_product_flash_attention_for_cpu`` as matmuls and a softmax, with
    its real ``logsumexp`` (batch, heads, length): PyTorch's decomposition returns the
    attention matrix in its place, which a training step's backward reads (the
    "invalid dimensions for output" ONNX Runtime failed with). With an additive mask
    (what SDPA hands the kernel), a row the mask leaves no key is the kernel's: output
    0, logsumexp 0. Without dropout only (else the op stays whole)."""
    aten = torch.ops.aten
    s = _attention_scores(query, key, dropout_p, is_causal, scale, attn_mask)
    if s is None:
        return NotImplemented
    top = aten.max.dim(s, -1, True)[0]
    if attn_mask is not None:  # without one every row keeps a key, causal or not
        dead = aten.eq.Scalar(top, float("-inf"))
        zero = aten.zeros_like.default(top)
        top = aten.where.self(dead, zero, top)
    lse = aten.add.Tensor(aten.log.default(aten.sum.dim_IntList(
        aten.exp.default(aten.sub.Tensor(s, top)), [-1], True)), top)
    if attn_mask is not None:
        lse = aten.where.self(dead, zero, lse)
    probs = aten.exp.default(aten.sub.Tensor(s, lse))
    return aten.matmul.default(probs, value), aten.view.default(lse, list(lse.shape[:-1]))


def _flash_attention_for_cpu_backward(grad_out, query, key, value, out, logsumexp,
                                      dropout_p=0.0, is_causal=False, *, attn_mask=None,
                                      scale=None):
    """Its backward from the saved ``logsumexp``, as the kernel computes it: P = exp(S -
    lse), dV = P^T dO, dS = P (dO V^T - rowsum(dO * O)), dQ = dS K * scale,
    dK = dS^T Q * scale (no gradient for the mask, as the kernel)."""
    aten = torch.ops.aten
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
    return grad_query, grad_key, grad_value


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


# -- dropout: the mask drawn apart from the data (config `random: eager`) ------------------
#: dtypes whose dropout is split (``split_dropout``): for float16/bfloat16 eager's
#: ``mul_(scale)`` rounds otherwise than ``mul.Tensor`` (measured: same mask, other output)
SPLIT_DROPOUT_DTYPES = (torch.float32, torch.float64)

_MASK_OP: Any = None


def dropout_mask_op() -> Any:
    """``arbiter.dropout_mask(size, stride, p, dtype) -> Tensor(bool)``: the mask eager's
    CPU ``native_dropout`` draws for an input of that geometry and dtype (``empty_like``,
    ``bernoulli_(1 - p)``, as bool), reading no tensor. Tagged ``nondeterministic_seeded``,
    so it is a random op (``ops.is_random``) like the dropout it comes from: it runs in
    place, in the order of the graph's random ops. Defined on first use."""
    global _MASK_OP
    with _LOCK:
        if _MASK_OP is None:
            lib = torch.library.Library("arbiter", "FRAGMENT")  # noqa: TOR901 - kept below
            lib.define("dropout_mask(int[] size, int[] stride, float p, ScalarType dtype) "
                       "-> Tensor", tags=(torch.Tag.nondeterministic_seeded,))
            lib.impl("dropout_mask", _draw_mask, "CompositeExplicitAutograd")
            torch.library.register_fake("arbiter::dropout_mask", _fake_mask, lib=lib)
            _LIBS.append(lib)
            _MASK_OP = torch.ops.arbiter.dropout_mask.default
    return _MASK_OP


_LIBS: list = []  # the library fragment lives as long as the process


def _draw_mask(size, stride, p, dtype):
    drawn = torch.empty_strided(size, stride, dtype=dtype)
    drawn.bernoulli_(1.0 - p)
    return drawn.to(torch.bool)


def _fake_mask(size, stride, p, dtype):
    return torch.empty_strided(size, stride, dtype=torch.bool)


def _native_dropout_split(x, p, train):
    """``native_dropout`` as eager's CPU kernel computes it, with its random draw apart:
    ``mask = dropout_mask(...)`` (no input), ``out = x * mask * (1 / (1 - p))`` (0 when
    ``p == 1``). Bit-equal to eager's outputs and RNG stream for float32/float64 inputs
    on the CPU with static shapes; NotImplemented otherwise (the op stays whole)."""
    aten = torch.ops.aten
    if (train is not None and not train) or x.dtype not in SPLIT_DROPOUT_DTYPES \
            or x.device.type != "cpu" or x.numel() == 0 \
            or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        return NotImplemented
    from torch._prims_common import is_non_overlapping_and_dense_or_false as dense

    # eager's mask is empty_like(x), filled in memory order: x's own layout where x is
    # dense (a non-dense x, rare before a dropout, stays whole)
    if not dense(x):
        return NotImplemented
    mask = dropout_mask_op()(list(x.shape), list(x.stride()), float(p), x.dtype)
    keep = 1.0 - p
    scale = 0.0 if keep == 0 else 1.0 / keep
    out = aten.mul.Tensor(aten.mul.Tensor(x, aten._to_copy.default(mask, dtype=x.dtype)), scale)
    return out, mask


def split_dropout(gm: torch.fx.GraphModule) -> int:
    """Rewrite ``gm`` in place (config ``random: eager``): each ``native_dropout`` that
    ``_native_dropout_split`` takes becomes a ``dropout_mask`` node (the only random
    one, reading nothing) and the multiplications by the mask and the scale (compute
    any backend may take). Each mask node moves up to just after the previous random
    node (or the graph's inputs): random ops keep their relative order (eager's RNG
    stream; ``plan.partition`` chains them), and the partitioner can draw every mask
    in one eager partition before the compute instead of cutting it at every dropout.
    Returns how many were split; dropouts of symbolic shapes, float16/bfloat16, other
    devices or ``train=False`` stay as they are."""
    from .ops import is_random

    target = torch.ops.aten.native_dropout.default
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]
    if not nodes:
        return 0
    split = 0
    for node in nodes:
        if not all(is_getitem(u) and isinstance(u.args[1], int) for u in node.users):
            log.debug("%s stays whole: read whole, not through getitem", node.name)
            continue
        try:
            sub = _DROPOUT.trace(node)
            _inline(gm.graph, node, sub)
        except NotDecomposable as exc:
            log.debug("%s stays whole: %s", node.name, exc)
            continue
        split += 1
    if not split:
        return 0
    mask = dropout_mask_op()
    anchor = None
    for n in list(gm.graph.nodes):
        if n.op in ("placeholder", "get_attr"):
            anchor = n
        elif n.op == "call_function" and n.target is mask:
            if anchor is None:  # no input: to the top
                first = next(iter(gm.graph.nodes))
                if first is not n:
                    first.prepend(n)
            elif anchor.next is not n:
                anchor.append(n)
            anchor = n
        elif n.op == "call_function" and is_random(n):
            anchor = n
    gm.graph.lint()
    gm.recompile()
    log.debug("split %d of %d native_dropout into an eager mask and compute", split, len(nodes))
    return split


def wants(names: Sequence[str], op: str) -> bool:
    """Whether a manifest's ``decompositions`` list (``names``) names ``op``."""
    return op in names or packet_name(op) in names


class Decompositions:
    """One backend's ``decompositions:``: which nodes it wants decomposed, and how."""

    def __init__(self, names: Sequence[str], decompositions: Optional[dict] = None):
        self.names = tuple(names)
        if decompositions is not None:  # a table of its own ({OpOverload: function})
            self.table = dict(decompositions)
        else:
            self.table = table(self.names) if self.names else {}

    def __bool__(self) -> bool:
        return bool(self.table)

    def applies(self, node: torch.fx.Node) -> bool:
        """Whether ``node`` is an op of the list with a decomposition in the table."""
        return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
                and node.target in self.table and wants(self.names, op_name(node.target)))

    def keeps(self, node: torch.fx.Node) -> bool:
        """Whether the decomposition of ``node`` declines its arguments (``KEEPS_OP``), or
        the node is symbolic (``SYMBOLIC_KEEPS``): the node is then handed over whole."""
        return self.kept_because(node) is not None

    def kept_because(self, node: torch.fx.Node) -> Optional[str]:
        """Why ``node`` is handed over whole (``KEEPS_OP`` or ``SYMBOLIC_KEEPS``), or None."""
        try:
            self.trace(node)
        except NotDecomposable as exc:
            return str(exc) if str(exc) in (KEEPS_OP, SYMBOLIC_KEEPS) else None
        return None

    def trace(self, node: torch.fx.Node) -> torch.fx.GraphModule:
        """The decomposition of ``node`` as an ATen graph: one placeholder per tensor
        argument (in ``_tensor_args`` order), its output(s) as the node returns them,
        ``meta["val"]`` on every node. Raises ``NotDecomposable`` with the reason."""
        key = _key(node)
        try:
            hash(key)
        except TypeError:  # symbolic sizes (SymInt) are unhashable: not cached
            hit = _trace(node, self.table)
            if isinstance(hit, str):
                raise NotDecomposable(hit) from None
            return hit
        with _LOCK:
            hit = _CACHE.get((id(self.table), key))
            if hit is not None:
                _CACHE.move_to_end((id(self.table), key))
        if hit is None:
            hit = _trace(node, self.table)
            with _LOCK:
                _CACHE[(id(self.table), key)] = hit
                while len(_CACHE) > CACHE_SIZE:
                    _CACHE.popitem(last=False)
        if isinstance(hit, str):
            raise NotDecomposable(hit)
        return hit

    def apply(self, gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        """``gm`` with every node this backend wants decomposed replaced by its traced
        decomposition; ``gm`` itself when there is none (a copy otherwise: the caller's
        graph is what eager and the other backends run)."""
        if not self or not any(self.applies(n) and not self.keeps(n) for n in gm.graph.nodes):
            return gm
        import copy

        new = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph), class_name=type(gm).__name__)
        for node in list(new.graph.nodes):
            if self.applies(node) and not self.keeps(node):
                _inline(new.graph, node, self.trace(node))
        new.graph.eliminate_dead_code()
        new.graph.lint()
        new.recompile()
        return new


_CACHE: "OrderedDict[tuple, Any]" = OrderedDict()
_LOCK = threading.Lock()
_BY_NAMES: dict[tuple, Decompositions] = {}


_DROPOUT = Decompositions(("aten.native_dropout.default",),
                          {torch.ops.aten.native_dropout.default: _native_dropout_split})


def for_names(names: Sequence[str]) -> Decompositions:
    """The (shared) ``Decompositions`` of one list of op names."""
    key = tuple(names)
    with _LOCK:
        hit = _BY_NAMES.get(key)
    if hit is None:
        hit = Decompositions(key)
        with _LOCK:
            hit = _BY_NAMES.setdefault(key, hit)
    return hit


def for_backend(gm: torch.fx.GraphModule, backend: Any) -> torch.fx.GraphModule:
    """The partition ``gm`` as ``backend`` (a ``registry.Backend``) gets it: the nodes its
    manifest's ``decompositions:`` names replaced by their decompositions. A view of a
    backend without a manifest of its own (``run.dynamic.Symbolic``: decompositions are
    traced for static shapes only) gets ``gm`` as it is; ``run.dynamic.PerShape``
    decomposes each specialized (static) graph itself."""
    manifest = getattr(backend, "manifest", None)
    if manifest is None:
        return gm
    try:
        names = manifest().decompositions
    except Exception:  # noqa: BLE001 - no manifest (a probe's ad-hoc backend): none wanted
        log.debug("%s: no manifest, nothing decomposed for it", getattr(backend, "name", backend),
                  exc_info=True)
        return gm
    return for_names(names).apply(gm) if names else gm


# -- tracing -------------------------------------------------------------------------------
def _tensor_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The node arguments of ``node`` (in args, kwargs order, each once)."""
    return list(node.all_input_nodes)


def _key(node: torch.fx.Node) -> tuple:
    def one(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            v = a.meta.get("val")
            if isinstance(v, torch.Tensor):
                return ("T", tuple(v.shape), tuple(v.stride()), v.dtype, v.device.type)
            return ("N", repr(v))
        return a if isinstance(a, (int, float, bool, str, type(None), torch.dtype,
                                   torch.device, torch.layout, torch.memory_format)) \
            else repr(a)

    flat, spec = pytree.tree_flatten((node.args, node.kwargs))
    try:
        return (node.target, tuple(map(one, flat)), str(spec))
    except TypeError:  # an unhashable argument: a key that never repeats
        return (node.target, id(node))


def _trace(node: torch.fx.Node, decomps: dict) -> Any:
    """The traced decomposition of ``node`` (a GraphModule), or why not (a str)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    inputs = _tensor_args(node)
    vals = []
    for n in inputs:
        v = n.meta.get("val")
        if not isinstance(v, torch.Tensor):
            return f"input {n.name} is not a tensor with metadata"
        if not all(isinstance(s, int) for s in (*v.shape, *v.stride())):
            return SYMBOLIC_KEEPS
        vals.append(v)
    flat, spec = pytree.tree_flatten((node.args, node.kwargs))
    if any(not isinstance(a, torch.fx.Node) and isinstance(a, (torch.SymInt, torch.SymFloat))
           for a in flat):
        return SYMBOLIC_KEEPS
    where = {n: k for k, n in enumerate(inputs)}
    target = node.target

    want = node.meta.get("val")

    def fn(*ts):
        args, kwargs = pytree.tree_unflatten(
            [ts[where[a]] if isinstance(a, torch.fx.Node) else a for a in flat], spec)
        out = target(*args, **kwargs)
        # the node's users (views) rely on its outputs' strides: the decomposition's
        # outputs are given the node's layout where it differs
        if isinstance(out, torch.Tensor) and isinstance(want, torch.Tensor):
            return _restride(out, want)
        if isinstance(out, (tuple, list)) and isinstance(want, (tuple, list)) \
                and len(out) == len(want):
            return type(out)(_restride(o, w) if isinstance(o, torch.Tensor)
                             and isinstance(w, torch.Tensor) else o
                             for o, w in zip(out, want))
        return out

    mode = FakeTensorMode()
    try:
        with mode:
            fakes = [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
                     for v in vals]
        gm = make_fx(fn, tracing_mode="fake", decomposition_table=decomps)(*fakes)
    except Exception as exc:  # noqa: BLE001 - the reason goes to the report
        log.debug("tracing the decomposition of %s failed", node.format_node(), exc_info=True)
        return f"its decomposition could not be traced ({type(exc).__name__}: {str(exc)[:160]})"
    ops = [m for m in gm.graph.nodes if m.op == "call_function"]
    if any(m.target is target for m in ops):
        return KEEPS_OP
    return gm


def _restride(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t`` laid out with ``like``'s strides (dense, a permutation of a contiguous
    layout): permute, make contiguous, permute back. Raises when ``like``'s layout is not
    such a permutation (the node is then not decomposed)."""
    if tuple(t.shape) != tuple(like.shape) or _same_layout(t, like):
        return t
    order = sorted(range(like.dim()), key=lambda d: (-like.stride()[d], d))
    back = [order.index(d) for d in range(like.dim())]
    out = t.permute(order).contiguous().permute(back)
    if not _same_layout(out, like):
        raise NotDecomposable("its decomposition's output has other strides than the op's, "
                              f"{tuple(t.stride())} for {tuple(like.stride())}")
    return out


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal strides on every dimension of size above 1."""
    return all(n <= 1 or x == y for n, x, y in zip(a.shape, a.stride(), b.stride()))


def _inline(graph: torch.fx.Graph, node: torch.fx.Node, sub: torch.fx.GraphModule) -> None:
    """Replace ``node`` in ``graph`` by the nodes of ``sub`` (from ``Decompositions.trace``)."""
    inputs = _tensor_args(node)
    env: dict[torch.fx.Node, Any] = {}
    placeholders = [m for m in sub.graph.nodes if m.op == "placeholder"]
    for p, arg in zip(placeholders, inputs):
        env[p] = arg
    result: Any = None
    with graph.inserting_before(node):
        for m in sub.graph.nodes:
            if m.op == "placeholder":
                continue
            if m.op == "output":
                result = pytree.tree_map(lambda a: env[a] if isinstance(a, torch.fx.Node) else a,
                                         m.args[0])
                break
            if m.op == "get_attr":  # a constant the decomposition made (a scalar tensor)
                name = f"_decomp_const_{len(list(graph.owning_module.named_buffers()))}"
                graph.owning_module.register_buffer(name, getattr(sub, m.target), persistent=False)
                env[m] = graph.get_attr(name)
            else:
                env[m] = graph.node_copy(m, lambda a: env[a])
            env[m].meta = dict(m.meta)
    if isinstance(result, (tuple, list)):
        for user in list(node.users):
            if not (is_getitem(user) and isinstance(user.args[1], int)):
                raise NotDecomposable(f"{node.name} is read whole, not through getitem")
            user.replace_all_uses_with(result[user.args[1]])
            graph.erase_node(user)
    else:
        node.replace_all_uses_with(result)
    graph.erase_node(node)
