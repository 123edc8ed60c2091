"""Refinement (Collage-style, docs/policies.md "Refinement"): from the best measured
placement, move one partition at a time (the whole partition, then each op of it alone)
to another backend able to run all of it; a move is kept when the whole graph gets
faster by more than ``REFINE_MARGIN`` twice (``Timing.beats``: timings here are noisy).

Every move is a placement made by the partitioner through ``steered_plan`` (each named
node's preferred backend first among those able to run it, so acyclicity and
``min_block_size`` hold as always); mixing at module boundaries and the decision cache
(a refined placement rebuilt in another process) make theirs the same way.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch.fx

from ..ops import is_getitem, op_name
from ..plan.cost import load_table, node_us, plan_ms
from ..plan.partition import Plan
from ..plan.planner import Planner
from ..plan.policy import Candidate, plan_key
from ..plan.support import FixedSupport, Preferred
from .timing import Timing

log = logging.getLogger(__name__)

#: A refinement step is kept only when it beats the best so far by more than this.
REFINE_MARGIN = 0.03


def steered_plan(planner: Planner, gm: torch.fx.GraphModule, base: Plan,
                 prefer: dict[str, str]) -> Plan:
    """A plan where each named node goes to the backend ``prefer`` names, where it can
    run it (the partitioner still enforces acyclicity and min_block_size). ``base``: the
    priority plan, which holds every backend's answer for each node."""
    table = Preferred(FixedSupport(base.support, planner.fallback_name, base.patterns),
                      lambda n: prefer.get(n.name))
    return planner.plan(gm, table)


class Refiner:
    """Refines one graph's best placement; the moves it tries join ``candidates``."""

    def __init__(self, planner: Planner, gm: torch.fx.GraphModule,
                 candidates: list[Candidate], timing: Timing, label: str):
        self._planner = planner
        self._gm = gm
        self._candidates = candidates
        self._timing = timing
        self._label = label

    def run(self, best: Optional[Candidate], args: list) -> None:
        """Move one partition of ``best`` (the best measured placement at the graph's own
        precision) at a time to another backend able to run all of it; keep a move when
        the whole graph gets faster by more than REFINE_MARGIN twice; stop when the
        budget is spent, or after ``refine_patience`` moves in a row that did not win."""
        if best is None or best.measured_ms is None:
            return
        timing = self._timing
        base = self._candidates[0].plan  # priority: every backend's answer for each node
        prefer = {n.name: p.backend for p in best.plan.partitions for n in p.nodes}
        seen = {plan_key(c.plan) for c in self._candidates}
        patience = getattr(timing.options, "refine_patience", 0)
        misses = 0
        for part in sorted(best.plan.partitions, key=lambda p: -p.size):
            compute = [n for n in part.nodes if not is_getitem(n)]
            if not compute:
                continue
            common = [b for b in base.support[compute[0]].candidates
                      if b != part.backend and all(b in base.support[n].candidates
                                                   for n in compute)]
            moves = _moves(part.backend, part.nodes, compute)
            for backend in common:
                for what, nodes in moves:
                    elapsed = timing.elapsed()
                    if elapsed > timing.budget_s:
                        log.info("%s: measure budget spent during refinement", self._label)
                        return
                    trial = dict(prefer)
                    for n in nodes:
                        trial[n.name] = backend
                    plan = steered_plan(self._planner, self._gm, base, trial)
                    key = plan_key(plan)
                    if key in seen:
                        continue
                    seen.add(key)
                    cand = Candidate(f"refine: {what} of a {part.backend} partition (first "
                                     f"{compute[0].name}) to {backend}", plan,
                                     plan_ms(plan, self._planner.inline), steer=trial)
                    self._candidates.append(cand)
                    timing.progress(f"{self._label}: refining ({cand.label}), {elapsed:.1f} s",
                                    elapsed)
                    ran = timing.tried(cand, lambda c=cand: timing.time_one(c, args))
                    if ran and timing.beats(cand, best, args, REFINE_MARGIN):
                        best, prefer = cand, trial
                        misses = 0
                        continue
                    cand.eligible = False
                    misses += 1
                    if patience and misses >= patience:
                        log.info("%s: refinement stopped after %d moves in a row that did "
                                 "not win (measure.refine_patience)", self._label, misses)
                        return


def _moves(backend: str, nodes: list[torch.fx.Node],
           compute: list[torch.fx.Node]) -> list[tuple[str, list[torch.fx.Node]]]:
    """The moves tried for one partition on ``backend``: the whole partition, then each op
    of it alone (ops whose nodes cost most, by the estimate, first): finer cuts than whole
    partitions, as Collage explores, in a number of steps linear in the partition's ops."""
    by_op: dict[str, list[torch.fx.Node]] = {}
    for n in compute:
        by_op.setdefault(op_name(n.target), []).append(n)
    cost_of = load_table().of(backend)
    ops = sorted(by_op, key=lambda o: -sum(node_us(n, cost_of) for n in by_op[o]))
    moves = [(f"{len(compute)} nodes", nodes)]
    if len(ops) > 1:
        moves += [(f"its {len(by_op[o])} {o}", by_op[o]) for o in ops]
    return moves
