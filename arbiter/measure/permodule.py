"""Precision per module (config `accuracy`, docs/precision.md "Module by module").

When the whole graph at a variant's lower precision is outside the bound (or to find the
fastest placement within it), module-boundary segments (cut as mixing cuts:
mix.module_segments) run on the variant and the rest in float32. ``PrecisionSearch``
builds one plan per lowered segment (pieces shared, so any set of lowered segments runs
without compiling), times each kind's gain on the variant against float32, judges the
error of all gaining segments lowered and, outside the bound, each alone (its
``score``), then keeps the longest prefix by score per ms gained that stays within the
bound. The candidate (``steered_lowered``) is accepted on the samples and the held-out
ones (precision.py), timed, and kept only when it beats the best float32 placement by
more than ``PRECISION_MARGIN`` twice. Every step checks ``accuracy.search_budget_s``.
"""
from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import torch.fx

from ..ops import is_getitem
from ..plan.cost import plan_ms
from ..plan.partition import Partition, Plan
from ..plan.planner import Planner
from ..plan.policy import Candidate, plan_key
from ..plan.segments import Segment
from ..plan.support import FixedSupport, Preferred
from .bound import Judgement
from .mix import module_segments, summary
from .precision import Acceptance
from .timing import Timing, pieces_of

log = logging.getLogger(__name__)

#: Label prefix of a per-module precision candidate.
PRECISION = "precision: "
#: The per-module candidate is kept only when it beats the best float32 placement by this.
PRECISION_MARGIN = 0.03
#: A segment stays float32 unless lowering it gains more than this share of its time.
MIN_GAIN = 0.05
#: Timed runs per segment plan (medians of each piece's times).
TIMED_RUNS = 5


@dataclass
class SegmentPrecision:
    """One segment as the search saw it (the report's ``accuracy.modules``)."""

    index: int
    path: str
    cls: str
    f32_ms: Optional[float] = None  # its kind on the variant's backend at float32
    low_ms: Optional[float] = None  # lowered
    alone: Optional[dict] = None  # Judgement.as_dict() with only this segment lowered
    lowered: bool = False  # in the chosen set
    why: str = ""  # why it stayed float32


@dataclass
class PrecisionOutcome:
    """What the per-module search did for one graph (kept on its ``PolicyOutcome``)."""

    variant: str = ""
    bound: str = ""  # the config's bound in words
    depth: int = 0
    segments: list[SegmentPrecision] = field(default_factory=list)
    first_node: dict[int, str] = field(default_factory=dict)  # segment -> its first node
    evaluations: int = 0  # segment plans judged on the samples
    search_s: float = 0.0
    candidate: str = ""  # its label, when one was built
    samples: int = 0  # calibration inputs searched on
    holdout: Optional[dict] = None  # the chosen on held-out inputs: Judgement.as_dict()
    notes: list[str] = field(default_factory=list)  # why the search stopped or gave nothing
    # every lower-precision candidate judged: label -> Judgement.as_dict()
    measures: dict[str, dict] = field(default_factory=dict)
    # the best float32 placement and the chosen one, timed in the same process
    f32: str = ""
    f32_ms: Optional[float] = None
    chosen_ms: Optional[float] = None
    # drift watch (drift.py): checks made, the worst measures seen, demotions
    checks: int = 0
    worst: Optional[dict] = None
    drift: list[str] = field(default_factory=list)


class WithVariants:
    """A support table answering as ``table`` does, each variant right after its base
    backend wherever that backend can run the node (same manifest)."""

    def __init__(self, table: Any, variants: dict[str, str]):
        """``variants``: variant name -> its base backend's name."""
        self._table = table
        self._variants = variants
        self.fallback_name = table.fallback_name

    def support_all(self, nodes):
        out = []
        for sup in self._table.support_all(nodes):
            cands = []
            for c in sup.candidates:
                cands.append(c)
                cands += [v for v, base in self._variants.items() if base == c]
            out.append(replace(sup, candidates=tuple(cands)))
        return out

    def pattern_groups(self, nodes, support) -> list:
        find = getattr(self._table, "pattern_groups", None)
        return find(nodes, support) if find is not None else []


