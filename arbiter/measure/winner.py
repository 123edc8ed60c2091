"""The winner: which candidate is installed, and what the graph's outcome keeps of the race.

* ``pick``: the fastest eligible candidate, measured or else estimated (the estimates
  scaled by the median measured/estimated ratio of the measured ones; a measured one wins
  a tie, then config order); a lower-precision one only when measured (it was accepted
  then).
* ``held``: with a policy's margin (config `against_eager`), the policy's own plan stays
  unless the pick was measured faster than it by more than the margin.
* ``record_outcome``: the outcome of the race on the graph's ``PolicyOutcome`` (every
  candidate's median and quartiles, per-partition times, rounds, whether the winner was
  apart, the lower-precision errors and refusals, the placements that fell back while
  timed).
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Optional

from ..plan.partition import Plan
from ..plan.policy import Candidate, PolicyOutcome
from .timing import Timing, pieces_of


def pick(candidates: Sequence[Candidate], lowered: bool = True) -> Optional[Candidate]:
    """The fastest eligible candidate, measured or else estimated (a lower-precision
    one only when measured: it was accepted then); ``lowered=False``: at the graph's
    own precision only."""
    measured = [c for c in candidates if c.measured_ms is not None]
    pool = [c for c in candidates if c.eligible and not c.rejected
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


def held(candidates: Sequence[Candidate], chosen: Candidate, margin: float) -> Candidate:
    """``chosen``, or with a ``margin`` the first candidate (the policy's own plan)
    unless ``chosen`` was measured faster than it by more than the margin."""
    first = candidates[0]
    if not margin or chosen is first or first.measured_ms is None \
            or not first.eligible or first.rejected:
        return chosen
    if chosen.measured_ms is not None \
            and chosen.measured_ms < first.measured_ms * (1 - margin):
        return chosen
    return first


def record_outcome(outcome: PolicyOutcome, chosen: Candidate,
                   candidates: Sequence[Candidate], timing: Timing,
                   tolerance: Optional[tuple[float, float]], installed: Callable) -> None:
    """What ``outcome`` keeps of the race that ``chosen`` won (``installed``: its
    stitched callable)."""
    plan: Plan = chosen.plan
    outcome.measured_ms = {}
    for part in plan.partitions:
        names = tuple(n.name for n in part.nodes)
        got = {b: round(ms, 4) for (b, ns), ms in timing.part_ms.items() if ns == names}
        if got:
            outcome.measured_ms[part.id] = got
    outcome.candidates_ms = {label: (round(c.measured_ms, 4) if c.measured_ms is not None
                                     else None)
                             for c in candidates for label in c.labels}
    outcome.spread_ms = {label: [round(v, 4) for v in c.spread_ms]
                         for c in candidates if c.spread_ms is not None
                         for label in c.labels}
    outcome.rounds = timing.rounds_done
    outcome.confident = timing.confident
    if tolerance is not None:
        outcome.tolerance = tolerance
        outcome.errors = {c.label: c.error for c in candidates
                          if c.lowered and c.error is not None}
        outcome.rejected = {c.label: c.rejected for c in candidates if c.rejected}
    outcome.chosen = chosen.label
    outcome.fallbacks = fallbacks(timing, installed)


def fallbacks(timing: Timing, installed: Callable) -> dict[str, list[str]]:
    """The other candidates' partitions that fell back while timed (those the
    installed placement shares are in its own records): label -> lines."""
    mine = set(map(id, pieces_of(installed)))
    out: dict[str, list[str]] = {}
    for label, ready in timing.ready.items():
        lines = [f"partition {p.record.partition_id}: {f.from_backend} -> "
                 f"{f.to_backend} ({f.stage}: {f.reason})"
                 for p in ready.pieces if id(p) not in mine for f in p.record.fallbacks]
        if lines:
            out[label] = lines
    return out
