"""How far rounding alone may take a graph's output from its exact value: its reduction length.

A floating result computed in working precision (unit roundoff ``u``, half the dtype's
``eps``) carries rounding error that depends on how it was computed: an elementwise op
rounds once, a sum of ``K`` terms rounds ``K - 1`` times, and a chain of ops adds each
step's error to what its inputs carried. Rounding errors of different terms are
uncorrelated in practice, so they add like a random walk: a sum's error is typically of
order ``u * sqrt(K)`` times the sum's size, far below the worst case ``u * K`` (Higham
and Mary, "A New Approach to Probabilistic Rounding Error Analysis", SIAM J. Sci.
Comput. 2019, prove the ``sqrt(K)`` growth with high probability). Along a chain, the
roundings of each step add up the same way, so an output at the end of reductions of
lengths ``K1, K2, ...`` carries an error of order ``u * sqrt(K1 + K2 + ...)`` relative
to its scale.

``reduction_lengths(gm)`` is that sum for each output of an ATen graph, read off the
graph: for each node, the length of the sums it computes (a matmul's or convolution's
contraction from PyTorch's FLOP formulas, ``torch.utils.flop_counter``; a reduction's
input elements per output element; a normalization's or softmax's reduced dims), added
along the longest chain from the inputs. ``arithmetic_rms(dtype, k, scale)`` is the RMS
error that arithmetic explains, ``ROUNDING_FACTOR * eps * sqrt(k) * scale``. The
float64 judgement (reference.py) lets an output through whose error is within it, or
within a few times eager's own. docs/verify.md.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.fx

from ...ops import is_getitem, op_name, output_values

#: how many times ``eps * sqrt(K) * scale`` rounding is allowed: the random-walk estimate
#: is an expectation, and a backend that reorders sums (blocked, tree or vectorized
#: reductions, fused multiply-adds, another algorithm such as Winograd convolution) rounds
#: differently from eager (a float32 row sum of 8192 terms added sequentially: 0.11 of
#: ``eps * sqrt(K) * scale``; tests/test_error_bound.py)
ROUNDING_FACTOR = 4.0

#: ops (names without namespace and overload, or their beginnings) whose output is
#: smaller than an input without summing anything: they pick values, and their input
#: elements per output element are not a reduction length
_PICKS = ("index", "gather", "select", "slice", "narrow", "take", "embedding", "_embedding_bag",
          "split", "unbind", "chunk", "as_strided", "diagonal", "max_pool", "adaptive_max_pool",
          "amax", "amin", "max", "min", "argmax", "argmin", "topk", "sort", "median", "view",
          "_unsafe_view", "reshape", "_to_copy", "clone", "copy", "expand", "squeeze",
          "unsqueeze", "permute", "t", "transpose", "alias", "detach", "lift_fresh_copy")


def _picks(name: str) -> bool:
    base = name.split(".")[1] if name.count(".") >= 2 else name
    return base in _PICKS or base.startswith(("index", "max_pool", "adaptive_max_pool",
                                              "embedding", "_embedding_bag"))


def _numel(v: Any) -> Optional[int]:
    """``v``'s element count; None for a non-tensor or a symbolic size (no guard added)."""
    if not isinstance(v, torch.Tensor) or not all(type(d) is int for d in v.shape):
        return None
    return math.prod(v.shape)


def _tensors(v: Any) -> list:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for t in v if isinstance(t, torch.Tensor)]
    return []


def _flop_length(node: torch.fx.Node, outs: list) -> Optional[float]:
    """A contraction's length from PyTorch's FLOP formula: FLOPs / (2 * outputs)."""
    from torch.utils.flop_counter import flop_registry

    packet = getattr(node.target, "overloadpacket", None)
    formula = flop_registry.get(packet)
    if formula is None or any(_numel(t) is None for t in outs):
        return None
    meta = lambda a: a.meta.get("val") if isinstance(a, torch.fx.Node) else a  # noqa: E731
    args = torch.fx.node.map_aggregate(node.args, lambda a: meta(a))
    kwargs = torch.fx.node.map_aggregate(node.kwargs, lambda a: meta(a))
    out_val = node.meta.get("val")
    try:
        flops = int(formula(*args, out_val=out_val, **kwargs))
    except Exception:  # noqa: BLE001 - a formula that cannot read these shapes: unknown
        return None
    produced = sum(n for n in map(_numel, outs) if n)
    return flops / (2 * produced) if produced else None


def _dims_length(node: torch.fx.Node, first: torch.Tensor) -> float:
    """The reduced length of an op that keeps its input's shape (softmax, cumsum, a
    norm's output): the product of the sizes of its ``dim`` or ``normalized_shape``."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return 1.0
    for i, arg in enumerate(schema.arguments):
        value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
        if arg.name == "dim" and value is not None:
            dims = value if isinstance(value, (list, tuple)) else [value]
            rank = first.dim()
            sizes = [first.shape[d] for d in dims if type(d) is int and -rank <= d < rank]
        elif arg.name == "normalized_shape" and value is not None:
            sizes = list(value)
        else:
            continue
        # a symbolic size is unknown: no guard is added by reading it
        return float(math.prod(sizes)) if sizes and all(type(v) is int for v in sizes) else 1.0
    return 1.0


def node_length(node: torch.fx.Node) -> float:
    """The length of the longest sum one element of ``node``'s outputs is computed by
    (1 for an elementwise op; module docstring)."""
    outs = _tensors(node.meta.get("val"))
    if node.op != "call_function" or not outs or is_getitem(node):
        return 0.0
    flop = _flop_length(node, outs)
    if flop is not None:
        return max(flop, 1.0)
    name = op_name(node.target)
    ins = [v for a in node.all_input_nodes for v in _tensors(a.meta.get("val"))]
    if not ins or _picks(name):
        return 1.0
    first = max(ins, key=lambda t: _numel(t) or 0)
    biggest = _numel(first) or 0
    smallest = min((n for n in map(_numel, outs) if n), default=0)
    ratio = biggest / smallest if smallest else 1.0
    return max(ratio, _dims_length(node, first), 1.0)


def reduction_lengths(gm: torch.fx.GraphModule) -> Optional[list[Optional[float]]]:
    """For each output of ``gm`` (a graph returning a tuple), the sum of the reduction
    lengths along the longest chain of ops that computes it (module docstring); None
    for an output that is not a node, and None when the graph has no tuple output."""
    if output_values(gm) is None:
        return None
    length: dict[torch.fx.Node, float] = {}
    out_node = None
    for node in gm.graph.nodes:
        if node.op == "output":
            out_node = node
            continue
        before = max((length.get(a, 0.0) for a in node.all_input_nodes), default=0.0)
        length[node] = before + node_length(node)
    return [length.get(a) if isinstance(a, torch.fx.Node) else None
            for a in out_node.args[0]]


def arithmetic_rms(dtype: torch.dtype, length: Optional[float], scale: float) -> float:
    """The RMS error that rounding in ``dtype`` explains for an output of RMS ``scale``
    computed through reductions of total length ``length`` (0 when unknown)."""
    if length is None or not dtype.is_floating_point:
        return 0.0
    return ROUNDING_FACTOR * torch.finfo(dtype).eps * math.sqrt(max(length, 1.0)) * scale
