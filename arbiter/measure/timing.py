"""The timing service: candidates go in, times come out.

As Inductor's ``autotune_process`` takes choices and returns a time per choice (a choice
that fails to run is out of the race, not an error of the compile), ``Timing`` takes
``Candidate`` placements, builds each through the ``build`` it was given (pieces shared
between candidates), warms it up and times it, and leaves its median and quartiles on
the candidate (``measured_ms``, ``spread_ms``). It decides the samples (at least
``SAMPLE_S`` of calls), the interleaved rounds (rotating order), when to stop (apart,
``FAR_APART``, ``max_repeats``, the budget), which candidates are not timed again
(``FAR_BEHIND``), whether a challenger beats the best by a margin twice (``beats``), and
keeps each candidate's compile time (``prepare_s``) and each partition's own time
(``part_ms``). docs/policies.md ("`measure`") gives the rules and their reasons.
"""
from __future__ import annotations

import logging
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import describe
from ..plan.policy import Candidate
from ..run.piece import Piece, PieceRecord
from .rerun import restore_seconds

log = logging.getLogger(__name__)

#: Work longer than this shows a progress line on stderr (logging has it at INFO anyway).
PROGRESS_AFTER_S = 2.0
#: From the third timing round, a candidate whose fastest sample is this many times the
#: fastest candidate's slowest is not timed again.
FAR_BEHIND = 1.5
#: After two rounds, timing stops when the fastest candidate's slowest sample times this
#: is below every other candidate's fastest sample: no later round can change the choice
#: (BERT-base: OpenVINO at 77 ms against eager's 106 ms; three more rounds were 0.55 s of
#: its first call).
FAR_APART = 1.15
#: One timing sample lasts at least this long (several calls of a fast graph).
SAMPLE_S = 0.002
#: At most this many calls make one sample.
MAX_INNER = 50
#: Untimed calls before each sample. Interleaved, a sample follows another candidate's,
#: whose threads may still spin (OpenMP's, a session's pool) or whose data filled the
#: caches: without one, the PT2E MLP's ONNX Runtime plan (0.45 ms a call on its own) was
#: timed at 0.6-4.7 ms in three first calls and lost twice to plans twice its time; with
#: one, 0.36-0.71 ms, ahead all three times (Intel Xeon VM, bench/README.md).
LEAD_IN = 1
#: ... for candidates whose call takes less than this. What the lead-in takes (threads
#: still spinning after the previous candidate, about a millisecond at most since
#: spinning sessions stop when their run returns; caches) is a few percent of a call this
#: long or longer, while a lead-in call doubles such a sample's cost: a BERT-style
#: training step's forward (two candidates at ~350 ms a call, 15 rounds) spent 22 s of
#: its first step timing with lead-ins (Intel Xeon VM, 2026-11-29), half of it on them.
LEAD_IN_UNDER_S = 0.05

#: How a candidate becomes a callable: its stitched graph and its pieces' records, the
#: pieces shared with the other candidates of the graph.
Build = Callable[[Candidate], tuple[Callable, dict[int, PieceRecord]]]
#: A partition as the report keys its timings: (backend, node names).
PartKey = tuple[str, tuple[str, ...]]


@dataclass
class Ready:
    """A candidate built and warmed up: what one of its samples calls."""

    fn: Callable
    pieces: list[Piece]
    inner: int  # calls per sample
    lead_in: int = LEAD_IN  # untimed calls before each sample


