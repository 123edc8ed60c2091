"""Acceptance of lower precision (config `accuracy`, docs/precision.md).

A lower-precision candidate (``Candidate.lowered``: a plan with a variant backend such as
``onnxruntime:int8``) is run on the calibration inputs (the first call's real inputs, or
``arbiter.tune``'s batches: tune.py) before it may be timed or chosen, and its
outputs are judged against the graph run in float32 eager by the config's bound
(bound.py). Outside it, it is refused and never timed; inside, its measures are kept and
it is timed with the rest. A lowered piece that fell back while it ran (it failed) makes
the candidate refused too: it was not what it claimed to be.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch
import torch.fx

from ..ops import is_mutating
from ..plan.policy import Candidate
from .bound import Bound, Judgement
from .tune import Sample
from .timing import Build, pieces_of

log = logging.getLogger(__name__)


class Acceptance:
    """Judges one graph's lower-precision candidates against float32 eager on its
    calibration samples (eager's outputs computed once per sample)."""

    def __init__(self, gm: torch.fx.GraphModule, accuracy: Any, build: Build, label: str):
        """``accuracy``: the config's ``AccuracyOptions``, or None."""
        self._gm = gm
        self._build = build
        self._label = label
        self.bound: Optional[Bound] = Bound.of(accuracy)
        self.tolerance: Optional[tuple[float, float]] = None if accuracy is None else (
            float(accuracy.rtol), float(accuracy.atol))
        self._mutating = any(is_mutating(n) for n in gm.graph.nodes)
        self.samples: list[Sample] = []  # what candidates are judged on
        self.holdout: list[Sample] = []  # kept from the search (arbiter.tune)
        self.judgements: dict[str, Judgement] = {}  # candidate label -> on the samples
        self.held: dict[str, Judgement] = {}  # candidate label -> on the held-out ones

    def inputs(self, args: Sequence[Any]) -> list:
        """``args``, cloned when the graph writes into an input."""
        return [a.clone() if self._mutating and isinstance(a, torch.Tensor) else a
                for a in args]

    def sample(self, args: Sequence[Any]) -> Sample:
        """A calibration sample of ``args``: float32 eager's outputs on them."""
        rng = torch.get_rng_state()
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            ref = list(self._gm(*self.inputs(args)))
        # the inputs as they were: a graph that writes them (a KV cache) would otherwise
        # judge its later runs on what the user's call wrote
        return Sample(self.inputs(args), ref, rng)

    def ensure(self, args: Sequence[Any]) -> None:
        """Without calibration inputs, the first call's are the samples."""
        if not self.samples:
            self.samples = [self.sample(args)]

    def judge(self, fn: Callable, samples: Optional[Sequence[Sample]] = None) -> Judgement:
        """``fn``'s outputs on ``samples`` (default: the search's) against eager's, by the
        bound; raises what ``fn`` raised."""
        samples = self.samples if samples is None else samples
        gots = []
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            for s in samples:
                if s.rng is not None:
                    torch.set_rng_state(s.rng)  # random ops draw what eager's run drew
                gots.append(list(fn(*self.inputs(s.args))))
        return self.bound.judge([s.ref for s in samples], gots)

    def accept(self, cand: Candidate, args: Sequence[Any]) -> bool:
        """Whether a lower-precision candidate is within the bound on the samples (the
        first call's ``args`` when there are none): its first calls (which compile), its
        lowered pieces still on their variant, its outputs within the bound. Records
        ``cand.error`` (the largest absolute error) and the judgement; a refusal sets
        ``cand.rejected`` and makes it ineligible. With held-out samples
        (``arbiter.tune``), it must be within the bound on those too."""
        if cand.error is not None or cand.rejected:
            return not cand.rejected
        if self.bound is None:
            raise ValueError("a lower-precision candidate needs config `accuracy`")
        self.ensure(args)
        fn, _ = self._build(cand)
        got: Optional[Judgement] = None
        try:
            got = self.judge(fn)
        except Exception as exc:  # noqa: BLE001 - pieces fall back; this is the rest
            why = f"failed: {type(exc).__name__}: {exc}"
        else:
            why = got.why and f"outputs outside the bound against float32 eager: {got.why}"
        demoted = [p for p in pieces_of(fn) if p.record.planned in cand.lowered
                   and p.record.backend != p.record.planned]
        if demoted and not why:
            rec = demoted[0].record
            why = (f"partition {rec.partition_id} on {rec.planned} "
                   + (rec.fallbacks[-1].reason if rec.fallbacks else "was not compiled"))
        if got is not None:
            cand.error = got.max_abs
            self.judgements[cand.label] = got
        if not why and self.holdout:  # inputs no step of the search saw (arbiter.tune)
            held = self.held[cand.label] = self.judge(fn, self.holdout)
            log.info("%s: %s on %d held-out input(s): %s", self._label, cand.label,
                     held.inputs, held.words())
            if not held.ok:
                why = f"outside the bound on held-out inputs: {held.why}"
        if why:
            cand.rejected, cand.eligible = why, False
            log.info("%s: %s refused (%s): %s", self._label, cand.label, self.bound.words,
                     why)
            return False
        log.info("%s: %s within the bound (%s) on %d input(s): %s", self._label,
                 cand.label, self.bound.words, got.inputs, got.words())
        return True
