"""Policy `measure`: time the candidate placements on the graph's first real call.

Why at the first call: ``_compile_graph`` sees FakeTensor metadata only. Random inputs
drawn from it break integer inputs (token ids that index an embedding go out of range)
and miss data-dependent paths; the first call has the real inputs, and the pieces
compile lazily on it anyway. So ``MeasuredGraph`` stands where the stitched graph would,
and on its first call:

1. looks the decision up in the persistent cache (key: the graph, its real input shapes,
   its constants' bytes, the config and the backends' versions); on a hit, that
   candidate is built and nothing is timed;
2. else times the candidates (``policy.candidates``: priority, then every single-backend
   placement, cheapest estimate first) end to end: ``warmup`` untimed calls (the first
   compiles), then ``repeats`` timed calls, the median counts. End-to-end timing counts
   boundary costs for free. Pieces are shared between candidates by (chain, nodes), so a
   partition common to two candidates compiles once, and the winner's pieces are already
   compiled when it is installed. Then (``measure.mix``) a mixed candidate cut at module
   boundaries, a backend per segment chosen by a dynamic program over measured segment
   costs (``_mix``, ``plan/segments.py``), and refinement (``_refine``);
3. stops starting new work once ``time_budget_s`` is spent (a compile under way is not
   interrupted); candidates left unmeasured are ranked by their cost estimate scaled to
   the measured ones (median measured/estimate ratio). The priority candidate is always
   measured;
4. installs the winner, records every candidate's time in the plan, stores the decision.

The graph runs functionally during timing, but an inference graph may still write to an
input (``copy_`` into a buffer): then timing runs on clones of the inputs. Torch's RNG
state is restored afterwards (``torch.random.fork_rng``), so random ops draw what eager
would have drawn.
"""
from __future__ import annotations

import logging
import math
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional

import torch

from ..cache import Cache, fingerprint
from ..errors import describe
from ..ops import is_getitem, is_mutating, op_name
from ..plan.cost import load_table, node_us, plan_ms
from ..plan.partition import Partition, Plan
from ..plan.planner import Planner
from ..plan.policy import ONLY, PRIORITY, Candidate, plan_key
from ..plan.segments import (NodeInfo, Segment, SegmentTimes, best_chain, choose_depth,
                             pair_kind, probe_layouts, segment, skip_edges)
from ..plan.support import FixedSupport, Preferred
from .piece import Piece, PieceRecord
from .record import GraphRecord

log = logging.getLogger(__name__)

#: Work longer than this shows a progress line on stderr (logging has it at INFO anyway).
PROGRESS_AFTER_S = 2.0
#: A refinement step is kept only when it beats the best so far by more than this.
REFINE_MARGIN = 0.03
#: Config `against_eager`: eager replaces a policy's plan only when faster by more than this.
EAGER_MARGIN = 0.03
#: From the third timing round, a candidate whose fastest sample is this many times the
#: fastest candidate's slowest is not timed again.
FAR_BEHIND = 1.5
#: The mixed candidate is kept only when it beats the best so far by more than this.
MIX_MARGIN = 0.01
#: Label prefix of the mixed candidate (module boundaries, ``_mix``).
MIX = "mix: "
#: Mixing times segments only on backends whose whole graph ran within this factor of
#: the fastest's (each probe compiles; a backend far behind rarely wins a segment).
MIX_SPAN = 1.5
#: The segment probes' rounds also time the best candidate and the whole graph of this many
#: of the probed backends (fastest first), at the same time as the probes (SegmentTimes
#: .whole_ms: the whole-graph rounds ran earlier, under another load).
MIX_WHOLE = 1
#: One timing sample lasts at least this long (several calls of a fast graph).
SAMPLE_S = 0.002
#: At most this many calls make one sample.
MAX_INNER = 50


