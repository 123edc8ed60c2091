"""The layouts a partition's outputs must have: those the later nodes were traced against.

The nodes after a partition were traced against eager's output layouts, and a ``view``
among them fails on another (an eager fallback raised "view size is not compatible" on
GPT-2 training: it received a key cache traced contiguous in the transposed order of
Inductor's decomposition of a one-tensor ``cat``; docs/robustness.md). Outputs traced
non-contiguous are copied into their traced layout on every call where a backend returns
another; the others are compared on each backend's first calls and join them when it
returns another layout. A compiled artifact's output layouts are fixed by its input
layouts, themselves the traced ones, so the first calls decide."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch._prims_common

from ..ops import output_values

#: (output index, size, stride)
Layout = tuple[int, tuple, tuple]


def traced_layouts(gm: torch.fx.GraphModule) -> list[tuple[int, tuple, tuple, bool]]:
    """(index, size, stride, not contiguous) of every output whose traced layout a copy
    can restore: static sizes and strides, more than one element, not expanded."""
    found = []
    for k, val in enumerate(output_values(gm) or ()):
        if not isinstance(val, torch.Tensor):
            continue
        if not all(isinstance(s, int) for s in (*val.shape, *val.stride())):
            continue  # symbolic: nothing static to enforce (and int() would add a guard)
        size, stride = tuple(val.shape), tuple(val.stride())
        contiguous = tuple(torch._prims_common.make_contiguous_strides_for(size))
        if any(st == 0 and n > 1 for n, st in zip(size, stride)):
            # An expanded (overlapping) layout cannot be written by a copy; the backend's
            # dense result holds the same values and any view of it is valid.
            continue
        if val.numel() > 1:
            found.append((k, size, stride, strides_matter(size, stride, contiguous)))
    return found


def strides_matter(size, stride, contiguous) -> bool:
    """Whether two layouts of ``size`` differ (dimensions of size 1 may carry any stride
    without changing the layout)."""
    return any(a != b for n, a, b in zip(size, stride, contiguous) if n > 1)


class OutputLayouts:
    """One partition's outputs and the traced layouts they are copied into (see the
    module); ``restride``: those the running backend's outputs are copied into."""

    def __init__(self, gm: torch.fx.GraphModule):
        layouts = traced_layouts(gm)
        self._all: list[Layout] = [(k, size, stride) for k, size, stride, _ in layouts]
        self._traced: list[Layout] = [(k, size, stride) for k, size, stride, odd in layouts
                                      if odd]
        self.restride: list[Layout] = list(self._traced)

    def reset(self) -> None:
        """Another backend runs: its own layouts are learned again."""
        self.restride = list(self._traced)

    def differing(self, out: Sequence[Any]) -> list[Layout]:
        """The outputs of ``out`` not restrided yet whose layout is not the traced one."""
        seen = {k for k, _, _ in self.restride}
        return [(k, size, stride) for k, size, stride in self._all if k not in seen
                and isinstance(out[k], torch.Tensor)
                and strides_matter(size, out[k].stride(), stride)]

    def add(self, found: list[Layout]) -> None:
        self.restride = sorted(self.restride + found)

    def restrided(self, out: Any, record: Any) -> Any:
        """``out`` with each output of ``restride`` in its traced layout (one copy each
        where it is not, counted in ``record.restride_copies``)."""
        if not self.restride:
            return out
        out = list(out)
        for k, size, stride in self.restride:
            t = out[k]
            if strides_matter(size, t.stride(), stride):
                fixed = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device)
                fixed.copy_(t)
                out[k] = fixed
                record.restride_copies += 1
        return out