class Timing:
    """The timing of one graph's candidates on its first call (see the module
    docstring). ``options``: the config's ``measure`` options."""

    def __init__(self, options: Any, build: Build, label: str):
        self.options = options
        self.build = build
        self._label = label
        self.ready: dict[str, Ready] = {}  # label -> built and warmed up
        self.samples: dict[str, list[float]] = {}  # label -> ms per call, per sample
        self.part_ms: dict[PartKey, float] = {}
        self.rounds_done = 0
        self.prepare_s: dict[str, float] = {}  # label -> seconds of compile and warm-up
        self.compiled_s = 0.0  # the candidates' compiles and warm-ups, each counted once
        self.limit_s: Optional[float] = None  # lowers time_budget_s (the search's share)
        self.confident: Optional[bool] = None  # the winner apart from every other
        self._start = time.perf_counter()
        self._shown_at = 0.0  # when the last progress line was printed

    # -- the budget ----------------------------------------------------------------
    def begin(self) -> None:
        """Start the clock of ``time_budget_s`` (compiles included)."""
        self._start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self._start

    @property
    def budget_s(self) -> float:
        """``time_budget_s``, or ``limit_s`` when that is lower."""
        b = self.options.time_budget_s
        return b if self.limit_s is None else min(b, self.limit_s)

    def spent(self) -> bool:
        return self.elapsed() > self.budget_s

    def progress(self, msg: str, elapsed: float) -> None:
        """INFO always; past PROGRESS_AFTER_S also a whole line on stderr, at most one
        every PROGRESS_AFTER_S (a whole line: log lines never land inside it)."""
        log.info(msg)
        if self.options.progress and elapsed > PROGRESS_AFTER_S \
                and elapsed - self._shown_at >= PROGRESS_AFTER_S:
            print(f"arbiter: {msg}", file=sys.stderr, flush=True)
            self._shown_at = elapsed

    # -- candidates in -------------------------------------------------------------
    def prepare(self, cand: Candidate, args: list) -> None:
        """Build ``cand`` (pieces shared with the other candidates), run its warm-up calls
        (the first compiles) and pick how many calls one timing sample takes."""
        if cand.label in self.ready:
            return
        start = time.perf_counter()
        fn, _ = self.build(cand)
        # The first call compiles; it is never timed, whatever `warmup` says. The last
        # warm-up call (a second call at least) sizes the samples.
        for _ in range(max(1, self.options.warmup - 1)):
            fn(*args)
        t0 = time.perf_counter()
        fn(*args)
        once = time.perf_counter() - t0
        if once < LEAD_IN_UNDER_S:
            # a short call is timed once more and the faster kept: a second call still
            # does first calls' work (output devices checked, layouts learned, a check's
            # second call), and sized by it a decode step of 0.6 ms took one call per
            # sample, two samples deciding its placement
            t0 = time.perf_counter()
            fn(*args)
            once = min(once, time.perf_counter() - t0)
        # a sample of at least SAMPLE_S: a single call of a microsecond graph is noise
        inner = max(1, min(MAX_INNER, int(SAMPLE_S / max(once, 1e-9))))
        self.ready[cand.label] = Ready(fn, pieces_of(fn), inner, lead_in(once))
        took = time.perf_counter() - start
        self.compiled_s += took
        for label in cand.labels:
            self.prepare_s[label] = took
        self.samples.setdefault(cand.label, [])

    def tried(self, cand: Candidate, run: Callable[[], None]) -> bool:
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
            self.ready.pop(cand.label, None)
            return False

    # -- times out -----------------------------------------------------------------
    def rounds(self, cands: list[Candidate], args: list, confident_stop: bool) -> None:
        """Time ``cands`` (prepared) in interleaved rounds (each round times each once, the
        order rotating), so that load and thermal drift fall on all alike. At least
        ``repeats`` rounds; then, with ``confident_stop``, more until the fastest one's
        upper quartile is below every other's lower quartile, up to ``max_repeats``
        rounds or the budget. With ``confident_stop``, fewer than ``repeats`` where two
        rounds already set the fastest FAR_APART from the others (``far_apart``). Each
        candidate's ``measured_ms`` is the median of all its samples so far."""
        opts = self.options
        if not cands:
            return
        part_samples: dict[Piece, list[float]] = {}
        timing = cands
        for r in range(max(opts.repeats, opts.max_repeats)):
            if r >= opts.repeats and (not confident_stop or self.separated(cands)):
                break
            if confident_stop and r >= 2 and self.far_apart(cands):
                break
            if confident_stop and r >= 2:
                # only what is still undecided is timed again: from the third round a
                # candidate whose fastest sample is FAR_BEHIND times the fastest's slowest,
                # and past `repeats` one apart from the fastest (quartiles), cannot change
                # the ranking, and timing it again would spend the budget (eager and
                # Inductor at 4-6x on BERT-base under load: 15 rounds, the whole budget)
                timing = self.undecided(cands, apart=r >= opts.repeats)
            shift = r % len(timing)
            for cand in timing[shift:] + timing[:shift]:
                ready = self.ready[cand.label]
                # untimed calls first (``LEAD_IN``: they take what the previous candidate
                # left behind); the pieces' own times start after them
                for _ in range(ready.lead_in):
                    ready.fn(*args)
                for p in ready.pieces:
                    p.timed = True
                before = {p: p.record.run_s for p in ready.pieces}
                self.samples[cand.label].append(self.sample(cand, ready.fn, ready.inner, args))
                for p in ready.pieces:
                    p.timed = False
                    part_samples.setdefault(p, []).append(
                        (p.record.run_s - before[p]) * 1e3 / ready.inner)
            self.rounds_done = max(self.rounds_done, r + 1)
            if self.spent():
                break  # out of budget: fewer rounds beat none
        for p, xs in part_samples.items():
            self.part_ms[(p.record.backend, p.node_names)] = statistics.median(xs)
        for cand in cands:
            xs = self.samples[cand.label]
            cand.measured_ms = statistics.median(xs)
            cand.spread_ms = quartiles(xs)
        self.confident = self.separated(cands)

    @staticmethod
    def sample(cand: Candidate, fn: Callable, inner: int, args: list) -> float:
        """One timing sample of ``cand``: milliseconds per call over ``inner`` calls
        (the restores of a graph that writes its inputs left out: rerun.py). ``rounds``
        makes the lead-in calls before it."""
        return ms_per_call(fn, inner, args)

    def time_one(self, cand: Candidate, args: list) -> None:
        """One candidate on its own (a refinement step's first timing)."""
        self.prepare(cand, args)
        self.rounds([cand], args, confident_stop=False)

    def beats(self, cand: Candidate, best: Candidate, args: list, margin: float) -> bool:
        """Whether ``cand`` (a refinement step, the mixed candidate) beats the best so far
        by more than ``margin``, in its first interleaved timing and again when both are
        timed once more: a challenger must win twice. On graphs of microseconds one
        timing's noise exceeds the margin (a test backend's graph moved one op to eager on
        noise alone in 5 of 12 runs before this rule)."""
        if not cand.measured_ms < best.measured_ms * (1 - margin):
            return False
        self.samples[cand.label] = []
        self.samples[best.label] = []
        self.rounds([best, cand], args, confident_stop=False)
        return cand.measured_ms < best.measured_ms * (1 - margin)

    def undecided(self, cands: list[Candidate], apart: bool) -> list[Candidate]:
        """The fastest candidate by median and the others still in the race (``cands``
        order): not FAR_BEHIND (fastest sample over FAR_BEHIND times the fastest one's
        slowest) and, with ``apart``, with a lower quartile not above its upper one."""
        samples = {c.label: self.samples[c.label] for c in cands
                   if len(self.samples[c.label]) >= 2}
        if len(samples) < 2:
            return cands
        best = min(samples, key=lambda k: statistics.median(samples[k]))
        best_hi = quartiles(samples[best])[1]
        worst = max(samples[best])

        def live(c: Candidate) -> bool:
            xs = samples.get(c.label)
            if xs is None or c.label == best:
                return True
            return min(xs) <= FAR_BEHIND * worst and (not apart or quartiles(xs)[0] <= best_hi)

        return [c for c in cands if live(c)]

    def far_apart(self, cands: list[Candidate]) -> bool:
        """Whether every candidate has two samples or more and the fastest's slowest
        sample, times FAR_APART, is below every other's fastest."""
        xs = [self.samples[c.label] for c in cands]
        if len(xs) < 2 or any(len(x) < 2 for x in xs):
            return False
        best = min(xs, key=statistics.median)
        return all(FAR_APART * max(best) < min(x) for x in xs if x is not best)

    def separated(self, cands: list[Candidate]) -> bool:
        """Whether the fastest candidate's samples are clearly apart from every other's:
        its upper quartile below their lower quartiles."""
        stats = [(statistics.median(xs), quartiles(xs)) for xs in
                 (self.samples[c.label] for c in cands) if len(xs) >= 2]
        if len(stats) < 2:
            return True
        stats.sort()
        best_hi = stats[0][1][1]
        return all(best_hi < lo for _, (lo, _) in stats[1:])