def steered_lowered(planner: Planner, gm: torch.fx.GraphModule, base: Plan,
                    prefer: dict[str, str]) -> tuple[Plan, tuple[str, ...]]:
    """``refine.steered_plan`` where ``prefer`` may name variants (config `accuracy`):
    the plan and the variants it uses (``Candidate.lowered``). The decision cache rebuilds
    a per-module candidate through it."""
    variants = {n: v.base_name for n, v in planner.variants.items()}
    table = Preferred(WithVariants(FixedSupport(base.support, planner.fallback_name,
                                                base.patterns), variants),
                      lambda n: prefer.get(n.name))
    plan = planner.plan(gm, table)
    return plan, tuple(sorted({p.backend for p in plan.partitions} & set(variants)))


class PrecisionSearch:
    """The per-module search of one graph (see the module docstring)."""

    def __init__(self, planner: Planner, gm: torch.fx.GraphModule,
                 candidates: list[Candidate], timing: Timing, acceptance: Acceptance,
                 accuracy: Any, label: str):
        self._planner = planner
        self._gm = gm
        self._candidates = candidates
        self._timing = timing
        self._acc = acceptance
        self._budget = float(accuracy.search_budget_s)
        self._label = label
        self._start = time.perf_counter()
        self.outcome: Optional[PrecisionOutcome] = None

    def _left(self) -> bool:
        return time.perf_counter() - self._start < self._budget

    def _progress(self, msg: str) -> None:
        elapsed = time.perf_counter() - self._start
        self._timing.progress(f"{self._label}: precision per module: {msg}, {elapsed:.1f} s "
                              f"of {self._budget:.0f}", elapsed)

    def run(self, best: Optional[Candidate], args: list) -> None:
        """Search each variant from ``best`` (the best measured float32 placement)."""
        if best is None or best.measured_ms is None or self._acc.bound is None:
            return
        self._start = time.perf_counter()
        cut = module_segments(self._planner, self._gm,
                              self._timing.options.mix_max_segments, self._label,
                              "precision per module")
        if cut is None:
            self.outcome = PrecisionOutcome(notes=["no module depth cuts the graph"])
            return
        for name in self._planner.variants:
            if not self._left():
                break
            out = PrecisionOutcome(variant=name, depth=cut[1], samples=len(self._acc.samples))
            self.outcome = out  # the last variant searched is reported
            try:
                self._one(name, cut[0], cut[2], best, args, out)
            finally:
                out.search_s = round(time.perf_counter() - self._start, 2)

    # -- one variant ------------------------------------------------------------------
    def _one(self, name: str, segs: list[Segment], by_name: dict, best: Candidate,
             args: list, out: PrecisionOutcome) -> None:
        base_name = self._planner.variants[name].base_name
        base = self._candidates[0].plan
        out.segments = [SegmentPrecision(s.index, s.path, s.cls) for s in segs]
        out.first_node = {s.index: s.nodes[0] for s in segs if s.nodes}
        able = [i for i, s in enumerate(segs)
                if all(base_name in base.candidates(by_name[x]) for x in s.nodes
                       if not is_getitem(by_name[x]))]
        for i, sp in enumerate(out.segments):
            if i not in able:
                sp.why = f"{base_name} cannot run it whole"
        if not able:
            out.notes.append(f"no segment can run on {name}")
            return
        plans = SegmentPlans(self, segs, by_name, name, base)
        self._progress(f"compiling {len(able)} segments on {name}")
        firsts = {segs[i].kind: i for i in reversed(able)}
        low_fn, f32_fn = plans.fn(set(able)), plans.fn(set(firsts.values()), base_name)
        low_ms, f32_ms = plans.times([(low_fn, name), (f32_fn, base_name)], args)
        able = [i for i in able if i in low_ms]  # the others fell back: not on the variant
        # by kind (one f32 instance each, every lowered one): less noise than one by one
        kind_low = {k: statistics.median(low_ms[i] for i in able if segs[i].kind == k)
                    for k in {segs[i].kind for i in able}}
        for i in able:
            sp = out.segments[i]
            sp.low_ms = round(low_ms[i], 4)
            f32 = f32_ms.get(firsts[segs[i].kind])
            sp.f32_ms = None if f32 is None else round(f32, 4)
            if f32 is None or kind_low[segs[i].kind] > f32 * (1 - MIN_GAIN):
                sp.why = "no faster lowered"
        gain = {i: out.segments[i].f32_ms - kind_low[segs[i].kind] for i in able
                if not out.segments[i].why}
        if not gain:
            out.notes.append(f"no segment is faster on {name} than on {base_name}")
            return
        chosen = self._errors(plans, sorted(gain), gain, out)
        for i in chosen:
            out.segments[i].lowered = True
        if not chosen:
            out.notes.append("no segment lowered stays within the bound")
            return
        self._candidate(name, segs, chosen, best, args, out)

    def _errors(self, plans: "SegmentPlans", order: list[int], gain: dict[int, float],
                out: PrecisionOutcome) -> list[int]:
        """The segments to lower: all when within the bound, else by sensitivity (see the
        module docstring)."""
        judged = plans.judge(set(order))
        if judged.ok:
            log.info("%s: precision per module: all %d gaining segments lowered are within "
                     "the bound (%s)", self._label, len(order), judged.words())
            return order
        self._progress(f"all {len(order)} lowered: {judged.why}; measuring each alone")
        score = {}
        for i in order:
            if not self._left():
                out.notes.append("search budget spent measuring sensitivities")
                break
            j = plans.judge({i})
            out.segments[i].alone = j.as_dict()
            score[i] = j.score
            if not j.ok:
                out.segments[i].why = f"alone outside the bound: {j.why}"
        ranked = sorted((i for i in score if score[i] <= 1),
                        key=lambda i: score[i] / max(gain[i], 1e-9))
        lo, hi = 0, len(ranked)  # the longest prefix within the bound (lo: known good)
        while lo < hi and self._left():
            mid = (lo + hi + 1) // 2
            if plans.judge(set(ranked[:mid])).ok:
                lo = mid
            else:
                hi = mid - 1
        keep = ranked[:lo]
        for i in ranked[lo:]:  # each one left, on its own
            if not self._left():
                out.notes.append("search budget spent; segments left float32")
                break
            if plans.judge(set(keep) | {i}).ok:
                keep.append(i)
            elif not out.segments[i].why:
                out.segments[i].why = "the bound holds no more with it lowered too"
        self._progress(f"{len(keep)} of {len(order)} segments lowered within the bound")
        return sorted(keep)

    def _candidate(self, name: str, segs: list[Segment], chosen: list[int],
                   best: Candidate, args: list, out: PrecisionOutcome) -> None:
        """Build, accept, re-measure on held-out inputs, and time the candidate."""
        prefer = {n.name: p.backend for p in best.plan.partitions for n in p.nodes}
        low = {x for i in chosen for x in segs[i].nodes}
        prefer.update({x: name for x in low})
        plan, lowered = steered_lowered(self._planner, self._gm, self._candidates[0].plan,
                                        prefer)
        path = [name if i in chosen else "float32" for i in range(len(segs))]
        cand = Candidate(PRECISION + summary(segs, path), plan,
                         plan_ms(plan, self._planner.inline), steer=prefer, lowered=lowered)
        same = [c for c in self._candidates if plan_key(c.plan) == plan_key(plan)]
        if same:
            out.candidate = same[0].label
            log.info("%s: precision per module: the placement equals candidate %s",
                     self._label, same[0].label)
            return
        self._candidates.append(cand)
        out.candidate = cand.label
        self._progress(f"verifying {cand.label}")
        if not self._acc.accept(cand, args):
            return
        timing = self._timing
        if not timing.tried(cand, lambda: timing.time_one(cand, args)):
            return
        if timing.beats(cand, best, args, PRECISION_MARGIN):
            log.info("%s: precision per module wins: %.3f ms against %s %.3f ms",
                     self._label, cand.measured_ms, best.label, best.measured_ms)
            return
        cand.eligible = False
        out.notes.append(f"not faster than {best.label} by {PRECISION_MARGIN:.0%}")
        log.info("%s: precision per module did not win: %.3f ms against %s %.3f ms",
                 self._label, cand.measured_ms, best.label, best.measured_ms)


