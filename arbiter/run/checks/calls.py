"""Checks around one call of a compiled backend.

Non-finite inputs (``exact_nonfinite: guard``), inputs a backend wrote into (copies
taken before the call, written back), and output buffers a second call reuses.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Optional

import torch

from ...ops import all_finite as finite
from ...ops import tensors_in

log = logging.getLogger("arbiter.run.piece")  # a piece's own log


def all_finite(args: Sequence[Any]) -> bool:
    """Whether every floating-point tensor among ``args`` (nested values too) is free of
    NaN and inf (``ops.all_finite``)."""
    return finite([t for a in args for t in tensors_in(a)])


def snapshot(args: Sequence[Any]) -> list:
    """Copies of the tensor arguments (same strides where the layout allows)."""
    return [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]


def restore(args: Sequence[Any], before: Sequence[Any]) -> None:
    """Write the copies back into the arguments a backend changed."""
    for a, b in zip(args, before):
        if isinstance(a, torch.Tensor) and not same_bits(a, b):
            try:
                with torch.no_grad():
                    a.copy_(b)
            except RuntimeError:  # an expanded (overlapping) input cannot be written
                log.debug("cannot restore an input", exc_info=True)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN equals the same NaN, -0.0 differs from 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    try:
        return torch.equal(a.detach().reshape(-1).contiguous().view(torch.uint8),
                           b.detach().reshape(-1).contiguous().view(torch.uint8))
    except RuntimeError:  # a layout without a byte view (sparse...)
        return bool(torch.equal(a, b))


def shared_buffers(first: Any, second: Any, args: Sequence[Any] = ()
                   ) -> Optional[tuple[int, int]]:
    """(i, j) when output j of the second call shares memory with output i of the
    first, else None. An output that is a view of an input (``args``) shares the
    input's memory on every call by design (a compiled ``view``, ``t``, or an input
    returned as it is): not a reused buffer."""
    def spans(outs):
        found = []
        for k, t in enumerate(outs if isinstance(outs, (list, tuple)) else ()):
            if isinstance(t, torch.Tensor) and t.numel() and t.layout == torch.strided:
                st = t.untyped_storage()
                found.append((k, st.data_ptr(), st.data_ptr() + st.nbytes(), t.device))
        return found

    def overlap(a, b) -> bool:
        return a[3] == b[3] and a[1] < b[2] and b[1] < a[2]

    inputs = spans(list(tensors_in(list(args))))
    earlier = [s for s in spans(first) if not any(overlap(s, i) for i in inputs)]
    for span in spans(second):
        if any(overlap(span, i) for i in inputs):
            continue
        for old in earlier:
            if overlap(span, old):
                return old[0], span[0]
    return None


#: ops that read rows at positions a tensor holds, with (argument of the indexed tensor,
#: argument of the dimension or None for 0, argument of the index, negative allowed)
_INDEXING = {
    "aten.embedding.default": (0, None, 1, False),
    "aten.index_select.default": (0, 1, 2, False),
    "aten.gather.default": (0, 1, 2, False),
    "aten.index_copy.default": (0, 1, 2, False),
    "aten.index_add.default": (0, 1, 2, False),
    "aten.scatter.src": (0, 1, 2, False),
    "aten.scatter.value": (0, 1, 2, False),
    "aten.scatter_add.default": (0, 1, 2, False),
    "aten.scatter_reduce.two": (0, 1, 2, False),
}
#: advanced indexing (``x[i]``, ``x[i] = v``): a list of indices, the k-th for dimension
#: k, negative positions counted from the end as in Python
_ADVANCED = ("aten.index.Tensor", "aten.index_put.default", "aten._unsafe_index.Tensor",
             "aten._unsafe_index_put.default")


class IndexGuard:
    """Bounds of the positions a partition reads from its own inputs (token ids into an
    embedding, cache positions into ``index_copy``, ``x[i]``, ``scatter``'s index),
    checked before a backend runs: backends answer an index out of range with a garbage
    or zero row (OpenVINO), a wrapped negative one (ONNX Runtime's scatter), an error of
    their own (ONNX Runtime's Gather) or a process abort (an Inductor kernel's bounds
    check inside a parallel loop). Out of range, eager ATen runs the call and raises
    eager's error, the user's (``Piece``). A symbolic size is computed per call from the
    inputs' sizes (``shapes.Reader``); one no input gives is not checked."""

    def __init__(self, checks: list[tuple[int, Any, bool]], sizes: Optional[Any] = None):
        # (input position, rows: an int, or the position in ``sizes(args)``, negative
        # allowed); ``sizes``: the symbolic rows' values from a call's arguments
        self._checks = checks
        self._sizes = sizes

    @classmethod
    def of(cls, gm: torch.fx.GraphModule) -> Optional["IndexGuard"]:
        found = list(_indexed(gm))
        if not found:
            return None
        from ...shapes import Reader, expr, input_values

        found = [(i, rows if isinstance(rows, int) else expr(rows), negative)
                 for i, rows, negative in found]
        symbolic = sorted({rows for _, rows, _ in found if not isinstance(rows, int)}, key=str)
        sizes = None
        if symbolic:
            reader = Reader(input_values(gm))
            sizes = reader.function(symbolic, "index_rows") if reader.env is not None \
                else None
        checks = []
        for i, rows, negative in found:
            if isinstance(rows, int):
                checks.append((i, rows, negative))
            elif sizes is not None:  # else: the backend's own check, as before
                checks.append((i, ("sym", symbolic.index(rows)), negative))
        return cls(sorted(set(checks), key=str), sizes) if checks else None

    def ok(self, args: Sequence[Any]) -> bool:
        """Whether every checked index is in range."""
        sized = None
        for i, rows, negative in self._checks:
            t = args[i] if i < len(args) else None
            if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.is_floating_point() \
                    or t.dtype == torch.bool:
                continue
            if not isinstance(rows, int):
                if sized is None:
                    sized = self._sizes(args)
                rows = int(sized[rows[1]])
            lo, hi = torch.aminmax(t)
            if int(hi) >= rows or int(lo) < (-rows if negative else 0):
                return False
        return True


def _indexed(gm: torch.fx.GraphModule):
    """(input position of an index, the indexed dimension's size: an int or a SymInt,
    negative allowed) for each index a partition reads straight from its inputs."""
    from ...ops import op_name

    placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes
                                               if n.op == "placeholder")}

    def size(src, dim):
        val = getattr(src, "meta", {}).get("val")
        if not isinstance(val, torch.Tensor) or not isinstance(dim, int) or \
                not -val.dim() <= dim < max(val.dim(), 1):
            return None
        return val.shape[dim] if val.dim() else 1

    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        name = op_name(n.target)
        if name in _ADVANCED and len(n.args) > 1 and isinstance(n.args[1], (list, tuple)):
            for dim, idx in enumerate(n.args[1]):
                rows = size(n.args[0], dim) if idx in placeholders else None
                if rows is not None:
                    yield placeholders[idx], rows, True
            continue
        spec = _INDEXING.get(name)
        if spec is None:
            continue
        src, dim_at, idx_at, negative = spec
        if len(n.args) <= max(src, idx_at) or n.args[idx_at] not in placeholders:
            continue
        dim = 0 if dim_at is None else (n.args[dim_at] if len(n.args) > dim_at else 0)
        rows = size(n.args[src], dim)
        if rows is not None:
            yield placeholders[n.args[idx_at]], rows, negative
