"""Segment probes: what each kind of segment, and of adjacent pair, costs on each backend.

Per backend (fastest first, while the budget lasts) and per probe layout
(``segments.probe_layouts``, the first holding every kind alone), a ``ProbePlan``: a plan
whose instances are partitions of their own on that backend and whose other nodes run in
eager, built and warmed up. Then every probe plan is timed in interleaved rounds, each
probe piece's own time counted (``Piece.timed``), together with ``WholeGraph`` entries
(whole-graph candidates built already, end to end) so that whole-graph and segment times
are taken under the same load. A piece whose backend did not compile its instance (it
fell back) measures nothing. docs/policies.md ("Mixing at module boundaries", step 2).
"""
from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Optional

import torch.fx

from ..plan.partition import Partition, Plan
from ..plan.planner import Planner
from ..plan.policy import ONLY, Candidate
from ..plan.segments import Segment, pair_kind, probe_layouts
from ..run.piece import Piece
from .timing import LEAD_IN, Timing, lead_in, ms_per_call, pieces_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    """What one probe partition measures: a kind of segment (``size`` 1) or of adjacent
    pair (``size`` 2), on a backend."""

    size: int
    kind: Hashable
    backend: str


@dataclass
class Samples:
    """One set of interleaved rounds' samples, ms each."""

    probes: dict[Target, list[float]] = field(default_factory=dict)
    whole: dict[str, list[float]] = field(default_factory=dict)  # label -> end to end


@dataclass
class ProbePlan:
    """One probe layout on one backend, built: its callable, and the pieces that compiled
    their instance, each with what it measures."""

    fn: Callable
    pieces: list[tuple[Piece, Target]]
    lead_in: int = LEAD_IN  # as ``timing.lead_in`` gives for its call time

    def sample(self, args: list, into: Samples) -> None:
        """One run, each probe piece's own time, after untimed calls (``LEAD_IN``) that
        take what the previous entry left behind (threads still spinning, caches)."""
        for _ in range(self.lead_in):
            self.fn(*args)
        for piece, _ in self.pieces:
            piece.timed = True
        before = [piece.record.run_s for piece, _ in self.pieces]
        try:
            self.fn(*args)
        finally:
            for piece, _ in self.pieces:
                piece.timed = False
        for (piece, target), t0 in zip(self.pieces, before):
            into.probes.setdefault(target, []).append((piece.record.run_s - t0) * 1e3)


@dataclass
class WholeGraph:
    """A whole-graph candidate, built already, timed end to end in the probes' rounds."""

    fn: Callable
    label: str
    lead_in: int = LEAD_IN  # as its candidate was timed (``Ready.lead_in``)

    def sample(self, args: list, into: Samples) -> None:
        """One call end to end after the lead-in calls, as ``Timing.rounds`` takes it (the
        restores of a graph that writes its inputs left out)."""
        for _ in range(self.lead_in):
            self.fn(*args)
        into.whole.setdefault(self.label, []).append(ms_per_call(self.fn, 1, args))


@dataclass
class ProbeTimes:
    """Medians of the probes' rounds, of the instances whose backend compiled them."""

    single: dict[tuple[Hashable, str], float]  # (segment kind, backend) -> ms
    pair: dict[tuple[Hashable, str], float]  # (pair kind, backend) -> ms
    compile_s: dict[str, float]  # backend -> mean compile s per segment
    whole_ms: dict[str, float]  # each label of a whole-graph candidate -> ms


