"""Refinement (Collage-style): moving one partition at a time from the best placement.

From the best measured placement, move one partition at a time (the whole partition,
then each op of it alone) to another backend able to run all of it; a move is kept when
the whole graph gets faster by more than ``REFINE_MARGIN`` twice (``Timing.beats``:
timings here are noisy). Every move is a placement made by the partitioner through
``steered_plan`` (each named node's preferred backend first among those able to run it,
so acyclicity and ``min_block_size`` hold as always); mixing at module boundaries and
the decision cache (a refined placement rebuilt in another process) make theirs the same
way. docs/policies.md ("Refinement").
"""
from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Optional

import torch.fx

from ..ops import is_getitem, op_name
from ..plan.cost import load_table, node_us, plan_ms
from ..plan.partition import Plan
from ..plan.planner import Planner
from ..plan.policy import ONLY, Candidate, plan_key
from ..plan.support import FixedSupport, Preferred
from .timing import Timing

log = logging.getLogger(__name__)

#: A partition a move makes compiles in at least this share of its backend's whole-graph
#: compile: an export and a session or compiled model each (DistilBERT on 2 cores, a move
#: cutting it into 13 partitions: each took 12-28% of ONNX Runtime's whole-graph compile,
#: 29-38% of OpenVINO's; 21 s in all, where the nodes' shares alone predicted 12).
MOVE_MIN_SHARE = 0.25

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
        total = sum(p.size for p in best.plan.partitions) or 1
        unaffordable = 0
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
                    # a compile under way is never interrupted: one predicted to overrun
                    # the budget is not begun
                    need = move_compile_s(plan, best.plan, timing.prepare_s, total,
                                          self._planner.inline)
                    log.debug("%s: %s: %d partitions, predicted compile %.1f s", self._label,
                              what, len(plan.partitions), need)
                    if elapsed + need > timing.budget_s:
                        unaffordable += 1
                        continue
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
        if unaffordable:
            log.info("%s: refinement left %d move(s) untried: each would compile past the "
                     "measure budget (%.0f s)", self._label, unaffordable, timing.budget_s)


def move_compile_s(plan: Plan, best: Plan, prepare_s: dict[str, float], total: int,
                   inline: Collection[str] = ()) -> float:
    """What building ``plan`` compiles, predicted from each backend's whole-graph compile
    (``prepare_s``, by ``only`` label): each partition not in ``best`` costs its share of
    the nodes of that compile, and at least ``MOVE_MIN_SHARE`` of it (an export and a
    session or compiled model per partition: a move that cuts a partition into many
    compiles that many times); partitions of ``inline`` backends (eager) compile nothing."""
    have = {(p.backend, tuple(n.name for n in p.nodes)) for p in best.partitions}
    need = 0.0
    for p in plan.partitions:
        if p.backend in inline or (p.backend, tuple(n.name for n in p.nodes)) in have:
            continue
        need += prepare_s.get(ONLY + p.backend, 0.0) * max(p.size / total, MOVE_MIN_SHARE)
    return need


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
