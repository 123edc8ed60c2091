"""Segments at module boundaries, and a backend per segment (`measure`'s mixed candidate).

Pure: nodes come in as ``NodeInfo`` (a name, its module stack as (path, class) pairs from
Dynamo's ``nn_module_stack``, a signature, its inputs' names), costs as numbers; nothing
here runs a tensor, so tests/test_segments.py tests it with made-up costs and
arbiter/measure/mix.py measures the costs and builds the plan. ``segment`` cuts the
graph order into runs of one module at a depth (small runs and module-less nodes join the
segment before them; repeated blocks share a ``kind``, measured once); ``choose_depth``
picks the deepest depth giving 2 to ``max_segments`` segments; ``probe_layouts`` packs
one instance per kind and per adjacent pair's kind into few plans; ``best_chain`` is
Collage's dynamic program restricted to a chain (O(segments x backends^2));
``SegmentTimes`` keeps what the probes measured, with the oracle sum, on the policy
outcome. docs/policies.md ("Mixing at module boundaries") gives the rules.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class NodeInfo:
    """One node of the graph, as segmenting sees it."""

    name: str
    stack: tuple[tuple[str, str], ...]  # (module path, class name), outermost first
    signature: Hashable = ()  # op, output shapes/dtypes: equal for repeated blocks' nodes
    inputs: tuple[str, ...] = ()  # names of the nodes it reads (others: graph inputs)


@dataclass(frozen=True)
class Segment:
    index: int
    path: str  # the module's path ("" for a leading run of top-level code)
    cls: str  # its class name
    nodes: tuple[str, ...]
    kind: Hashable  # equal for segments that are the same computation on the same shapes


def _units(nodes: Sequence[NodeInfo], depth: int) -> list[Optional[tuple[str, str]]]:
    """Each node's module at ``depth``: the entry at that depth, or the shallowest entry
    of its stack with nothing below ``depth`` (a module not divided at this depth); None
    for a node directly in a module that is divided (or in no module)."""
    deepest: dict[str, int] = {}
    for n in nodes:
        for k, (path, _) in enumerate(n.stack):
            deepest[path] = max(deepest.get(path, 0), len(n.stack) - 1 - k)
    out: list[Optional[tuple[str, str]]] = []
    for n in nodes:
        unit = None
        for level, (path, cls) in enumerate(n.stack, start=1):
            if level == depth or level + deepest[path] < depth:
                unit = (path, cls)
                break
        out.append(unit)
    return out


def segment(nodes: Sequence[NodeInfo], depth: int, min_nodes: int = 1) -> list[Segment]:
    """The maximal runs of ``nodes`` (graph order) in the same module at ``depth``; see the
    module docstring. A run of fewer than ``min_nodes`` nodes (a ReLU module between two
    blocks) joins the segment before it (the one after, when it comes first): a partition
    that small costs more in calls than any backend could save on it."""
    if depth < 1:
        raise ValueError(f"segment depth must be at least 1, got {depth}")
    runs: list[tuple[Optional[tuple[str, str]], list[NodeInfo]]] = []
    for n, unit in zip(nodes, _units(nodes, depth)):
        if unit is None or (runs and runs[-1][0] == unit):
            if runs:
                runs[-1][1].append(n)
            else:
                runs.append((None, [n]))  # top-level code first: a segment until a module
            continue
        if runs and runs[-1][0] is None and len(runs) == 1:
            runs[0] = (unit, runs[0][1] + [n])  # the leading glue joins the first module
            continue
        runs.append((unit, [n]))
    merged: list = []
    for unit, members in runs:
        if merged and len(members) < min_nodes:
            merged[-1][1].extend(members)
        elif merged and len(merged[-1][1]) < min_nodes and len(merged) == 1:
            merged[0] = (unit, merged[0][1] + members)  # a small first run joins the next
        else:
            merged.append((unit, list(members)))
    runs = merged
    out = []
    for i, (unit, members) in enumerate(runs):
        path, cls = unit if unit is not None else ("", "")
        out.append(Segment(i, path, cls, tuple(n.name for n in members),
                           (cls, _shape_of(members))))
    return out


def _shape_of(members: Sequence[NodeInfo]) -> tuple:
    """The segment's computation without names: each node's signature and where its
    inputs come from (a position inside the segment, or the k-th outside input)."""
    pos = {n.name: i for i, n in enumerate(members)}
    outside: dict[str, int] = {}
    out = []
    for n in members:
        wires = tuple(("in", pos[x]) if x in pos else ("out", outside.setdefault(x, len(outside)))
                      for x in n.inputs)
        out.append((n.signature, wires))
    return tuple(out)


def choose_depth(nodes: Sequence[NodeInfo], max_segments: int,
                 min_nodes: int = 1) -> Optional[int]:
    """The deepest module depth whose modules cut ``nodes`` into at most ``max_segments``
    runs, and into at least 2 segments once runs under ``min_nodes`` joined their
    neighbours (``segment``); None when no depth does (no module structure, or too fine
    everywhere). The depth is judged by the modules' own runs: merging small runs first
    would let a deep depth of tiny modules pass as coarse."""
    top = max((len(n.stack) for n in nodes), default=0)
    for depth in range(top, 0, -1):
        if len(segment(nodes, depth)) <= max_segments and \
                len(segment(nodes, depth, min_nodes)) >= 2:
            return depth
    return None


def skip_edges(nodes: Sequence[NodeInfo], segments: Sequence[Segment]) -> int:
    """Values read by a segment from one more than one segment before it (BERT's attention
    mask, read by every layer): crossings the chain model does not price (the mixed plan's
    end-to-end timing does)."""
    where = {name: s.index for s in segments for name in s.nodes}
    seen = set()
    for n in nodes:
        j = where.get(n.name)
        for x in n.inputs:
            i = where.get(x)
            if i is not None and j is not None and j - i > 1:
                seen.add((x, j))
    return len(seen)


def pair_kind(segments: Sequence[Segment], i: int) -> tuple:
    """The kind of the adjacent pair (segment i, segment i + 1)."""
    return (segments[i].kind, segments[i + 1].kind)


def probe_layouts(segments: Sequence[Segment], pairs: bool = True) -> list[list[tuple[int, ...]]]:
    """Instances to time: the first segment of each kind alone, and (``pairs``) the first
    pair of each adjacent-pair kind, packed greedily into layouts of non-overlapping
    instances (a tuple of segment indices each). Singles go first; a pair that overlaps
    what a layout holds goes to a later instance of its kind or to the next layout."""
    wanted: list[list[tuple[int, ...]]] = []  # per thing to measure: its instances
    seen: dict = {}
    for s in segments:
        if s.kind not in seen:
            seen[s.kind] = len(wanted)
            wanted.append([])
        wanted[seen[s.kind]].append((s.index,))
    if pairs:
        seen_pairs: dict = {}
        for i in range(len(segments) - 1):
            k = ("pair", pair_kind(segments, i))
            if k not in seen_pairs:
                seen_pairs[k] = len(wanted)
                wanted.append([])
            wanted[seen_pairs[k]].append((i, i + 1))
    layouts: list[list[tuple[int, ...]]] = []
    used: list[set[int]] = []
    for instances in wanted:
        for k, taken in enumerate(used + [set()]):
            free = next((inst for inst in instances if not taken.intersection(inst)), None)
            if free is None:
                continue
            if k == len(used):
                used.append(set())
                layouts.append([])
            used[k].update(free)
            layouts[k].append(free)
            break
    return layouts


def best_chain(costs: Sequence[Mapping[str, float]],
               boundary: Callable[[int, str, str], float]) -> tuple[float, list[str]]:
    """The cheapest placement of a chain of segments: ``costs[i][b]`` is segment i's cost
    on backend b (a backend missing, or at inf, cannot take it); ``boundary(i, a, b)`` the
    cost of segment i on a followed by segment i + 1 on b, asked only for a != b. Returns
    (total, backend per segment). Ties go to fewer switches, then to the backend listed
    first in ``costs[i]``. Raises ValueError when some segment has no backend."""
    if not costs:
        return 0.0, []
    # best[b] = (total, switches, backends so far) of the cheapest prefix ending on b
    best: dict[str, tuple[float, int, list[str]]] = {}
    for i, row in enumerate(costs):
        options = [(b, c) for b, c in row.items() if c is not None and math.isfinite(c)]
        if not options:
            raise ValueError(f"segment {i} has no backend able to take it")
        nxt: dict[str, tuple[float, int, list[str]]] = {}
        for b, c in options:
            if i == 0:
                nxt[b] = (c, 0, [b])
                continue
            pick = None
            for a, (total, switches, path) in best.items():
                t = total + c + (0.0 if a == b else boundary(i - 1, a, b))
                key = (t, switches + (a != b))
                if pick is None or key < pick[:2]:
                    pick = (key[0], key[1], path + [b])
            nxt[b] = pick
        best = nxt
    total, _, path = min(best.values(), key=lambda v: (v[0], v[1]))
    return total, path


@dataclass
class SegmentTimes:
    """The segment probes' measurements of one graph (``measure.mix``): its segments at
    ``depth``, each kind's time alone per backend, each adjacent pair kind's time as one
    partition per backend, and the DP's placement (``path``, a backend per segment, ""
    where none was measured) with its predicted total. Times are ms, medians of the
    probes' interleaved rounds (``whole_ms``: candidates timed whole in those rounds, by
    label); a (kind, backend) missing was not measured (the backend
    cannot take the segment whole, or the budget ran out)."""

    depth: int
    segments: tuple[Segment, ...]
    single_ms: dict[tuple[Hashable, str], float]
    pair_ms: dict[tuple[tuple[Hashable, Hashable], str], float] = field(default_factory=dict)
    path: list[str] = field(default_factory=list)
    predicted_ms: Optional[float] = None
    # whole-graph candidates timed end to end in the probes' rounds: label -> ms
    whole_ms: dict[str, float] = field(default_factory=dict)

    def on(self, seg: Segment) -> dict[str, float]:
        """{backend: ms} of ``seg``'s kind."""
        return {b: ms for (k, b), ms in self.single_ms.items() if k == seg.kind}

    def fastest(self) -> list[Optional[tuple[str, float]]]:
        """Per segment, (backend, ms) of the fastest measured; None where none was."""
        out: list[Optional[tuple[str, float]]] = []
        for s in self.segments:
            times = self.on(s)
            out.append(min(times.items(), key=lambda bm: bm[1]) if times else None)
        return out

    def alone_ms(self, backend: str) -> Optional[float]:
        """The sum of ``backend``'s segment times; None when it lacks one."""
        times = [self.on(s).get(backend) for s in self.segments]
        return None if any(t is None for t in times) else sum(times)

    def oracle_ms(self) -> Optional[float]:
        """The sum over segments of the fastest backend's time, boundary costs ignored:
        no placement of these segments (whole segments, these backends) runs faster than
        this by the probes' own times. None when some segment was measured on no backend."""
        best = self.fastest()
        return None if any(b is None for b in best) else sum(ms for _, ms in best)