class SegmentPlans:
    """Plans with each chosen segment a partition of its own on one backend, the rest in
    eager (their pieces shared, so each segment compiles once per backend)."""

    def __init__(self, search: PrecisionSearch, segs: list[Segment], by_name: dict,
                 variant: str, base: Plan):
        self._s = search
        self._segs = segs
        self._by_name = by_name
        self._variant = variant
        self._base = base
        self._fns: dict[tuple, tuple[Callable, dict]] = {}

    def fn(self, low: set[int], backend: str = "") -> Callable:
        """The callable of the plan with ``low`` on ``backend`` (default: the variant)."""
        return self._built(low, backend or self._variant)[0]

    def _built(self, low: set[int], backend: str) -> tuple[Callable, dict]:
        key = (backend, tuple(sorted(low)))
        if key not in self._fns:
            parts: list[Partition] = []
            rest: list[torch.fx.Node] = []
            seg_of: dict[tuple[str, ...], int] = {}
            fallback = self._s._planner.fallback_name
            for s in self._segs:
                nodes = [self._by_name[x] for x in s.nodes]
                if s.index not in low:
                    rest += nodes
                    continue
                if rest:
                    parts.append(Partition(len(parts), fallback, rest))
                    rest = []
                parts.append(Partition(len(parts), backend, nodes))
                seg_of[tuple(s.nodes)] = s.index
            if rest:
                parts.append(Partition(len(parts), fallback, rest))
            plan = Plan(self._s._gm, parts, self._base.support, self._base.fallback,
                        self._base.patterns)
            fn, _ = self._s._timing.build(Candidate(f"precision probe on {backend}", plan, 0.0))
            self._fns[key] = (fn, seg_of)
        return self._fns[key]

    def times(self, fns: list[tuple[Callable, str]], args: list) -> list[dict[int, float]]:
        """For each (plan's callable, backend): ms per segment piece still on that
        backend, medians of TIMED_RUNS interleaved runs after a first, compiling one."""
        entries = []
        for fn, backend in fns:
            seg_of = next(v for f, v in self._fns.values() if f is fn)
            fn(*args)  # compiles
            entries.append((fn, backend, [(p, seg_of[p.node_names]) for p in pieces_of(fn)
                                          if getattr(p, "node_names", None) in seg_of]))
        samples: list[dict[int, list[float]]] = [{} for _ in entries]
        for _ in range(TIMED_RUNS):
            for (fn, _, pieces), got in zip(entries, samples):
                before = {}
                for p, _ in pieces:
                    p.timed, before[p] = True, p.record.run_s
                try:
                    fn(*args)
                finally:
                    for p, _ in pieces:
                        p.timed = False
                for p, i in pieces:
                    got.setdefault(i, []).append((p.record.run_s - before[p]) * 1e3)
        return [{i: statistics.median(got[i]) for p, i in pieces if p.record.backend == backend}
                for (_, backend, pieces), got in zip(entries, samples)]

    def judge(self, low: set[int]) -> Judgement:
        """The plan with ``low`` lowered, on the calibration samples."""
        out = self._s.outcome
        if out is not None:
            out.evaluations += 1
        return self._s._acc.judge(self.fn(low))