def lead_in(once: float) -> int:
    """Untimed calls before each sample of a callable whose call took ``once`` seconds:
    ``LEAD_IN``, none from ``LEAD_IN_UNDER_S``."""
    return LEAD_IN if once < LEAD_IN_UNDER_S else 0


def ms_per_call(fn: Callable, inner: int, args: list) -> float:
    """Milliseconds per call of ``fn`` over ``inner`` calls, the restores of a graph that
    writes its inputs left out (rerun.py)."""
    restored = restore_seconds(fn)
    t0 = time.perf_counter()
    for _ in range(inner):
        fn(*args)
    took = time.perf_counter() - t0 - (restore_seconds(fn) - restored)
    return took * 1e3 / inner


def quartiles(xs: Sequence[float]) -> tuple[float, float]:
    """(lower, upper) quartile; both the value itself for one sample."""
    if len(xs) < 2:
        return (xs[0], xs[0]) if xs else (math.nan, math.nan)
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return (q[0], q[2])


def pieces_of(fn: Any) -> list[Piece]:
    """The Piece objects a stitched GraphModule calls."""
    graph = getattr(fn, "graph", None)
    if graph is None:
        return []
    return [n.target for n in graph.nodes
            if n.op == "call_function" and isinstance(n.target, Piece)]