class MeasuredGraph:
    """Callable standing for one graph under policy `measure`; see the module docstring."""

    def __init__(self, planner: Planner, options: Any, cache: Optional[Cache],
                 gm: torch.fx.GraphModule, constants: dict, cands: list[Candidate],
                 record: GraphRecord, label: str,
                 build: Callable[[Candidate], tuple[Callable, dict]],
                 install: Callable[[Plan, dict[int, PieceRecord]], None],
                 accuracy: Any = None, margin: float = 0.0):
        """``options``: the config's ``measure`` options; ``build(candidate)`` -> (its
        stitched callable, partition id -> piece record), sharing pieces between
        candidates; ``install(plan, records)`` puts the chosen plan on the graph's record;
        ``accuracy``: the config's tolerance (rtol, atol) for lower-precision candidates
        (``Candidate.lowered``), which are run first against eager (``_accept``);
        ``margin``: the first candidate (a policy's own plan, timed against eager: config
        `against_eager`) gives way only to one measured faster by more than this
        fraction, so that noise does not move a graph off its policy's plan."""
        self._planner = planner
        self._opts = options
        self._cache = cache
        self._install_plan = install
        self._gm = gm
        self._constants = constants
        self.candidates = cands
        self._record = record
        self._label = label
        self._build = build  # candidate -> (stitched callable, records); shares pieces
        self._lock = threading.Lock()
        self._fn: Callable = self._first_call
        self.chosen: Optional[Candidate] = None
        self.from_cache = False
        self._progress_at = 0.0  # when the last progress line was printed
        self._ready: dict = {}  # label -> (stitched callable, its pieces, calls per sample)
        self._samples: dict[str, list[float]] = {}  # label -> ms per call, per sample
        self._rounds_done = 0
        self._confident: Optional[bool] = None
        self._tolerance = None if accuracy is None else (float(accuracy.rtol),
                                                         float(accuracy.atol))
        self._reference: Optional[list] = None  # float32 eager's outputs on the first call
        self._margin = margin
        self.__name__ = f"measured_{label}"

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)

    def _first_call(self, *args: Any) -> Any:
        with self._lock:
            if self.chosen is None:
                group = _distributed()
                if group is None:
                    self._choose(args)
                else:
                    self._choose_distributed(args, group)
        return self._fn(*args)

    # -- choosing ------------------------------------------------------------------
    def _choose_distributed(self, args: Sequence[Any], dist: Any) -> None:
        """Every rank must run the same backend for the same subgraph (a collective
        inside a partition, and numbers that agree): rank 0 decides (cache or timing, as
        alone) and broadcasts its decision; the other ranks install it untimed. Each
        rank's graphs reach their first call in the same order (the same program), so the
        broadcasts pair up. A rank 0 whose candidates fail to compile still broadcasts
        (measuring catches those failures); a process that dies leaves the others in
        the broadcast until the process group's timeout."""
        outcome = self._record.outcome
        outcome.rank, outcome.world_size = dist.get_rank(), dist.get_world_size()
        if dist.get_rank() == 0:
            self._choose(args)
            dist.broadcast_object_list([self._decision(self.chosen)], src=0)
            outcome.broadcast = "rank 0: broadcast"
            return
        box: list = [None]
        dist.broadcast_object_list(box, src=0)
        if not self._apply(box[0]):
            raise RuntimeError(f"{self._label}: rank 0's decision {box[0]!r} names no "
                               "candidate of this rank's graph (the ranks' graphs differ)")
        outcome.broadcast = "from rank 0"
        log.info("%s: measured decision from rank 0: %s", self._label, self.chosen.label)

    def _apply(self, hit: Any, args: Optional[Sequence[Any]] = None) -> Optional[bool]:
        """Install a decision ({label, steer, measured_ms}: the cache's, or rank 0's)
        when it names a candidate of this graph (a refined one is rebuilt from its
        node -> backend map, by node position: names may differ): True. False when it
        names none; None when it names a lower-precision candidate outside the accuracy
        tolerance on ``args`` (never taken on trust: this call's inputs decide)."""
        by_label = {c.label: c for c in self.candidates}
        if isinstance(hit, dict) and hit.get("label") not in by_label \
                and isinstance(hit.get("steer"), dict):
            names = [n.name for n in self._gm.graph.nodes]
            steer = {names[int(i)]: b for i, b in hit["steer"].items()
                     if str(i).isdigit() and int(i) < len(names)}
            refined = Candidate(hit["label"], self._steered_plan(steer), 0.0, steer=steer)
            self.candidates.append(refined)
            by_label[refined.label] = refined
        if not (isinstance(hit, dict) and hit.get("label") in by_label):
            return False
        chosen = by_label[hit["label"]]
        if chosen.lowered and args is not None and not self._accept(chosen, args):
            log.warning("%s: decision %r is not within the accuracy tolerance on these "
                        "inputs (%s); measuring again", self._label, hit["label"],
                        chosen.rejected)
            return None
        for c in self.candidates:
            ms = (hit.get("measured_ms") or {}).get(c.label)
            c.measured_ms = float(ms) if isinstance(ms, (int, float)) else None
        self._install(chosen, {})
        return True

    def _choose(self, args: Sequence[Any]) -> None:
        cache = self._cache
        key = None
        if cache is not None:
            parts = self._planner.decision_parts()
            if getattr(self._opts, "mix", False):
                # mixing adds a candidate: a decision made without it is made again
                parts = {**parts, "mix": self._opts.mix_max_segments}
            key = fingerprint(self._gm, args, parts, self._constants)
            hit = cache.get_json("decision", key)
            applied = self._apply(hit, args)
            if applied:
                self.from_cache = True
                log.info("%s: measured decision from the cache: %s", self._label, hit["label"])
                return
            if hit is not None and applied is False:
                log.warning("%s: cached decision %r names no candidate of this graph; "
                            "measuring again", self._label, hit.get("label"))
        per_part = self._measure(args)
        chosen = self._held(self._pick())
        self._install(chosen, per_part)
        if cache is not None and key is not None:
            cache.put_json("decision", key, self._decision(chosen))

    def _decision(self, chosen: Candidate) -> dict:
        """A decision as ``_apply`` reads it (the cache's, or rank 0's broadcast): its
        label, a refined placement's node -> backend map by node position (names may
        differ between processes), and the candidates' measured times."""
        pos = {n.name: i for i, n in enumerate(self._gm.graph.nodes)}
        return {"label": chosen.label,
                "steer": {str(pos[k]): b for k, b in chosen.steer.items() if k in pos}
                if chosen.steer else None,
                "measured_ms": {c.label: c.measured_ms for c in self.candidates
                                if c.measured_ms is not None}}

    def _measure(self, args: Sequence[Any]) -> dict:
        """Time candidates within the budget; returns (backend, node names) -> ms."""
        opts = self._opts
        args = list(args)
        if any(is_mutating(n) for n in self._gm.graph.nodes):
            args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        start = time.perf_counter()
        per_part: dict = {}
        # Priority first (always measured: it is what the user gets without measuring),
        # then the others by estimate, cheapest first, so the budget goes to the likeliest.
        order = sorted(self.candidates, key=lambda c: (c.label != PRIORITY, c.estimate_ms))
        with torch.random.fork_rng(devices=[]):
            self._measure_candidates(order, args, start, per_part, opts)
            if getattr(opts, "mix", False):
                try:
                    self._mix(args, start, per_part)
                except Exception as exc:  # noqa: BLE001 - the whole-graph choice stands
                    log.warning("%s: mixing at module boundaries failed (%s: %s); choosing "
                                "among the other candidates", self._label,
                                type(exc).__name__, exc, exc_info=True)
                    for c in self.candidates:  # never chosen by its estimate alone
                        if c.label.startswith(MIX) and c.measured_ms is None:
                            c.eligible = False
            if opts.refine:
                self._refine(args, start, per_part)
        log.info("%s: measured %s", self._label, ", ".join(
            f"{c.label} {c.measured_ms:.3f} ms" if c.measured_ms is not None
            else f"{c.label} (refused: {c.rejected})" if c.rejected
            else f"{c.label} (estimate {c.estimate_ms:.3f} ms)" for c in self.candidates))
        return per_part

    def _progress(self, msg: str, elapsed: float) -> None:
        """INFO always; past PROGRESS_AFTER_S also a whole line on stderr, at most one
        every PROGRESS_AFTER_S (a whole line: log lines never land inside it)."""
        log.info(msg)
        if self._opts.progress and elapsed > PROGRESS_AFTER_S \
                and elapsed - self._progress_at >= PROGRESS_AFTER_S:
            print(f"arbiter: {msg}", file=sys.stderr, flush=True)
            self._progress_at = elapsed

    def _measure_candidates(self, order, args, start, per_part, opts) -> None:
        """Compile and warm up every candidate the budget allows (priority always), then
        time them in interleaved rounds (``_rounds``)."""
        ready = []
        for k, cand in enumerate(order):
            elapsed = time.perf_counter() - start
            if cand.label != PRIORITY and elapsed > opts.time_budget_s:
                log.info("%s: measure budget %.1f s spent; %d candidate(s) left to the "
                         "cost estimate", self._label, opts.time_budget_s, len(order) - k)
                break
            self._progress(f"{self._label}: warming up candidate {k + 1} of {len(order)} "
                           f"({cand.label}; a first call compiles what it has to), "
                           f"{elapsed:.1f} s into measuring", elapsed)
            if cand.lowered and not self._accept(cand, args):
                continue  # outside the tolerance: never timed, never chosen
            if cand.label == PRIORITY:
                self._prepare(cand, args)  # what policy priority runs: its failure is real
            elif not self._tried(cand, lambda c=cand: self._prepare(c, args)):
                continue
            ready.append(cand)
        self._rounds(ready, args, start, per_part, confident_stop=True)

    def _prepare(self, cand: Candidate, args: list) -> None:
        """Build ``cand`` (pieces shared with the other candidates), run its warm-up calls
        (the first compiles) and pick how many calls one timing sample takes."""
        if cand.label in self._ready:
            return
        fn, _ = self._build(cand)
        # The first call compiles; it is never timed, whatever `warmup` says.
        for _ in range(max(1, self._opts.warmup)):
            fn(*args)
        t0 = time.perf_counter()
        fn(*args)
        once = time.perf_counter() - t0
        # a sample of at least SAMPLE_S: a single call of a microsecond graph is noise
        inner = max(1, min(MAX_INNER, int(SAMPLE_S / max(once, 1e-9))))
        self._ready[cand.label] = (fn, _pieces(fn), inner)
        self._samples.setdefault(cand.label, [])

    def _rounds(self, cands: list[Candidate], args: list, start: float, per_part: dict,
                confident_stop: bool) -> None:
        """Time ``cands`` in interleaved rounds (each round times each once, the order
        rotating), so that load and thermal drift fall on all alike. At least
        ``repeats`` rounds; then, with ``confident_stop``, more until the fastest one's
        upper quartile is below every other's lower quartile, up to ``max_repeats``
        rounds or the budget. Each candidate's ``measured_ms`` is the median of all its
        samples so far."""
        opts = self._opts
        if not cands:
            return
        part_samples: dict = {}
        timing = cands
        for r in range(max(opts.repeats, opts.max_repeats)):
            if r >= opts.repeats and (not confident_stop or self._separated(cands)):
                break
            if confident_stop and r >= 2:
                # only what is still undecided is timed again: from the third round a
                # candidate whose fastest sample is FAR_BEHIND times the fastest's slowest,
                # and past `repeats` one apart from the fastest (quartiles), cannot change
                # the ranking, and timing it again would spend the budget (eager and
                # Inductor at 4-6x on BERT-base under load: 15 rounds, the whole budget)
                timing = self._undecided(cands, apart=r >= opts.repeats)
            shift = r % len(timing)
            for cand in timing[shift:] + timing[:shift]:
                fn, pieces, inner = self._ready[cand.label]
                for p in pieces:
                    p.timed = True
                before = {p: p.record.run_s for p in pieces}
                self._samples[cand.label].append(self._sample(cand, fn, inner, args))
                for p in pieces:
                    p.timed = False
                    part_samples.setdefault(p, []).append(
                        (p.record.run_s - before[p]) * 1e3 / inner)
            self._rounds_done = max(self._rounds_done, r + 1)
            if time.perf_counter() - start > opts.time_budget_s:
                break  # out of budget: fewer rounds beat none
        for p, xs in part_samples.items():
            per_part[(p.record.backend, p.node_names)] = statistics.median(xs)
        for cand in cands:
            xs = self._samples[cand.label]
            cand.measured_ms = statistics.median(xs)
            cand.spread_ms = _quartiles(xs)
        self._confident = self._separated(cands)

    @staticmethod
    def _sample(cand: Candidate, fn: Callable, inner: int, args: list) -> float:
        """One timing sample of ``cand``: milliseconds per call over ``inner`` calls."""
        t0 = time.perf_counter()
        for _ in range(inner):
            fn(*args)
        return (time.perf_counter() - t0) * 1e3 / inner

    def _undecided(self, cands: list[Candidate], apart: bool) -> list[Candidate]:
        """The fastest candidate by median and the others still in the race (``cands``
        order): not FAR_BEHIND (fastest sample over FAR_BEHIND times the fastest one's
        slowest) and, with ``apart``, with a lower quartile not above its upper one."""
        samples = {c.label: self._samples[c.label] for c in cands
                   if len(self._samples[c.label]) >= 2}
        if len(samples) < 2:
            return cands
        best = min(samples, key=lambda k: statistics.median(samples[k]))
        best_hi = _quartiles(samples[best])[1]
        worst = max(samples[best])

        def live(c: Candidate) -> bool:
            xs = samples.get(c.label)
            if xs is None or c.label == best:
                return True
            return min(xs) <= FAR_BEHIND * worst and (not apart or _quartiles(xs)[0] <= best_hi)

        return [c for c in cands if live(c)]

    def _separated(self, cands: list[Candidate]) -> bool:
        """Whether the fastest candidate's samples are clearly apart from every other's:
        its upper quartile below their lower quartiles."""
        stats = [(statistics.median(xs), _quartiles(xs)) for xs in
                 (self._samples[c.label] for c in cands) if len(xs) >= 2]
        if len(stats) < 2:
            return True
        stats.sort()
        best_hi = stats[0][1][1]
        return all(best_hi < lo for _, (lo, _) in stats[1:])

    # -- lower precision (config `accuracy`, docs/precision.md) ---------------------
    def _accept(self, cand: Candidate, args: Sequence[Any]) -> bool:
        """Whether a lower-precision candidate is within the tolerance on these (the
        first call's real) inputs: its first call (which compiles; each lowered piece
        checks its own outputs against its eager ATen then, with the same tolerance, and
        demotes itself if out of it) and then its outputs against the whole graph in
        float32 eager. Records ``cand.error``; a refusal sets ``cand.rejected`` and makes
        it ineligible."""
        if cand.error is not None or cand.rejected:
            return not cand.rejected
        from .verify import compare, uniform_tolerances

        rtol, atol = self._tolerance if self._tolerance is not None else (0.0, 0.0)
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
        demoted = [p for p in _pieces(fn) if p.record.planned in cand.lowered
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

    # -- refinement (Collage-style) ------------------------------------------------
    def _steered_plan(self, prefer: dict) -> Plan:
        """A plan where each named node goes to the backend ``prefer`` names, where it
        can run it (the partitioner still enforces acyclicity and min_block_size)."""
        base = self.candidates[0].plan  # priority: every backend's answer for each node
        table = Preferred(FixedSupport(base.support, self._planner.fallback_name,
                                       base.patterns),
                          lambda n: prefer.get(n.name))
        return self._planner.plan(self._gm, table)

    def _refine(self, args, start, per_part) -> None:
        """Move one partition of the best measured placement at a time to another
        backend able to run all of it; keep a move when the whole graph gets faster by
        more than REFINE_MARGIN twice (``_beats``; timings here are noisy); stop when the
        budget is spent, or after ``refine_patience`` moves in a row that did not win."""
        opts = self._opts
        best = self._pick(lowered=False)  # refined from the best float32 placement
        if best is None or best.measured_ms is None:
            return
        support = self.candidates[0].plan.support
        prefer = {n.name: p.backend for p in best.plan.partitions for n in p.nodes}
        seen = {plan_key(c.plan) for c in self.candidates}
        inline = self._planner.inline
        patience = getattr(opts, "refine_patience", 0)
        misses = 0
        for part in sorted(best.plan.partitions, key=lambda p: -p.size):
            compute = [n for n in part.nodes if not is_getitem(n)]
            if not compute:
                continue
            common = [b for b in support[compute[0]].candidates
                      if b != part.backend and all(b in support[n].candidates for n in compute)]
            # Moves tried: the whole partition, then each op of it alone (ops whose
            # nodes cost most, by the estimate, first): finer cuts than whole partitions,
            # as Collage explores, in a number of steps linear in the partition's ops.
            by_op: dict = {}
            for n in compute:
                by_op.setdefault(op_name(n.target), []).append(n)
            cost_of = load_table().of(part.backend)
            ops = sorted(by_op, key=lambda o: -sum(node_us(n, cost_of) for n in by_op[o]))
            moves = [(f"{len(compute)} nodes", part.nodes)]
            if len(ops) > 1:
                moves += [(f"its {len(by_op[o])} {o}", by_op[o]) for o in ops]
            for backend in common:
                for what, nodes in moves:
                    elapsed = time.perf_counter() - start
                    if elapsed > opts.time_budget_s:
                        log.info("%s: measure budget spent during refinement", self._label)
                        return
                    trial = dict(prefer)
                    for n in nodes:
                        trial[n.name] = backend
                    plan = self._steered_plan(trial)
                    key = plan_key(plan)
                    if key in seen:
                        continue
                    seen.add(key)
                    cand = Candidate(f"refine: {what} of a {part.backend} partition (first "
                                     f"{compute[0].name}) to {backend}", plan,
                                     plan_ms(plan, inline), steer=trial)
                    self.candidates.append(cand)
                    self._progress(f"{self._label}: refining ({cand.label}), {elapsed:.1f} s",
                                   elapsed)
                    ran = self._tried(cand, lambda c=cand: self._time(c, args, start,
                                                                      per_part))
                    if ran and self._beats(cand, best, args, start, per_part):
                        best, prefer = cand, trial
                        misses = 0
                        continue
                    cand.eligible = False
                    misses += 1
                    if patience and misses >= patience:
                        log.info("%s: refinement stopped after %d moves in a row that did "
                                 "not win (measure.refine_patience)", self._label, misses)
                        return

    def _beats(self, cand: Candidate, best: Candidate, args: list, start: float,
               per_part: dict, margin: float = REFINE_MARGIN) -> bool:
        """Whether a refinement step (or the mixed candidate) beats the best so far by
        more than ``margin`` (REFINE_MARGIN; MIX_MARGIN for the mixed one), in
        its first interleaved timing and again when both are timed once more: a
        challenger must win twice. On graphs of microseconds one timing's noise exceeds
        the margin (a test backend's graph moved one op to eager on noise alone in 5 of 12
        runs before this rule)."""
        if not cand.measured_ms < best.measured_ms * (1 - margin):
            return False
        self._samples[cand.label] = []
        self._samples[best.label] = []
        self._rounds([best, cand], args, start, per_part, confident_stop=False)
        return cand.measured_ms < best.measured_ms * (1 - margin)

    def _tried(self, cand: Candidate, run: Callable[[], None]) -> bool:
        """Run ``run`` (``cand``'s compile, warm-up and timing); if it raises, ``cand``
        is out of the race (logged as a warning, never chosen) and the user's call goes on
        with the other candidates: a placement that cannot run (a graph cut whose eager
        fallback fails too, found on GPT-2 training with a refinement step) must not fail
        the model. Candidates run the same functional graph on the same inputs many times
        while timing, so a failed run leaves nothing to undo."""
        try:
            run()
            return True
        except Exception as exc:  # noqa: BLE001 - a candidate failing must not fail the user
            log.warning("%s: candidate %s failed to run (%s); it is out of the measurement",
                        self._label, cand.label, describe(exc))
            log.debug("candidate failure detail", exc_info=True)
            cand.eligible = False
            cand.rejected = f"failed to run: {describe(exc)}"
            self._ready.pop(cand.label, None)
            return False

    def _time(self, cand: Candidate, args: list, start: float, per_part: dict) -> None:
        """One candidate on its own (a refinement step's first timing), beside the best
        so far when there is one: interleaved with it."""
        self._prepare(cand, args)
        self._rounds([cand], args, start, per_part, confident_stop=False)

    # -- mixing at module boundaries (plan/segments.py) -----------------------------
    def _mix(self, args: list, start: float, per_part: dict) -> None:
        """The mixed candidate (docs/policies.md "Mixing at module boundaries"): segments
        of the graph at a module depth; one instance of each kind of segment and of
        adjacent pair timed on each backend that ran the graph alone (fastest first,
        within the budget), as partitions of their own in probe plans that run the rest
        in eager; a backend per segment by the chain DP (``segments.best_chain``); that
        placement, made by the partitioner through ``steer`` as refinement does, timed
        end to end beside the best so far and kept only when it wins twice by more than
        MIX_MARGIN."""
        opts = self._opts
        best = self._pick(lowered=False)
        if best is None or best.measured_ms is None:
            return
        base = self.candidates[0].plan
        inline = self._planner.inline
        # the backends that ran the graph alone, fastest first (compiled, float32)
        alone = sorted((c for c in self.candidates if c.measured_ms is not None
                        and not c.lowered), key=lambda c: c.measured_ms)
        backends = list(dict.fromkeys(
            lab[len(ONLY):] for c in alone for lab in c.labels
            if lab.startswith(ONLY) and lab[len(ONLY):] in self._planner.backends
            and lab[len(ONLY):] not in inline and c.measured_ms <= MIX_SPAN * best.measured_ms))
        if len(backends) < 2:
            log.info("%s: mixing skipped: fewer than two compiled backends ran the graph "
                     "alone within %.1fx of the fastest", self._label, MIX_SPAN)
            return
        nodes = [n for n in self._gm.graph.nodes if n.op == "call_function"]
        infos = [_node_info(n) for n in nodes]
        # a segment is at least min_block_size nodes, as a partition is
        small = max(1, self._planner.min_block_size)
        depth = choose_depth(infos, opts.mix_max_segments, small)
        if depth is None:
            log.info("%s: mixing skipped: no module depth cuts the graph into 2 to %d "
                     "segments (measure.mix_max_segments)", self._label, opts.mix_max_segments)
            return
        segs = segment(infos, depth, small)
        seg_of = {name: s.index for s in segs for name in s.nodes}
        by_name = {n.name: n for n in nodes}
        split = [n.name for n in nodes if is_getitem(n)
                 and seg_of[n.name] != seg_of.get(n.args[0].name)]
        if split:
            log.info("%s: mixing skipped: %s is cut from its producer at depth %d",
                     self._label, split[0], depth)
            return
        able = [{b for b in backends if all(b in base.candidates(by_name[x])
                                            for x in s.nodes if not is_getitem(by_name[x]))}
                for s in segs]
        log.info("%s: mixing: %d segments at module depth %d (%d kinds), %d value(s) read "
                 "from further back than the previous segment", self._label, len(segs),
                 depth, len({s.kind for s in segs}), skip_edges(infos, segs))
        whole = [best] + [c for b in backends[:MIX_WHOLE] for c in alone
                          if ONLY + b in c.labels and c is not best]
        costs = self._time_segments(segs, able, backends, by_name, args, start, per_part,
                                    whole)
        if costs is None:
            return
        single, pair, compile_s, whole_ms = costs
        # kept on the outcome (bench/mix_oracle.py reads the oracle bound off it)
        times = SegmentTimes(depth, tuple(segs), dict(single), dict(pair), whole_ms=whole_ms)
        self._record.outcome.mix = times
        if log.isEnabledFor(logging.INFO):
            first: dict = {}
            for s in segs:
                first.setdefault(s.kind, f"{s.cls or 'top level'}@{s.index}")
            log.info("%s: mixing: segment times %s; pair times %s; oracle (fastest per "
                     "segment, boundaries free) %s ms", self._label,
                     {(first[k], b): round(ms, 4) for (k, b), ms in single.items()},
                     {(first[k1], first[k2], b): round(ms, 4)
                      for ((k1, k2), b), ms in pair.items()},
                     None if times.oracle_ms() is None else round(times.oracle_ms(), 4))
        measured = [b for b in backends if any((s.kind, b) in single for s in segs)]

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

        try:
            total, path = best_chain(rows, boundary)
        except ValueError as exc:  # pragma: no cover - every row has an option
            log.info("%s: mixing skipped: %s", self._label, exc)
            return
        times.path, times.predicted_ms = list(path), total
        alone_ms = {b: sum(r[b] for r in rows) for b in measured
                    if all(b in r for r in rows)}
        log.info("%s: mixing: segment DP predicts %.3f ms (%s); each backend alone by the "
                 "same sums: %s", self._label, total, _summary(segs, path), ", ".join(
                     f"{b} {ms:.3f} ms" for b, ms in alone_ms.items()) or "none whole")
        if len({b for b in path if b}) < 2:
            log.info("%s: mixing: the DP keeps one backend; no mixed candidate", self._label)
            return
        if alone_ms and total > min(alone_ms.values()) * (1 - MIX_MARGIN):
            log.info("%s: mixing: the DP's placement is predicted less than %.0f%% faster "
                     "than one backend throughout; not built", self._label, MIX_MARGIN * 100)
            return
        steer = {name: b for s, b in zip(segs, path) if b for name in s.nodes}
        plan = self._steered_plan(steer)
        if plan_key(plan) in {plan_key(c.plan) for c in self.candidates}:
            log.info("%s: mixing: the mixed placement equals a candidate timed already",
                     self._label)
            return
        elapsed = time.perf_counter() - start
        # its compile, predicted from the probes' (per segment, by backend): a compile
        # under way is never interrupted, so one that would overrun the budget is not begun
        need = sum(compile_s.get(b, 0.0) for b in path)
        if elapsed + need > opts.time_budget_s:
            log.info("%s: mixing: compiling the mixed placement (%d partitions, about %.0f s "
                     "by the probes' compiles) would overrun the measure budget (%.0f s "
                     "spent of %.0f)", self._label, len(plan.partitions), need, elapsed,
                     opts.time_budget_s)
            return
        cand = Candidate(f"{MIX}{_summary(segs, path)}", plan, plan_ms(plan, inline),
                         steer=steer)
        self.candidates.append(cand)
        self._progress(f"{self._label}: timing the mixed candidate ({len(plan.partitions)} "
                       f"partitions), {elapsed:.1f} s", elapsed)
        self._time(cand, args, start, per_part)
        if self._beats(cand, best, args, start, per_part, margin=MIX_MARGIN):
            log.info("%s: mixing wins: %.3f ms against %s %.3f ms", self._label,
                     cand.measured_ms, best.label, best.measured_ms)
            return
        cand.eligible = False
        log.info("%s: mixing did not win: %.3f ms against %s %.3f ms", self._label,
                 cand.measured_ms, best.label, best.measured_ms)

    def _time_segments(self, segs: list[Segment], able: list[set], backends: list[str],
                       by_name: dict, args: list, start: float, per_part: dict,
                       whole: Sequence[Candidate] = ()):
        """Per backend (in ``backends`` order, while the budget lasts) and per probe layout
        (``segments.probe_layouts``): a plan whose instances are partitions of their own on
        that backend and whose other nodes run in eager; built, warmed up, then all probes
        timed in interleaved rounds (each piece's own time, ``Piece.timed``), with the
        ``whole`` candidates (built already) end to end in the same rounds. Returns
        ({(segment kind, backend): ms}, {(pair kind, backend): ms}, {backend: mean compile
        s per segment}, {each label of a whole candidate: ms}) of the instances whose backend
        compiled them (a piece that fell back measures nothing), or None when not one
        backend was measured."""
        opts = self._opts
        layouts = probe_layouts(segs)
        base = self.candidates[0].plan
        fallback = self._planner.fallback_name
        probes = []  # (fn, [(piece, what)])
        # layout by layout (the first holds every kind alone), each on every backend:
        # when the budget runs out, the pairs left unmeasured count as saving nothing
        for k, b in [(k, b) for k in range(len(layouts)) for b in backends]:
            layout = layouts[k]
            elapsed = time.perf_counter() - start
            if elapsed > opts.time_budget_s:
                log.info("%s: measure budget spent while timing segments (probes %d/%d "
                         "on %s and after left)", self._label, k + 1, len(layouts), b)
                break
            mine = [inst for inst in layout if all(b in able[i] for i in inst)]
            if not mine:
                continue
            self._progress(f"{self._label}: mixing: compiling segment probes {k + 1}/"
                           f"{len(layouts)} on {b} ({len(mine)} instances), "
                           f"{elapsed:.1f} s", elapsed)
            at = {inst[0]: inst for inst in mine}
            inst_of: dict = {}  # a probe partition's node names -> its instance
            parts: list[Partition] = []
            rest: list = []
            i = 0
            while i < len(segs):
                inst = at.get(i)
                if inst is None:
                    rest += [by_name[x] for x in segs[i].nodes]
                    i += 1
                    continue
                if rest:
                    parts.append(Partition(len(parts), fallback, rest))
                    rest = []
                members = [by_name[x] for j in inst for x in segs[j].nodes]
                parts.append(Partition(len(parts), b, members))
                inst_of[tuple(n.name for n in members)] = inst
                i += len(inst)
            if rest:
                parts.append(Partition(len(parts), fallback, rest))
            plan = Plan(self._gm, parts, base.support, base.fallback, base.patterns)
            probe = Candidate(f"mix probe {k + 1} on {b}", plan, 0.0)
            try:
                fn, _ = self._build(probe)
                for _ in range(max(1, self._opts.warmup)):
                    fn(*args)
            except Exception as exc:  # noqa: BLE001 - a probe is never the answer
                log.info("%s: mixing: %s failed: %s: %s", self._label, probe.label,
                         type(exc).__name__, exc)
                continue
            timed = []
            for piece in _pieces(fn):
                inst = inst_of.get(getattr(piece, "node_names", None))
                if inst is None:
                    continue
                if piece.record.backend != b:
                    log.info("%s: mixing: %s did not take segment %d (%s) whole; it "
                             "fell back to %s", self._label, b, inst[0],
                             segs[inst[0]].path, piece.record.backend)
                    continue
                what = (segs[inst[0]].kind if len(inst) == 1
                        else pair_kind(segs, inst[0]))
                timed.append((piece, (len(inst), what, b)))
            if timed:
                probes.append((fn, timed))
        if not probes:
            return None
        refs = [(self._ready[c.label][0], c.label) for c in whole if c.label in self._ready]
        labels = {c.label: c.labels for c in whole}
        samples: dict = {}
        for r in range(opts.repeats):
            if r and time.perf_counter() - start > opts.time_budget_s:
                break
            order = probes + refs
            shift = r % len(order)
            for fn, timed in order[shift:] + order[:shift]:
                if isinstance(timed, str):  # a whole-graph candidate, end to end
                    t0 = time.perf_counter()
                    fn(*args)
                    samples.setdefault(timed, []).append((time.perf_counter() - t0) * 1e3)
                    continue
                for piece, _ in timed:
                    piece.timed = True
                before = [piece.record.run_s for piece, _ in timed]
                try:
                    fn(*args)
                finally:
                    for piece, _ in timed:
                        piece.timed = False
                for (piece, what), t0 in zip(timed, before):
                    samples.setdefault(what, []).append((piece.record.run_s - t0) * 1e3)
        compiles: dict = {}
        for fn, timed in probes:
            for piece, (size, _, b) in timed:
                compiles.setdefault(b, []).append(piece.record.compile_s / size)
        single, pair = {}, {}
        whole_ms = {other: statistics.median(samples[label]) for _, label in refs
                    if label in samples for other in labels[label]}
        for _, label in refs:
            samples.pop(label, None)
        for (size, kind, b), xs in samples.items():
            (single if size == 1 else pair)[(kind, b)] = statistics.median(xs)
        for fn, timed in probes:
            for piece, what in timed:
                per_part[(piece.record.backend, piece.node_names)] = \
                    statistics.median(samples[what])
        return (single, pair, {b: statistics.mean(xs) for b, xs in compiles.items()},
                whole_ms)

    def _pick(self, lowered: bool = True) -> Optional[Candidate]:
        """The fastest eligible candidate, measured or else estimated (a lower-precision
        one only when measured: it was accepted then); ``lowered=False``: at the graph's
        own precision only."""
        measured = [c for c in self.candidates if c.measured_ms is not None]
        pool = [c for c in self.candidates if c.eligible and not c.rejected
                and (not c.lowered or (lowered and c.measured_ms is not None))]
        if not pool:
            return None
        ratios = [c.measured_ms / c.estimate_ms for c in measured if c.estimate_ms > 0]
        scale = statistics.median(ratios) if ratios else 1.0

        def score(ic):
            i, c = ic
            ms = c.measured_ms if c.measured_ms is not None else c.estimate_ms * scale
            # measured beats predicted on a tie; then config order
            return (ms, c.measured_ms is None, i)

        return min(enumerate(pool), key=score)[1]

    def _fallbacks(self, installed: Callable) -> dict[str, list[str]]:
        """The other candidates' partitions that fell back while timed (those the
        installed placement shares are in its own records): label -> lines."""
        mine = set(map(id, _pieces(installed)))
        out: dict[str, list[str]] = {}
        for label, (_, pieces, _) in self._ready.items():
            lines = [f"partition {p.record.partition_id}: {f.from_backend} -> "
                     f"{f.to_backend} ({f.stage}: {f.reason})"
                     for p in pieces if id(p) not in mine for f in p.record.fallbacks]
            if lines:
                out[label] = lines
        return out

    def _held(self, chosen: Candidate) -> Candidate:
        """``chosen``, or with a ``margin`` the first candidate (the policy's own plan)
        unless ``chosen`` was measured faster than it by more than the margin."""
        first = self.candidates[0]
        if not self._margin or chosen is first or first.measured_ms is None \
                or not first.eligible or first.rejected:
            return chosen
        if chosen.measured_ms is not None \
                and chosen.measured_ms < first.measured_ms * (1 - self._margin):
            return chosen
        return first

    def _install(self, chosen: Candidate, per_part: dict) -> None:
        fn, records = self._build(chosen)
        plan = chosen.plan
        outcome = self._record.outcome
        outcome.measured_ms = {}
        for part in plan.partitions:
            names = tuple(n.name for n in part.nodes)
            got = {b: round(ms, 4) for (b, ns), ms in per_part.items() if ns == names}
            if got:
                outcome.measured_ms[part.id] = got
        outcome.candidates_ms = {label: (round(c.measured_ms, 4) if c.measured_ms is not None
                                         else None)
                                 for c in self.candidates for label in c.labels}
        outcome.spread_ms = {label: [round(v, 4) for v in c.spread_ms]
                             for c in self.candidates if c.spread_ms is not None
                             for label in c.labels}
        outcome.rounds = self._rounds_done
        outcome.confident = self._confident
        if self._tolerance is not None:
            outcome.tolerance = self._tolerance
            outcome.errors = {c.label: c.error for c in self.candidates
                              if c.lowered and c.error is not None}
            outcome.rejected = {c.label: c.rejected for c in self.candidates if c.rejected}
        outcome.chosen = chosen.label
        outcome.fallbacks = self._fallbacks(fn)
        self._ready.clear()  # the others' pieces are freed with them (the installed's stay)
        self._install_plan(plan, records)
        self.chosen = chosen
        self._fn = fn
        log.info("%s: policy %s%s chose %s%s", self._label, outcome.policy,
                 " (timed against eager)" if outcome.against_eager else "", chosen.label,
                 f" ({chosen.measured_ms:.3f} ms)" if chosen.measured_ms is not None else "")


def _distributed() -> Any:
    """``torch.distributed`` when a process group of more than one rank is up, else
    None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return dist


def _node_info(node: torch.fx.Node) -> NodeInfo:
    """What segmenting reads of a node: its module stack (Dynamo's ``nn_module_stack``,
    kept by AOTAutograd), a signature without names (op, output shapes and dtypes, the
    arguments that are not nodes) and the names of the compute nodes it reads."""
    stack = tuple((str(v[0]), getattr(v[1], "__qualname__", str(v[1])))
                  if isinstance(v, tuple) and len(v) == 2 else (str(k), "")
                  for k, v in (node.meta.get("nn_module_stack") or {}).items())
    if is_getitem(node):  # a getitem belongs with its producer
        stack = _node_info(node.args[0]).stack if isinstance(node.args[0], torch.fx.Node) \
            else stack
    vals = node.meta.get("val")
    vals = vals if isinstance(vals, (tuple, list)) else (vals,)
    outs = tuple((tuple(str(d) for d in v.shape), str(v.dtype))  # str: SymInts do not hash
                 if isinstance(v, torch.Tensor) else type(v).__name__ for v in vals)
    consts = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: "%")
    signature = (op_name(node.target), outs, repr(consts))
    inputs = tuple(n.name for n in node.all_input_nodes)
    return NodeInfo(node.name, stack, signature, inputs)


def _summary(segs: list[Segment], path: list[str]) -> str:
    """Which module classes went where: ``BertAttention x12 on onnxruntime, ...``."""
    groups: dict = {}
    for s, b in zip(segs, path):
        groups.setdefault((s.cls or "top level", b or "as planned"), 0)
        groups[(s.cls or "top level", b or "as planned")] += 1
    return ", ".join(f"{cls} x{n} on {b}" if n > 1 else f"{cls} on {b}"
                     for (cls, b), n in groups.items())


def _quartiles(xs: list[float]) -> tuple[float, float]:
    """(lower, upper) quartile; both the value itself for one sample."""
    if len(xs) < 2:
        return (xs[0], xs[0]) if xs else (math.nan, math.nan)
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return (q[0], q[2])


def _pieces(fn: Any) -> list:
    """The Piece objects a stitched GraphModule calls."""
    graph = getattr(fn, "graph", None)
    if graph is None:
        return []
    return [n.target for n in graph.nodes
            if n.op == "call_function" and isinstance(n.target, Piece)]
