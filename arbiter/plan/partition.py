"""Split an ATen FX graph into acyclic, deterministic partitions, one backend each.

Linear in nodes + edges (torch.fx's ``CapabilityBasedPartitioner`` handles one backend
and merges with repeated cycle checks: 63 s at 5,000 nodes here): each node's choice is
the first of the backends able to run it (a ``support.SupportTable``); a list scheduler
with one ready queue per backend emits a topological order that stays on one backend
while it can, and partitions are its maximal same-backend runs (convex, so acyclic).
Nodes are then sunk into later runs that use them, and partitions smaller than
``min_block_size`` give their nodes to the next able backend, in at most (#backends)
rounds; a pin wins over ``min_block_size``. Ties break by graph order, so the same graph
and config always give the same plan. A pattern match some backend claims is one unit
(patterns.py), and so is a dequantize with the ops it feeds (quantized.py).
docs/design.md ("The partitioner") gives the steps.
"""
from __future__ import annotations

import gc
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
import torch.fx

from ..ops import is_getitem, is_mutating, is_random, random_depends_on_args
from .capability import NodeSupport
from .patterns import pattern_groups
from .quantized import dequantize_units, shared_candidates
from .support import SupportTable


@dataclass
class Partition:
    id: int
    backend: str
    nodes: list[torch.fx.Node]

    @property
    def size(self) -> int:
        """Compute nodes (getitem does not count)."""
        return sum(1 for n in self.nodes if not is_getitem(n))

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]


@dataclass
class Plan:
    """The partitions of one graph, in an order that is topological for the graph."""

    graph_module: torch.fx.GraphModule
    partitions: list[Partition]
    support: dict[torch.fx.Node, NodeSupport] = field(repr=False)
    fallback: str = "eager"
    #: the pattern matches found (patterns.PatternGroup), claimed or not, graph order
    patterns: list = field(default_factory=list, repr=False)

    def candidates(self, node: torch.fx.Node) -> tuple[str, ...]:
        """Who may run ``node``: its claimed pattern's candidates, or its own."""
        for g in self.patterns:
            if g.claimed_by and node in g.nodes:
                return g.support.candidates
        return self.support[node].candidates

    def backend_of(self, node: torch.fx.Node) -> str:
        for p in self.partitions:
            if node in p.nodes:
                return p.backend
        raise KeyError(node.name)

    def as_lists(self) -> list[tuple[str, list[str]]]:
        """[(backend, [node names])] per partition: handy in tests and logs."""
        return [(p.backend, p.names) for p in self.partitions]


def partition_graph(gm: torch.fx.GraphModule, table: SupportTable,
                    min_block_size: int = 1) -> Plan:
    # Planning allocates a few objects per node and makes no reference cycles; Python's
    # cyclic GC would still walk every object of a large graph several times meanwhile
    # (a third of the time at 100,000 nodes). Pause it; refcounting frees as usual.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _partition_graph(gm, table, min_block_size)
    finally:
        if enabled:
            gc.enable()


def _partition_graph(gm: torch.fx.GraphModule, table: SupportTable,
                     min_block_size: int) -> Plan:
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr")]
    index = {n: i for i, n in enumerate(nodes)}
    count = len(nodes)
    getitems = {i for i, n in enumerate(nodes) if is_getitem(n)}
    support: list = [None] * count
    compute = [i for i in range(count) if i not in getitems]
    for i, s in zip(compute, table.support_all([nodes[i] for i in compute])):
        support[i] = s
    allowed = [list(s.candidates) if s is not None else None for s in support]
    producer = [-1] * count
    for i in getitems:
        producer[i] = index.get(nodes[i].args[0], -1)

    # Edges among partitionable nodes (placeholders and constants are free to use).
    # ``all_input_nodes`` lists each input once, so each edge is added once.
    users: list[list[int]] = [[] for _ in range(count)]
    indeg = [0] * count
    get = index.get
    for i, n in enumerate(nodes):
        d = 0
        for inp in n.all_input_nodes:
            j = get(inp)
            if j is not None:
                users[j].append(i)
                d += 1
        indeg[i] = d

    _order_mutations(nodes, index, users, indeg)
    for members in dequantize_units(nodes, index):  # a dequantize stays with what it feeds
        shared = shared_candidates(members, allowed, nodes)
        if shared is not None:
            for i in members:
                allowed[i] = shared
    groups = pattern_groups(table, nodes, support)
    fixed = _glue([g for g in groups if g.claimed_by], index, allowed, users, indeg)

    fallback = table.fallback_name
    while True:
        choice = [""] * count
        for i in range(count):
            a = allowed[i]
            choice[i] = a[0] if a is not None else (choice[producer[i]] if producer[i] >= 0
                                                     else fallback)
        runs = _schedule(choice, users, indeg)
        runs = _sink(runs, choice, users, getitems | fixed)
        # (A run of at least min_block_size nodes with no getitem among them is big
        # enough without counting.)
        small = [r for r in runs if r[0] != fallback
                 and (len(r[1]) < min_block_size or getitems and
                      sum(1 for i in r[1] if allowed[i] is not None) < min_block_size)]
        changed = False
        for backend, members in small:
            for i in members:
                a = allowed[i]
                if a is not None and backend in a and len(a) > 1 \
                        and support[i].pinned != backend:
                    a.remove(backend)
                    changed = True
        if not changed:  # none, or only pinned nodes left small
            break

    partitions = [Partition(k, backend, [nodes[i] for i in members])
                  for k, (backend, members) in enumerate(runs)]
    sup = {}
    for i, n in enumerate(nodes):
        s = support[i]
        if s is None:  # getitem: report its producer's answer
            s = support[producer[i]] if producer[i] >= 0 else NodeSupport((fallback,))
        sup[n] = s
    return Plan(gm, partitions, sup, fallback, groups)


