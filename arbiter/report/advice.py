"""Advice computed by replanning, never canned.

Planning is linear and fast (about 5 us per node, bench/partition_scaling.py), so the
advice replans each graph under alternatives and reports what actually changes:

* ``min_block_size``: the value (1..8) that gives the fewest partitions, and the split
  of nodes it gives, when that differs from the config's.
* ``op_support``: for each op that runs on the fallback although some configured backend
  refused it, the number of partitions if that backend (the first in config order) could
  run it; ops ranked by boundaries removed. Ops that run in place by design (in-place,
  random, non-ATen) are not candidates: no manifest entry would move them.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..ops import is_getitem, op_name
from ..plan.partition import Plan, partition_graph
from ..plan.support import Preferred
from .cells import plural
from .model import AdviceReport

#: Largest min_block_size tried.
MAX_BLOCK = 8
#: Ops tried for op_support advice (the most frequent ones that fell to the fallback).
MAX_OPS = 12


def _by_backend(plan: Plan) -> dict[str, int]:
    c: Counter = Counter()
    for p in plan.partitions:
        c[p.backend] += p.size
    return dict(sorted(c.items()))


def advise(plans: Sequence[Plan], table: Any, min_block_size: int,
           in_place_reasons: Sequence[str]) -> list[AdviceReport]:
    """Advice over the graphs of one compile (``plans``) under one config's ``table``."""
    if not plans:
        return []
    advice: list[AdviceReport] = []
    counts = {}
    for m in range(1, MAX_BLOCK + 1):
        counts[m] = sum(len(partition_graph(p.graph_module, table, m).partitions) for p in plans)
    best = min(counts, key=lambda m: (counts[m], -m))  # ties: the larger block size
    now = sum(len(p.partitions) for p in plans)
    if counts[best] < now:
        split = [_by_backend(partition_graph(p.graph_module, table, best)) for p in plans]
        advice.append(AdviceReport(
            kind="min_block_size",
            message=f"min_block_size {best} gives {plural(counts[best], 'partition')} "
                    f"(now {min_block_size}: {now})",
            data={"best": best, "partitions": {str(m): c for m, c in counts.items()},
                  "nodes_by_backend": split}))
    else:
        advice.append(AdviceReport(
            kind="min_block_size",
            message=f"min_block_size {min_block_size} already gives the fewest partitions "
                    f"({now}) of 1..{MAX_BLOCK}",
            data={"best": min_block_size,
                  "partitions": {str(m): c for m, c in counts.items()}}))

    fallback = table.fallback_name
    stuck: Counter = Counter()
    refuser: dict[str, str] = {}
    for plan in plans:
        on_fallback = {n for p in plan.partitions if p.backend == fallback for n in p.nodes}
        for node, sup in plan.support.items():
            if is_getitem(node) or node not in on_fallback or not sup.refusals:
                continue
            if any(r in in_place_reasons for r in sup.refusals.values()):
                continue
            first = next(((b, why) for b, why in sup.refusals.items()
                          if not why.startswith("unavailable")), None)
            if first is None:
                continue
            op = op_name(node.target)
            stuck[op] += 1
            refuser.setdefault(op, first)
    gains = []
    for op, n in stuck.most_common(MAX_OPS):
        patched = Preferred(table, lambda n, op=op, b=refuser[op][0]:
                            b if op_name(n.target) == op else None, force=True)
        after = sum(len(partition_graph(p.graph_module, patched, min_block_size).partitions)
                    for p in plans)
        if after < now:
            gains.append((now - after, op, n, refuser[op], after))
    gains.sort(key=lambda g: (-g[0], g[1]))
    for removed, op, n, (backend, why), after in gains:
        advice.append(AdviceReport(
            kind="op_support",
            message=f"{op} ({plural(n, 'node')} on {fallback}): if {backend} ran it, "
                    f"{now} -> {plural(after, 'partition')} ({backend} refused: {why})",
            data={"op": op, "nodes": n, "backend": backend, "refused": why,
                  "partitions_now": now, "partitions_after": after}))
    return advice
