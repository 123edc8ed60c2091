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
}


class IndexGuard:
    """Bounds of the positions a partition reads from its own inputs (token ids into an
    embedding, cache positions into ``index_copy``), checked before a backend runs:
    backends answer an index out of range with a garbage row (OpenVINO), an error of
    their own (ONNX Runtime's Gather) or a process abort (an Inductor kernel's bounds
    check inside a parallel loop). Out of range, eager ATen runs the call and raises
    eager's error, the user's (``Piece``)."""

    def __init__(self, checks: list[tuple[int, int, bool]]):
        self._checks = checks  # (input position, rows, negative allowed)

    @classmethod
    def of(cls, gm: torch.fx.GraphModule) -> Optional["IndexGuard"]:
        from ...ops import op_name

        placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes
                                                   if n.op == "placeholder")}
        checks = []
        for n in gm.graph.nodes:
            spec = _INDEXING.get(op_name(n.target)) if n.op == "call_function" else None
            if spec is None:
                continue
            src, dim_at, idx_at, negative = spec
            if len(n.args) <= max(src, idx_at) or n.args[idx_at] not in placeholders:
                continue
            val = getattr(n.args[src], "meta", {}).get("val")
            dim = 0 if dim_at is None else (n.args[dim_at] if len(n.args) > dim_at else 0)
            if not isinstance(val, torch.Tensor) or not isinstance(dim, int) or \
                    not -val.dim() <= dim < max(val.dim(), 1):
                continue
            rows = val.shape[dim] if val.dim() else 1
            if isinstance(rows, int):  # symbolic sizes: the backend's own check
                checks.append((placeholders[n.args[idx_at]], rows, negative))
        return cls(sorted(set(checks))) if checks else None

    def ok(self, args: Sequence[Any]) -> bool:
        """Whether every checked index is in range."""
        for i, rows, negative in self._checks:
            t = args[i] if i < len(args) else None
            if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.is_floating_point():
                continue
            lo, hi = torch.aminmax(t)
            if int(hi) >= rows or int(lo) < (-rows if negative else 0):
                return False
        return True