def _glue(groups, index, allowed, users, indeg) -> set[int]:
    """Make each claimed pattern match one unit: one shared candidate list (min_block_size
    removes a backend from all its nodes at once) and an edge from every producer of an
    input of the match to its first node. Matches are convex (patterns.py), so no cycle.
    Returns the indices of the matched nodes (not to be sunk)."""
    fixed: set[int] = set()
    for g in groups:
        members = sorted(index[n] for n in g.nodes)
        inside = set(members)
        shared = list(g.support.candidates)
        first = members[0]
        for i in members:
            if allowed[i] is not None:
                allowed[i] = shared
        for n in g.nodes:
            for inp in n.all_input_nodes:
                j = index.get(inp)
                if j is not None and j not in inside and first not in users[j]:
                    users[j].append(first)
                    indeg[first] += 1
        fixed |= inside
    return fixed


def _order_mutations(nodes, index, users, indeg) -> None:
    """Keep in-place ops (``copy_`` into a buffer, say) in graph order w.r.t. every other
    reader of what they mutate: readers before stay before, readers after stay after.
    Random ops keep their order among themselves, so the RNG stream is eager's."""
    last_random = -1
    kinds: dict = {}  # target -> (is_random, is_mutating): both depend on the op alone
    for m, node in enumerate(nodes):
        kind = kinds.get(node.target)
        if kind is None:
            kind = (is_random(node), is_mutating(node))
            if not random_depends_on_args(node):
                kinds[node.target] = kind
        random, mutating = kind
        if random:
            if last_random >= 0 and m not in users[last_random]:
                users[last_random].append(m)
                indeg[m] += 1
            last_random = m
        if not mutating:
            continue
        schema = node.target._schema
        written = set()
        for arg, value in zip(schema.arguments, node.args):
            if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.fx.Node):
                written.add(value)
        for target in written:
            for user in target.users:
                u = index.get(user)
                if u is None or u == m:
                    continue
                a, b = (u, m) if u < m else (m, u)
                if b not in users[a]:
                    users[a].append(b)
                    indeg[b] += 1


def _schedule(choice: Sequence[str], users: Sequence[list[int]],
              indeg_in: Sequence[int]) -> list[tuple[str, list[int]]]:
    indeg = list(indeg_in)
    queues: dict[str, deque] = {}
    for b in choice:
        if b not in queues:
            queues[b] = deque()
    for i, d in enumerate(indeg):
        if d == 0:
            queues[choice[i]].append(i)
    runs: list[tuple[str, list[int]]] = []
    current = None
    run: list[int] = []
    remaining = len(choice)
    while remaining:
        q = queues.get(current) if current is not None else None
        if not q:
            # Switch to the backend whose oldest ready node comes first in graph order.
            current = min((dq[0], b) for b, dq in queues.items() if dq)[1]
            q = queues[current]
            run = []
            runs.append((current, run))
        i = q.popleft()
        run.append(i)
        remaining -= 1
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                queues[choice[u]].append(u)
    return runs


def _sink(runs: list[tuple[str, list[int]]], choice: Sequence[str],
          users: Sequence[list[int]], getitems: set) -> list[tuple[str, list[int]]]:
    """Move nodes into the first later same-backend run that uses them."""
    if len(runs) < 3:
        return runs
    run_of = {}
    for r, (_, members) in enumerate(runs):
        for i in members:
            run_of[i] = r
    moved: dict[int, list[int]] = {}  # run -> nodes prepended to it, in order
    for r in range(len(runs) - 1, -1, -1):
        backend, members = runs[r]
        keep = []
        for i in reversed(members):
            us = users[i]
            # A multi-output node and its getitems move together or not at all.
            if us and not (getitems and (i in getitems
                                         or any(u in getitems for u in us))):
                first = min(run_of[u] for u in us)
                if first > r and runs[first][0] == backend:
                    moved.setdefault(first, []).append(i)
                    run_of[i] = first
                    continue
            keep.append(i)
        keep.reverse()
        runs[r] = (backend, keep)
    out: list[tuple[str, list[int]]] = []
    for r, (backend, members) in enumerate(runs):
        if r in moved:
            # Prepended nodes were collected in reverse order of a valid topological
            # order, so reversing them restores dependency order.
            members = list(reversed(moved[r])) + members
        if not members:
            continue
        if out and out[-1][0] == backend:
            out[-1][1].extend(members)
        else:
            out.append((backend, members))
    return out
