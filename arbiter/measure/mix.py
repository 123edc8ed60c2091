"""The mixed candidate: a backend per segment, cut at module boundaries.

The graph is cut into segments at one module depth; one instance of each kind of segment
and of adjacent pair is timed on each backend that ran the graph alone near the fastest
(``probes.Probes``); a backend per segment is chosen by the chain DP over those costs
(``segments.best_chain``; the segmenting and the DP are pure, in plan/segments.py), the
boundaries priced by what keeping two neighbours on one backend saves; that placement,
made by the partitioner through ``steered_plan`` as refinement makes its moves, is timed
end to end beside the best so far and kept only when it wins twice by more than
``MIX_MARGIN``. docs/policies.md ("Mixing at module boundaries").
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Optional

import torch
import torch.fx

from ..ops import is_getitem, op_name
from ..plan.cost import plan_ms
from ..plan.planner import Planner
from ..plan.policy import ONLY, Candidate, plan_key
from ..plan.segments import (NodeInfo, Segment, SegmentTimes, best_chain, choose_depth,
                             pair_kind, segment, skip_edges)
from .probes import Probes, ProbeTimes
from .refine import steered_plan
from .timing import Timing

log = logging.getLogger(__name__)

#: The mixed candidate is kept only when it beats the best so far by more than this.
MIX_MARGIN = 0.01
#: Label prefix of the mixed candidate.
MIX = "mix: "
#: Mixing times segments only on backends whose whole graph ran within this factor of
#: the fastest's (each probe compiles; a backend far behind rarely wins a segment).
MIX_SPAN = 1.5
#: The segment probes' rounds also time the best candidate and the whole graph of this many
#: of the probed backends (fastest first), at the same time as the probes (SegmentTimes
#: .whole_ms: the whole-graph rounds ran earlier, under another load).
MIX_WHOLE = 1


class Mixer:
    """Builds and times one graph's mixed candidate, which joins ``candidates``; the
    probes' times are kept in ``times`` (the graph's ``PolicyOutcome.mix``)."""

    def __init__(self, planner: Planner, gm: torch.fx.GraphModule,
                 candidates: list[Candidate], timing: Timing, label: str):
        self._planner = planner
        self._gm = gm
        self._candidates = candidates
        self._timing = timing
        self._label = label
        self.times: Optional[SegmentTimes] = None

    def run(self, best: Optional[Candidate], args: list) -> None:
        """From ``best`` (the best measured placement at the graph's own precision): the
        segments, their probes, the DP, and the mixed candidate when the DP predicts a
        gain (see the module docstring)."""
        if best is None or best.measured_ms is None:
            return
        # the backends that ran the graph alone, fastest first (compiled, float32)
        alone = sorted((c for c in self._candidates if c.measured_ms is not None
                        and not c.lowered), key=lambda c: c.measured_ms)
        backends = self._backends(alone, best)
        if len(backends) < 2:
            log.info("%s: mixing skipped: fewer than two compiled backends ran the graph "
                     "alone within %.1fx of the fastest", self._label, MIX_SPAN)
            return
        # the first probes compile about what the two fastest backends' whole graphs did;
        # a DP with one backend measured keeps that backend, so begin only when both fit
        need = sum(self._timing.prepare_s.get(ONLY + b, 0.0) for b in backends[:2])
        elapsed = self._timing.elapsed()
        if elapsed + need > self._timing.budget_s:
            log.info("%s: mixing skipped: probing segments on %s (about %.0f s of compiles, "
                     "as their whole graphs took) would overrun the measure budget (%.0f s "
                     "spent of %.0f)", self._label, " and ".join(backends[:2]), need,
                     elapsed, self._timing.budget_s)
            return
        cut = self._segments()
        if cut is None:
            return
        segs, depth, by_name = cut
        base = self._candidates[0].plan
        able = [{b for b in backends if all(b in base.candidates(by_name[x])
                                            for x in s.nodes if not is_getitem(by_name[x]))}
                for s in segs]
        whole = [best] + [c for b in backends[:MIX_WHOLE] for c in alone
                          if ONLY + b in c.labels and c is not best]
        probes = Probes(self._planner, self._gm, base, self._timing, self._label)
        got = probes.measure(segs, able, backends, by_name, args, whole)
        if got is None:
            return
        # kept on the outcome (bench/mix_oracle.py reads the oracle bound off it)
        self.times = SegmentTimes(depth, tuple(segs), dict(got.single), dict(got.pair),
                                  whole_ms=got.whole_ms)
        self._log_probes(segs, got)
        measured = [b for b in backends if any((s.kind, b) in got.single for s in segs)]
        rows, boundary = chain_costs(segs, able, measured, got)
        try:
            total, path = best_chain(rows, boundary)
        except ValueError as exc:  # pragma: no cover - every row has an option
            log.info("%s: mixing skipped: %s", self._label, exc)
            return
        self.times.path, self.times.predicted_ms = list(path), total
        alone_ms = {b: sum(r[b] for r in rows) for b in measured
                    if all(b in r for r in rows)}
        log.info("%s: mixing: segment DP predicts %.3f ms (%s); each backend alone by the "
                 "same sums: %s", self._label, total, summary(segs, path), ", ".join(
                     f"{b} {ms:.3f} ms" for b, ms in alone_ms.items()) or "none whole")
        if len({b for b in path if b}) < 2:
            log.info("%s: mixing: the DP keeps one backend; no mixed candidate", self._label)
            return
        if alone_ms and total > min(alone_ms.values()) * (1 - MIX_MARGIN):
            log.info("%s: mixing: the DP's placement is predicted less than %.0f%% faster "
                     "than one backend throughout; not built", self._label, MIX_MARGIN * 100)
            return
        self._try(segs, path, got.compile_s, best, args)

    def _backends(self, alone: list[Candidate], best: Candidate) -> list[str]:
        """The compiled backends whose ``only`` candidate ran within MIX_SPAN of the best,
        fastest first."""
        inline = self._planner.inline
        return list(dict.fromkeys(
            lab[len(ONLY):] for c in alone for lab in c.labels
            if lab.startswith(ONLY) and lab[len(ONLY):] in self._planner.backends
            and lab[len(ONLY):] not in inline and c.measured_ms <= MIX_SPAN * best.measured_ms))

    def _segments(self) -> Optional[tuple[list[Segment], int, dict[str, torch.fx.Node]]]:
        return module_segments(self._planner, self._gm, self._timing.options.mix_max_segments,
                               self._label, "mixing")

    def _log_probes(self, segs: list[Segment], got: ProbeTimes) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        first: dict = {}
        for s in segs:
            first.setdefault(s.kind, f"{s.cls or 'top level'}@{s.index}")
        oracle = self.times.oracle_ms() if self.times is not None else None
        log.info("%s: mixing: segment times %s; pair times %s; oracle (fastest per "
                 "segment, boundaries free) %s ms", self._label,
                 {(first[k], b): round(ms, 4) for (k, b), ms in got.single.items()},
                 {(first[k1], first[k2], b): round(ms, 4)
                  for ((k1, k2), b), ms in got.pair.items()},
                 None if oracle is None else round(oracle, 4))

    def _try(self, segs: list[Segment], path: list[str], compile_s: dict[str, float],
             best: Candidate, args: list) -> None:
        """Build the DP's placement (when new and when its compile fits the budget), time
        it beside ``best``, and keep it only when it wins twice by more than MIX_MARGIN."""
        timing = self._timing
        steer = {name: b for s, b in zip(segs, path) if b for name in s.nodes}
        plan = steered_plan(self._planner, self._gm, self._candidates[0].plan, steer)
        if plan_key(plan) in {plan_key(c.plan) for c in self._candidates}:
            log.info("%s: mixing: the mixed placement equals a candidate timed already",
                     self._label)
            return
        elapsed = timing.elapsed()
        # its compile, predicted from the probes' (per segment, by backend): a compile
        # under way is never interrupted, so one that would overrun the budget is not begun
        need = sum(compile_s.get(b, 0.0) for b in path)
        if elapsed + need > timing.budget_s:
            log.info("%s: mixing: compiling the mixed placement (%d partitions, about %.0f s "
                     "by the probes' compiles) would overrun the measure budget (%.0f s "
                     "spent of %.0f)", self._label, len(plan.partitions), need, elapsed,
                     timing.budget_s)
            return
        cand = Candidate(f"{MIX}{summary(segs, path)}", plan,
                         plan_ms(plan, self._planner.inline), steer=steer)
        self._candidates.append(cand)
        timing.progress(f"{self._label}: timing the mixed candidate ({len(plan.partitions)} "
                        f"partitions), {elapsed:.1f} s", elapsed)
        timing.time_one(cand, args)
        if timing.beats(cand, best, args, MIX_MARGIN):
            log.info("%s: mixing wins: %.3f ms against %s %.3f ms", self._label,
                     cand.measured_ms, best.label, best.measured_ms)
            return
        cand.eligible = False
        log.info("%s: mixing did not win: %.3f ms against %s %.3f ms", self._label,
                 cand.measured_ms, best.label, best.measured_ms)


def module_segments(planner: Planner, gm: torch.fx.GraphModule, limit: int, label: str,
                    what: str) -> Optional[tuple[list[Segment], int, dict[str, torch.fx.Node]]]:
    """The segments of ``gm`` at the module depth that cuts it into 2 to ``limit`` of
    them (``segments.choose_depth``), the depth, and the compute nodes by name; None
    (logged, for ``what`` is cutting) when no depth fits or a getitem is cut from its
    producer. Mixing and the per-module precision search (permodule.py) cut the same."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    infos = [node_info(n) for n in nodes]
    # a segment is at least min_block_size nodes, as a partition is
    small = max(1, planner.min_block_size)
    depth = choose_depth(infos, limit, small)
    if depth is None:
        log.info("%s: %s skipped: no module depth cuts the graph into 2 to %d segments "
                 "(measure.mix_max_segments)", label, what, limit)
        return None
    segs = segment(infos, depth, small)
    seg_of = {name: s.index for s in segs for name in s.nodes}
    split = [n.name for n in nodes if is_getitem(n)
             and seg_of[n.name] != seg_of.get(n.args[0].name)]
    if split:
        log.info("%s: %s skipped: %s is cut from its producer at depth %d", label, what,
                 split[0], depth)
        return None
    log.info("%s: %s: %d segments at module depth %d (%d kinds), %d value(s) read from "
             "further back than the previous segment", label, what, len(segs), depth,
             len({s.kind for s in segs}), skip_edges(infos, segs))
    return segs, depth, {n.name: n for n in nodes}


def chain_costs(segs: list[Segment], able: list[set], measured: list[str],
                got: ProbeTimes) -> tuple[list[dict[str, float]],
                                          Callable[[int, str, str], float]]:
    """The chain DP's inputs (docs/policies.md, step 3): each segment's cost per backend,
    its own time less half the savings on its sides (a segment no backend measured: the
    partitioner decides, ``""``), and the boundary cost between differently placed
    neighbours, half the savings of both backends there."""
    single, pair = got.single, got.pair

    def saving(i: int, b: str) -> float:
        """What keeping segments i and i + 1 together on b saves against apart: from
        0 (a pair measured slower than its parts apart is taken as noise: BERT-base
        under load measured -3.7 ms on OpenVINO's attention + intermediate) to the
        smaller one's time (one noisy sample must not make a segment's cost
        negative)."""
        k = pair_kind(segs, i)
        one, two = single.get((segs[i].kind, b)), single.get((segs[i + 1].kind, b))
        both = pair.get((k, b))
        if None in (one, two, both):
            return 0.0
        return max(0.0, min(min(one, two), one + two - both))

    rows = []
    for s in segs:
        row = {b: single[(s.kind, b)] - 0.5 * (
            (saving(s.index - 1, b) if s.index > 0 else 0.0)
            + (saving(s.index, b) if s.index + 1 < len(segs) else 0.0))
            for b in measured if (s.kind, b) in single and b in able[s.index]}
        rows.append(row or {"": 0.0})  # no backend measured: the partitioner decides

    def boundary(i: int, a: str, b: str) -> float:
        return 0.5 * ((saving(i, a) if a else 0.0) + (saving(i, b) if b else 0.0))

    return rows, boundary


def node_info(node: torch.fx.Node) -> NodeInfo:
    """What segmenting reads of a node: its module stack (Dynamo's ``nn_module_stack``,
    kept by AOTAutograd), a signature without names (op, output shapes and dtypes, the
    arguments that are not nodes) and the names of the compute nodes it reads."""
    stack = tuple((str(v[0]), getattr(v[1], "__qualname__", str(v[1])))
                  if isinstance(v, tuple) and len(v) == 2 else (str(k), "")
                  for k, v in (node.meta.get("nn_module_stack") or {}).items())
    if is_getitem(node):  # a getitem belongs with its producer
        stack = node_info(node.args[0]).stack if isinstance(node.args[0], torch.fx.Node) \
            else stack
    vals = node.meta.get("val")
    vals = vals if isinstance(vals, (tuple, list)) else (vals,)
    outs = tuple((tuple(str(d) for d in v.shape), str(v.dtype))  # str: SymInts do not hash
                 if isinstance(v, torch.Tensor) else type(v).__name__ for v in vals)
    consts = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: "%")
    signature: Hashable = (op_name(node.target), outs, repr(consts))
    inputs = tuple(n.name for n in node.all_input_nodes)
    return NodeInfo(node.name, stack, signature, inputs)


def summary(segs: list[Segment], path: list[str]) -> str:
    """Which module classes went where: ``BertAttention x12 on onnxruntime, ...``."""
    groups: dict = {}
    for s, b in zip(segs, path):
        groups.setdefault((s.cls or "top level", b or "as planned"), 0)
        groups[(s.cls or "top level", b or "as planned")] += 1
    return ", ".join(f"{cls} x{n} on {b}" if n > 1 else f"{cls} on {b}"
                     for (cls, b), n in groups.items())
