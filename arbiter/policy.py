"""Candidate placements of one graph, and policy `cost`'s choice among them.

The candidates are whole-graph plans, each made by the linear partitioner:

* ``priority``: the config's order (what policy `priority` runs);
* ``only <backend>``: for every available compiled backend, that backend alone with the
  fallback (eager) for what it cannot run; and ``only eager``: the fallback alone.

Every single-backend placement is a candidate, so a policy choosing the cheapest of them
(`cost`) or the fastest measured end to end (`measure`, see ``measure.py``) never picks
something slower than the best single backend by its own yardstick; boundary costs are in
the yardstick (the cost model counts crossings; an end-to-end timing includes them).
A plan equal to an earlier candidate (``as_lists`` equal) is not kept twice: its label
goes to the earlier one's ``also``, so nothing is compiled or timed twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import torch.fx

from .capability import CapabilityTable
from .cost import plan_ms
from .partition import Plan, partition_graph

if TYPE_CHECKING:
    from .arbiter import Arbiter

PRIORITY = "priority"
ONLY = "only "


@dataclass
class Candidate:
    label: str
    plan: Plan
    estimate_ms: float
    measured_ms: Optional[float] = None  # median of an end-to-end timing, when measured
    also: list[str] = field(default_factory=list)  # labels of candidates equal to this one
    steer: Optional[dict] = None  # refined placements: node name -> backend (measure.py)
    eligible: bool = True  # False: a refinement step that did not beat its base enough

    @property
    def labels(self) -> list[str]:
        return [self.label, *self.also]


def candidates(arb: "Arbiter", gm: torch.fx.GraphModule) -> list[Candidate]:
    """The priority plan first, then each single-backend plan; each with its estimate."""
    plans: list[tuple[str, Plan]] = [(PRIORITY, arb.plan(gm))]
    names = list(arb.backends)
    fallback = arb.backends[names[-1]]
    for name, backend in arb.backends.items():
        if backend.inline_aten or name in arb.unavailable or name == fallback.name:
            continue
        table = CapabilityTable([backend, fallback], exclude_ops=arb.config.exclude_ops,
                                pin=arb.config.pin, unavailable=arb.unavailable)
        plans.append((ONLY + name, partition_graph(gm, table, arb.config.min_block_size)))
    # The fallback alone (eager) is a single-backend placement too, and the fastest on
    # tiny graphs where every compiled backend's per-call cost dominates (seed MLP).
    alone = CapabilityTable([fallback])
    plans.append((ONLY + fallback.name, partition_graph(gm, alone, arb.config.min_block_size)))
    inline = {n for n, b in arb.backends.items() if b.inline_aten}
    out: list[Candidate] = []
    seen: dict = {}
    for label, plan in plans:
        key = tuple((b, tuple(names_)) for b, names_ in plan.as_lists())
        if key in seen:
            seen[key].also.append(label)
            continue
        seen[key] = Candidate(label, plan, plan_ms(plan, inline))
        out.append(seen[key])
    return out


def choose_by_cost(cands: list[Candidate]) -> Candidate:
    """The candidate with the lowest estimate; ties go to the earlier (priority first)."""
    return min(enumerate(cands), key=lambda ic: (ic[1].estimate_ms, ic[0]))[1]
