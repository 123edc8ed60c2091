"""Acceptance of lower precision (config `accuracy`, docs/precision.md).

A lower-precision candidate (``Candidate.lowered``: a plan with a variant backend such as
``openvino:bf16``) is run once on the first call's real inputs before it may be timed or
chosen: each lowered piece checks its own outputs against its eager ATen on that call
(and demotes itself when out of the tolerance), then the whole graph's outputs are
compared with the graph run in float32 eager. Outside the tolerance it is refused and
never timed; inside, its error is kept and it is timed with the rest.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Optional

import torch
import torch.fx

from ..ops import is_mutating
from ..plan.policy import Candidate
from ..run.verify import compare, uniform_tolerances
from .timing import Build, pieces_of

log = logging.getLogger(__name__)


class Acceptance:
    """Judges one graph's lower-precision candidates against float32 eager; the
    reference outputs are computed once, on the first candidate judged."""

    def __init__(self, gm: torch.fx.GraphModule, accuracy: Any, build: Build, label: str):
        """``accuracy``: the config's tolerance (``rtol``, ``atol``), or None."""
        self._gm = gm
        self._build = build
        self._label = label
        self.tolerance: Optional[tuple[float, float]] = None if accuracy is None else (
            float(accuracy.rtol), float(accuracy.atol))
        self._reference: Optional[list] = None  # float32 eager's outputs on the first call

    def accept(self, cand: Candidate, args: Sequence[Any]) -> bool:
        """Whether a lower-precision candidate is within the tolerance on these (the
        first call's real) inputs: its first call (which compiles; each lowered piece
        checks its own outputs against its eager ATen then, with the same tolerance, and
        demotes itself if out of it) and then its outputs against the whole graph in
        float32 eager. Records ``cand.error``; a refusal sets ``cand.rejected`` and makes
        it ineligible."""
        if cand.error is not None or cand.rejected:
            return not cand.rejected
        rtol, atol = self.tolerance if self.tolerance is not None else (0.0, 0.0)
        mutating = any(is_mutating(n) for n in self._gm.graph.nodes)

        def inputs() -> list:
            return [a.clone() if mutating and isinstance(a, torch.Tensor) else a
                    for a in args]

        with torch.random.fork_rng(devices=[]):
            state = torch.get_rng_state()
            if self._reference is None:
                with torch.no_grad():
                    self._reference = list(self._gm(*inputs()))
            torch.set_rng_state(state)  # random ops draw what the reference drew
            fn, _ = self._build(cand)
            try:
                got = list(fn(*inputs()))
            except Exception as exc:  # noqa: BLE001 - pieces fall back; this is the rest
                got, why = None, f"failed: {type(exc).__name__}: {exc}"
        demoted = [p for p in pieces_of(fn) if p.record.planned in cand.lowered
                   and p.record.backend != p.record.planned]
        if got is None:
            pass
        elif demoted:
            rec = demoted[0].record
            why = (f"partition {rec.partition_id} on {rec.planned} "
                   + (rec.fallbacks[-1].reason if rec.fallbacks else "was not compiled"))
        else:
            cmp = compare(self._reference, got, uniform_tolerances(rtol, atol))
            cand.error = cmp.max_error
            why = "" if cmp.ok else f"outputs differ from float32 eager: {cmp.detail}"
        if why:
            cand.rejected, cand.eligible = why, False
            log.info("%s: %s refused (rtol %g, atol %g): %s", self._label, cand.label,
                     rtol, atol, why)
            return False
        log.info("%s: %s within the tolerance (rtol %g, atol %g): max error %.3g against "
                 "float32 eager", self._label, cand.label, rtol, atol, cand.error)
        return True