class Probes:
    """The segment probes of one graph (see the module docstring)."""

    def __init__(self, planner: Planner, gm: torch.fx.GraphModule, base: Plan,
                 timing: Timing, label: str):
        """``base``: the priority plan (every backend's answer for each node)."""
        self._fallback = planner.fallback_name
        self._gm = gm
        self._base = base
        self._timing = timing
        self._label = label

    def measure(self, segs: list[Segment], able: list[set], backends: list[str],
                by_name: dict[str, torch.fx.Node], args: list,
                whole: Sequence[Candidate] = ()) -> Optional[ProbeTimes]:
        """Build the probe plans (``able[i]``: the backends able to run segment ``i``
        whole), then time them with the ``whole`` candidates; None when not one backend
        was measured."""
        probes = self._build(segs, able, backends, by_name, args)
        if not probes:
            return None
        labels = {c.label: c.labels for c in whole}
        ready = self._timing.ready
        refs = [WholeGraph(ready[c.label].fn, c.label, ready[c.label].lead_in) for c in whole
                if c.label in ready]
        samples = self._rounds([*probes, *refs], args)
        compiles: dict[str, list[float]] = {}
        for probe in probes:
            for piece, target in probe.pieces:
                compiles.setdefault(target.backend, []).append(
                    piece.record.compile_s / target.size)
        whole_ms = {other: statistics.median(samples.whole[ref.label]) for ref in refs
                    if ref.label in samples.whole for other in labels[ref.label]}
        single, pair = {}, {}
        for target, xs in samples.probes.items():
            (single if target.size == 1 else pair)[(target.kind, target.backend)] = \
                statistics.median(xs)
        for probe in probes:
            for piece, target in probe.pieces:
                self._timing.part_ms[(piece.record.backend, piece.node_names)] = \
                    statistics.median(samples.probes[target])
        return ProbeTimes(single, pair,
                          {b: statistics.mean(xs) for b, xs in compiles.items()}, whole_ms)

    def _build(self, segs: list[Segment], able: list[set], backends: list[str],
               by_name: dict[str, torch.fx.Node], args: list) -> list[ProbePlan]:
        """Layout by layout (the first holds every kind alone), each on every backend:
        when the budget runs out, the pairs left unmeasured count as saving nothing."""
        timing = self._timing
        layouts = probe_layouts(segs)
        probes = []
        for k, b in [(k, b) for k in range(len(layouts)) for b in backends]:
            elapsed = timing.elapsed()
            # a layout compiles about what the whole graph did on b: one that would
            # overrun the budget is not begun (a compile under way is not interrupted)
            need = timing.prepare_s.get(ONLY + b, 0.0)
            if elapsed + need > timing.budget_s:
                log.info("%s: measure budget spent while timing segments (probes %d/%d "
                         "on %s and after left; about %.0f s each, %.0f of %.0f s spent)",
                         self._label, k + 1, len(layouts), b, need, elapsed,
                         timing.budget_s)
                break
            mine = [inst for inst in layouts[k] if all(b in able[i] for i in inst)]
            if not mine:
                continue
            timing.progress(f"{self._label}: mixing: compiling segment probes {k + 1}/"
                            f"{len(layouts)} on {b} ({len(mine)} instances), "
                            f"{elapsed:.1f} s", elapsed)
            plan, inst_of = self._layout_plan(segs, mine, b, by_name)
            probe = Candidate(f"mix probe {k + 1} on {b}", plan, 0.0)
            try:
                fn, _ = timing.build(probe)
                for _ in range(max(1, timing.options.warmup)):
                    t0 = time.perf_counter()
                    fn(*args)
                once = time.perf_counter() - t0  # the last warm-up call's
            except Exception as exc:  # noqa: BLE001 - a probe is never the answer
                log.info("%s: mixing: %s failed: %s: %s", self._label, probe.label,
                         type(exc).__name__, exc)
                continue
            pieces = []
            for piece in pieces_of(fn):
                inst = inst_of.get(getattr(piece, "node_names", None))
                if inst is None:
                    continue
                if piece.record.backend != b:
                    log.info("%s: mixing: %s did not take segment %d (%s) whole; it "
                             "fell back to %s", self._label, b, inst[0],
                             segs[inst[0]].path, piece.record.backend)
                    continue
                kind = segs[inst[0]].kind if len(inst) == 1 else pair_kind(segs, inst[0])
                pieces.append((piece, Target(len(inst), kind, b)))
            if pieces:
                probes.append(ProbePlan(fn, pieces, lead_in(once)))
        return probes

    def _layout_plan(self, segs: list[Segment], instances: list[tuple[int, ...]],
                     backend: str, by_name: dict[str, torch.fx.Node]
                     ) -> tuple[Plan, dict[tuple[str, ...], tuple[int, ...]]]:
        """The probe plan of ``instances`` (each a run of segment indices) on ``backend``,
        every other node in eager; and each probe partition's node names -> its
        instance."""
        at = {inst[0]: inst for inst in instances}
        inst_of: dict[tuple[str, ...], tuple[int, ...]] = {}
        parts: list[Partition] = []
        rest: list[torch.fx.Node] = []
        i = 0
        while i < len(segs):
            inst = at.get(i)
            if inst is None:
                rest += [by_name[x] for x in segs[i].nodes]
                i += 1
                continue
            if rest:
                parts.append(Partition(len(parts), self._fallback, rest))
                rest = []
            members = [by_name[x] for j in inst for x in segs[j].nodes]
            parts.append(Partition(len(parts), backend, members))
            inst_of[tuple(n.name for n in members)] = inst
            i += len(inst)
        if rest:
            parts.append(Partition(len(parts), self._fallback, rest))
        base = self._base
        return Plan(self._gm, parts, base.support, base.fallback, base.patterns), inst_of

    def _rounds(self, entries: Sequence[ProbePlan | WholeGraph], args: list) -> Samples:
        """``repeats`` interleaved rounds over ``entries`` (``ProbePlan``s and
        ``WholeGraph``s), the order rotating; no new round once the budget is spent."""
        timing = self._timing
        samples = Samples()
        for r in range(timing.options.repeats):
            if r and timing.spent():
                break
            shift = r % len(entries)
            for entry in entries[shift:] + entries[:shift]:
                entry.sample(args, samples)
        return samples
