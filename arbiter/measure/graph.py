"""``MeasuredGraph``: the callable standing for a graph whose policy asked for timing.

It stands for one graph whose ``Choice.timed`` (a ``TimedChoice``) asks for timing on
the first call, until that call decides: there the inputs are real (``_compile_graph``
sees FakeTensor metadata only; random inputs break token ids and data-dependent paths)
and the pieces compile anyway. On that call it asks the decision cache (``decision``),
else compiles, warms up and times the candidates (``timing``), lower-precision ones
accepted first (``precision``), with the mixed candidate (``mix``) and refinement
(``refine``) when the policy's search is on; then picks and installs the winner
(``winner``) and stores the decision. Under torch.distributed rank 0 decides and
broadcasts. A graph that writes its inputs runs on private copies while measuring
(``rerun``), and torch's RNG state is restored afterwards. docs/policies.md
("`measure`") has the steps.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.fx

from ..cache import Cache
from ..ops import without_first_call_checks
from ..plan.partition import Plan
from ..plan.planner import Planner
from ..plan.policy import ONLY, PRIORITY, Candidate, TimedChoice
from ..run.piece import PieceRecord
from ..run.record import GraphRecord
from . import decision, tune
from .decision import Decision, DecisionCache
from .drift import watch
from .mix import MIX, Mixer
from .permodule import PRECISION, PrecisionOutcome, PrecisionSearch, steered_lowered
from .precision import Acceptance
from .refine import Refiner, steered_plan
from .rerun import Rerun
from .timing import Build, Timing
from .winner import held, pick, record_outcome

log = logging.getLogger(__name__)

#: `measure`'s first call stays within this many times the compiles it needs (the
#: candidates' compiles and warm-ups through arbiter, 1.3-1.7x the single backends' own
#: compiles on DistilBERT and T5: arbiter's export path, first-use checks, eager's
#: warm-up, a `priority` placement no single backend has): the
#: search after the whole-graph candidates (mixing, refinement) starts no compile past
#: what is left of it (``search_limit``; docs/policies.md, "Compile bound").
SEARCH_FACTOR = 1.5
#: A graph whose candidates compiled in less than this still gets this much search (a
#: few seconds, next to a process's own start, on graphs that compile in a moment).
SEARCH_MIN_S = 5.0


def search_limit(took: float, compiled: float, before: float) -> float:
    """Seconds into measuring past which the search begins nothing: ``SEARCH_FACTOR``
    times ``compiled`` (the candidates' compiles and warm-ups), less ``before`` (arbiter's
    work on the graph before its first call: AOTAutograd's trace, planning), so the whole
    first call stays within the factor; ``took`` (what measuring has taken so far) when
    nothing is left, and at least ``SEARCH_MIN_S`` of search when the compiles took less
    than that."""
    bound = SEARCH_FACTOR * compiled - before
    if compiled < SEARCH_MIN_S:
        bound = max(bound, took + SEARCH_MIN_S)
    return max(took, bound)


@dataclass(frozen=True)
class GraphToMeasure:
    """One graph as the Arbiter hands it to the measuring wing."""

    gm: torch.fx.GraphModule
    record: GraphRecord
    label: str
    build: Build  # candidate -> (stitched callable, records); pieces shared
    install: Callable[[Plan, dict[int, PieceRecord]], None]  # the chosen plan, on the record
    before_s: float = 0.0  # arbiter's work on it before its first call (trace, planning)


def fell_back(timing: Timing, cand: Candidate) -> bool:
    """Whether ``cand``'s partitions fell back to another backend while it warmed up:
    timed, it would race what its fallbacks run, not its placement (a prefill whose
    OpenVINO partition failed its check raced eager against eager, and ONNX Runtime,
    predicted next, was never timed), so the reserve's best is timed beside it."""
    ready = timing.ready.get(cand.label)
    return ready is not None and any(f.to_backend != f.from_backend for p in ready.pieces
                                     for f in p.record.fallbacks)


class MeasuredGraph:
    """Callable standing for one graph until its first call has chosen; see the module
    docstring."""

    def __init__(self, timed: TimedChoice, graph: GraphToMeasure, planner: Planner,
                 options: Any, cache: Optional[Cache], accuracy: Any = None,
                 per_module: bool = False):
        """``options``: the config's ``measure`` options (mixing and refinement only when
        ``timed.search``); ``accuracy``: the config's tolerance (rtol, atol) for
        lower-precision candidates (``Candidate.lowered``); ``per_module``: the graph may
        run lowered module by module (permodule.py: config `accuracy`, an inference graph
        of static shapes, a variant offered)."""
        if not timed.search:
            options = options.model_copy(update={"refine": False, "mix": False})
        self._graph = graph
        self._planner = planner
        self._opts = options
        self._cache = cache
        self.candidates = list(timed.candidates)  # refined and mixed ones join these
        self._reserve = list(timed.reserve)  # timed in the place of one that fell back
        self._margin = timed.margin  # the policy's own plan gives way only past this
        self._label = graph.label
        self._rerun = Rerun(graph.gm)  # re-runs of a graph that writes its inputs
        self._timing = Timing(options, self._rerun.build(graph.build), graph.label)
        self._acceptance = Acceptance(graph.gm, accuracy, graph.build, graph.label)
        self._accuracy = accuracy
        self._per_module = per_module
        self._calibration: list[tune.Sample] = []  # inside arbiter.tune
        self._precision: Optional[PrecisionOutcome] = None
        self._lock = threading.Lock()
        self._fn: Callable = self._first_call
        self.chosen: Optional[Candidate] = None
        self.from_cache = False
        self.__name__ = f"measured_{graph.label}"

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)

    def _first_call(self, *args: Any) -> Any:
        session = tune.current()
        if session is not None:
            with self._lock:
                if self.chosen is None:  # inside arbiter.tune: a sample, decided later
                    session.met(self)
                    sample = self._acceptance.sample(tune.keep(args))
                    self._calibration.append(sample)
                    return tuple(sample.ref)
        with self._lock:
            if self.chosen is None:
                group = decision.process_group()
                if group is None:
                    self._choose(args)
                else:
                    self._choose_distributed(args, group)
        return self._fn(*args)

    def decide_calibrated(self) -> None:
        """After ``arbiter.tune``'s batches: decide on the samples they left, the
        held-out share (``accuracy.holdout``) kept from the search (tune.py)."""
        with self._lock:
            samples, self._calibration = self._calibration, []
            if self.chosen is not None or not samples:
                return
            share = float(self._accuracy.holdout) if self._accuracy is not None else 0.0
            held = min(len(samples) - 1, int(len(samples) * share)) if share else 0
            if share and held == 0 and len(samples) > 1:
                held = 1
            acc = self._acceptance
            acc.samples, acc.holdout = samples[:len(samples) - held], samples[len(samples) - held:]
            log.info("%s: deciding on %d calibration input(s), %d held out", self._label,
                     len(acc.samples), len(acc.holdout))
            group = decision.process_group()
            if group is None:
                self._choose(acc.samples[0].args)
            else:
                self._choose_distributed(acc.samples[0].args, group)

    # -- the decision ---------------------------------------------------------------
    def _choose_distributed(self, args: Sequence[Any], group: Any) -> None:
        """Rank 0 decides (cache or timing, as alone) and broadcasts its decision; the
        other ranks install it untimed. A rank 0 whose candidates fail to compile still
        broadcasts (measuring catches those failures); a process that dies leaves the
        others in the broadcast until the process group's timeout."""
        outcome = self._graph.record.outcome
        outcome.rank, outcome.world_size = group.get_rank(), group.get_world_size()
        if group.get_rank() == 0:
            self._choose(args)
            decision.send(group, Decision.of(self.chosen, self.candidates, self._graph.gm))
            outcome.broadcast = "rank 0: broadcast"
            return
        raw = decision.receive(group)
        if not self._apply(raw):
            raise RuntimeError(f"{self._label}: rank 0's decision {raw!r} names no "
                               "candidate of this rank's graph (the ranks' graphs differ)")
        outcome.broadcast = "from rank 0"
        log.info("%s: measured decision from rank 0: %s", self._label, self.chosen.label)

    def _choose(self, args: Sequence[Any]) -> None:
        entry = DecisionCache.for_graph(self._cache, self._planner, self._opts,
                                        self._graph.gm, args)
        if entry is not None:
            hit = entry.get()
            applied = self._apply(hit, args)
            if applied:
                self.from_cache = True
                log.info("%s: measured decision from the cache: %s", self._label,
                         self.chosen.label)
                return
            if hit is not None and applied is False:
                log.warning("%s: cached decision %r names no candidate of this graph; "
                            "measuring again", self._label,
                            hit.get("label") if isinstance(hit, dict) else None)
        self._measure(args)
        if self._planner.observe is not None:  # measured: correct later predictions
            self._planner.observe(self.candidates, ONLY)
        chosen = self._held(self._pick())
        self._install(chosen)
        if entry is not None:
            entry.put(Decision.of(chosen, self.candidates, self._graph.gm))

    def _apply(self, raw: Any, args: Optional[Sequence[Any]] = None) -> Optional[bool]:
        """Install a decision (the cache's, or rank 0's) when it names a candidate of
        this graph (a refined or mixed one is rebuilt from its node -> backend map):
        True. False when it names none; None when it names a lower-precision candidate
        outside the accuracy tolerance on ``args`` (never taken on trust: this call's
        inputs decide)."""
        hit = Decision.from_json(raw)
        chosen = None if hit is None else self._candidate(hit)
        if chosen is None:
            return False
        if chosen.lowered and args is not None and not self._acceptance.accept(chosen, args):
            log.warning("%s: decision %r is not within the accuracy tolerance on these "
                        "inputs (%s); measuring again", self._label, hit.label,
                        chosen.rejected)
            return None
        for c in self.candidates:
            c.measured_ms = hit.measured_ms.get(c.label)
        self._install(chosen)
        return True

    def _candidate(self, hit: Decision) -> Optional[Candidate]:
        """The candidate ``hit`` names; a placement none of them is (refined, mixed) is
        rebuilt from its node -> backend map and joins the candidates."""
        for c in reversed(self.candidates):
            if c.label == hit.label:
                return c
        if hit.steer is None:
            return None
        steer = hit.steer_by_name(self._graph.gm)
        if any(b in self._planner.variants for b in steer.values()):  # per module
            plan, lowered = steered_lowered(self._planner, self._graph.gm,
                                            self.candidates[0].plan, steer)
        else:
            plan, lowered = self._steered(steer), ()
        rebuilt = Candidate(hit.label, plan, 0.0, steer=steer, lowered=lowered)
        self.candidates.append(rebuilt)
        return rebuilt

    def _steered(self, prefer: dict[str, str]) -> Plan:
        return steered_plan(self._planner, self._graph.gm, self.candidates[0].plan, prefer)

    # -- measuring ------------------------------------------------------------------
    def _measure(self, args: Sequence[Any]) -> None:
        """Time candidates within the budget: the policy's, then (its search on) the
        mixed one and refinement."""
        opts = self._opts
        args = self._rerun.begin(args)  # private copies of what the graph writes
        self._timing.begin()
        # Priority first (always measured: it is what the user gets without measuring),
        # then the others by estimate, cheapest first, so the budget goes to the likeliest.
        order = sorted(self.candidates, key=lambda c: (c.label != PRIORITY, c.estimate_ms))
        with torch.random.fork_rng(devices=[]), without_first_call_checks():
            self._measure_candidates(order, args)
            if getattr(opts, "mix", False) or opts.refine:
                took = self._timing.elapsed()
                self._timing.limit_s = search_limit(took, self._timing.compiled_s,
                                                    self._graph.before_s)
                log.info("%s: the whole-graph candidates took %.1f s (compiles and warm-ups "
                         "%.1f s, %.1f s before measuring); mixing and refinement start "
                         "nothing past %.1f s", self._label, took, self._timing.compiled_s,
                         self._graph.before_s, self._timing.budget_s)
            if getattr(opts, "mix", False):
                self._mix(args)
            if opts.refine:
                Refiner(self._planner, self._graph.gm, self.candidates, self._timing,
                        self._label).run(self._pick(lowered=False), args)
            self._search_precision(args)
        log.info("%s: measured %s", self._label, ", ".join(
            f"{c.label} {c.measured_ms:.3f} ms" if c.measured_ms is not None
            else f"{c.label} (refused: {c.rejected})" if c.rejected
            else f"{c.label} (estimate {c.estimate_ms:.3f} ms)" for c in self.candidates))

    def _measure_candidates(self, order: list[Candidate], args: list) -> None:
        """Compile and warm up every candidate the budget allows (priority always), then
        time them in interleaved rounds."""
        timing = self._timing
        ready = []
        for k, cand in enumerate(order):
            elapsed = timing.elapsed()
            if cand.label != PRIORITY and elapsed > self._opts.time_budget_s:
                log.info("%s: measure budget %.1f s spent; %d candidate(s) left to the "
                         "cost estimate", self._label, self._opts.time_budget_s,
                         len(order) - k)
                break
            timing.progress(f"{self._label}: warming up candidate {k + 1} of {len(order)} "
                            f"({cand.label}; a first call compiles what it has to), "
                            f"{elapsed:.1f} s into measuring", elapsed)
            if cand.lowered and not self._acceptance.accept(cand, args):
                continue  # outside the tolerance: never timed, never chosen
            if cand.label == PRIORITY:
                timing.prepare(cand, args)  # what policy priority runs: its failure is real
            elif not timing.tried(cand, lambda c=cand: timing.prepare(c, args)):
                continue
            ready.append(cand)
            if self._reserve and fell_back(timing, cand):
                stand_in = self._reserve.pop(0)  # timed beside it: see fell_back
                self.candidates.append(stand_in)
                order.append(stand_in)
                log.info("%s: candidate %s fell back while warming up; %s is timed in its "
                         "place too", self._label, cand.label, stand_in.label)
        timing.rounds(ready, args, confident_stop=True)

    def _mix(self, args: list) -> None:
        """The mixed candidate; its failure leaves the whole-graph choice standing."""
        mixer = Mixer(self._planner, self._graph.gm, self.candidates, self._timing,
                      self._label)
        try:
            mixer.run(self._pick(lowered=False), args)
        except Exception as exc:  # noqa: BLE001 - the whole-graph choice stands
            log.warning("%s: mixing at module boundaries failed (%s: %s); choosing "
                        "among the other candidates", self._label,
                        type(exc).__name__, exc, exc_info=True)
            for c in self.candidates:  # never chosen by its estimate alone
                if c.label.startswith(MIX) and c.measured_ms is None:
                    c.eligible = False
        if mixer.times is not None:
            self._graph.record.outcome.mix = mixer.times

    def _search_precision(self, args: list) -> None:
        """Config `accuracy` (``per_module``): precision module by module
        (permodule.py); its failure leaves the whole-graph choice standing."""
        acc = self._accuracy
        if acc is None or not self._per_module:
            return
        self._acceptance.ensure(args)
        search = PrecisionSearch(self._planner, self._graph.gm, self.candidates,
                                 self._timing, self._acceptance, acc, self._label)
        try:
            search.run(self._pick(lowered=False), args)
        except Exception as exc:  # noqa: BLE001 - the whole-graph choice stands
            log.warning("%s: the per-module precision search failed (%s: %s); choosing "
                        "among the other candidates", self._label, type(exc).__name__, exc,
                        exc_info=True)
            for c in self.candidates:
                if c.label.startswith(PRECISION) and c.measured_ms is None:
                    c.eligible = False
        self._precision = search.outcome

    # -- the winner -----------------------------------------------------------------
    def _pick(self, lowered: bool = True) -> Optional[Candidate]:
        return pick(self.candidates, lowered)

    def _held(self, chosen: Candidate) -> Candidate:
        return held(self.candidates, chosen, self._margin)

    def _install(self, chosen: Candidate) -> None:
        fn, records = self._graph.build(chosen)
        outcome = self._graph.record.outcome
        record_outcome(outcome, chosen, self.candidates, self._timing,
                       self._acceptance.tolerance, fn)
        if self._accuracy is not None:
            fn, outcome.precision = watch(fn, chosen.lowered, self._acceptance,
                                          self._accuracy, self._precision, self._label)
            self._record_precision(outcome.precision, chosen)
        self._timing.ready.clear()  # the others' pieces are freed with them (the installed's stay)
        self._graph.install(chosen.plan, records)
        self.chosen = chosen
        self._fn = fn
        log.info("%s: policy %s%s chose %s%s", self._label, outcome.policy,
                 " (timed against eager)" if outcome.against_eager else "", chosen.label,
                 f" ({chosen.measured_ms:.3f} ms)" if chosen.measured_ms is not None else "")

    def _record_precision(self, out: PrecisionOutcome, chosen: Candidate) -> None:
        """What the report says of lower precision beside the errors: every lowered
        candidate's measures, the speed of the chosen against the best float32 one."""
        out.measures = {label: j.as_dict() for label, j in self._acceptance.judgements.items()}
        out.bound = self._acceptance.bound.words if self._acceptance.bound else ""
        f32 = pick(self.candidates, lowered=False)
        if f32 is not None and f32.measured_ms is not None:
            out.f32, out.f32_ms = f32.label, round(f32.measured_ms, 4)
        if chosen.measured_ms is not None:
            out.chosen_ms = round(chosen.measured_ms, 4)
        held = self._acceptance.held.get(chosen.label)
        out.holdout = None if held is None else held.as_dict()
