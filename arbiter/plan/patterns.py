"""Patterns: subgraphs a backend claims as one unit (a manifest's ``patterns:``).

A pattern is a small Python function of tensors (``pattern_library`` names a few; a
manifest may give any ``module:function``), traced to ATen the way arbiter lowers a model
(AOTAutograd, inference), once per dtype it allows. Matching uses torch.fx's
``SubgraphMatcher``: a match is self-contained (only its outputs are read outside) and
would not make a cycle if fused. ``PatternTable`` wraps the capability table: for each
match it asks every backend whose manifest claims the pattern, in chain order, whether
it takes this match (the config's rules, the entry's dtypes/devices/ranks/dynamic, the
library's check, ``Backend.check_pattern``). A claimed match becomes a ``PatternGroup``,
one unit for the partitioner; of overlapping claimed matches the larger wins, then the
earlier. docs/design.md ("Patterns") has the details.
"""
from __future__ import annotations

import functools
import importlib
import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.fx

from ..backend import Backend
from ..errors import ManifestError
from ..manifest import DTYPES, PatternEntry
from ..ops import is_getitem, op_name, packet_name, real_tensors
from .capability import CapabilityTable, NodeSupport, dtype_device_refused, value_descs
from . import pattern_library

log = logging.getLogger(__name__)


@dataclass
class Match:
    """One occurrence of a pattern in a graph."""

    pattern: str
    nodes: list[torch.fx.Node]        # matched compute nodes (getitems too), graph order
    inputs: list[Any]                 # per argument of the pattern function: a Node or a literal
    outputs: list[torch.fx.Node]      # the nodes the pattern returns, in its order
    by_pattern_node: dict = field(default_factory=dict, repr=False)  # pattern node -> node

    def find(self, target) -> list[torch.fx.Node]:
        """The matched nodes of one op (an OpOverload), in graph order."""
        return [n for n in self.nodes if n.target is target]

    def input_value(self, k: int) -> Any:
        """The FakeTensor (or literal) bound to the pattern's argument ``k``."""
        v = self.inputs[k]
        return v.meta.get("val") if isinstance(v, torch.fx.Node) else v


@dataclass
class PatternGroup:
    """A match and who may run it: ``support.candidates`` (claiming backends and those
    able to run every op of it alone, chain order), ``claimed_by`` (the claiming ones) and
    ``support.refusals`` (why a backend whose manifest names the pattern refused)."""

    match: Match
    support: NodeSupport
    claimed_by: tuple[str, ...] = ()

    @property
    def nodes(self) -> list[torch.fx.Node]:
        return self.match.nodes

    @property
    def pattern(self) -> str:
        return self.match.pattern


# -- tracing patterns ----------------------------------------------------------------------
@dataclass(frozen=True)
class CompiledPattern:
    name: str
    graphs: tuple  # (torch.fx.GraphModule, ...): one per distinct traced form, largest first
    literal_wildcards: bool
    check: Optional[Callable[[Match], Optional[str]]]


def _resolve_function(name: str, entry: PatternEntry, where: str) -> tuple[Callable, list, bool, Any]:
    """(function, argument shapes, literals are wildcards, check) of a manifest pattern."""
    if entry.function is None:
        lib = pattern_library.PATTERNS.get(name)
        if lib is None:
            raise ManifestError(f"pattern {name!r} is not in the pattern library (has "
                                f"{', '.join(sorted(pattern_library.PATTERNS))}); give "
                                "`function: module:function` and `inputs`",
                                file=where, key=f"patterns.{name}")
        return lib.fn, list(lib.shapes), True, lib.check
    module, _, attr = entry.function.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ManifestError(f"cannot import {entry.function}: {exc}", file=where,
                            key=f"patterns.{name}.function") from None
    return obj, [list(s) for s in entry.inputs or ()], False, None


def trace_pattern(fn: Callable, shapes: Sequence[Sequence[int]], dtype: torch.dtype
                  ) -> torch.fx.GraphModule:
    """``fn`` as the ATen inference graph arbiter's lowering would give (AOTAutograd),
    traced with distinct fake tensors of ``shapes`` and ``dtype`` (nothing computes)."""
    from torch._functorch.aot_autograd import aot_function, make_boxed_func
    from torch._subclasses.fake_tensor import FakeTensorMode

    got: list = []

    def capture(gm, _inputs):
        got.append(gm)
        return make_boxed_func(gm.forward)

    fake = FakeTensorMode()
    quiet = logging.getLogger("torch._subclasses.fake_tensor")  # logs a dtype it refuses
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        # a planner may be built inside Dynamo's backend call (backend="arbiter"): trace
        # outside its tracing context and modes, with real tensors
        with real_tensors(), torch.no_grad():
            args = [fake.from_tensor(torch.empty(*s, dtype=dtype))
                    for s in shapes]
            aot_function(fn, fw_compiler=capture, inference_compiler=capture)(*args)
    finally:
        quiet.setLevel(level)
    gm = got[-1]
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _signature(gm: torch.fx.GraphModule) -> tuple:
    return tuple((n.op, str(n.target)) for n in gm.graph.nodes)


@functools.lru_cache(maxsize=None)
def _compiled(name: str, entry_json: str, dtypes: tuple[str, ...], where: str) -> CompiledPattern:
    entry = PatternEntry.model_validate_json(entry_json)
    fn, shapes, wildcards, check = _resolve_function(name, entry, where)
    graphs: dict[tuple, torch.fx.GraphModule] = {}
    failed: list[str] = []
    for d in dtypes:
        if wildcards and not DTYPES[d].is_floating_point:
            continue  # the library's patterns are floating point computations
        try:
            gm = trace_pattern(fn, shapes, DTYPES[d])
        except Exception as exc:  # noqa: BLE001 - a dtype the function cannot take
            failed.append(f"{d}: {type(exc).__name__}: {str(exc)[:160]}")
            continue
        graphs.setdefault(_signature(gm), gm)
    if not graphs:  # (a dtype it cannot take cannot occur in a graph either)
        raise ManifestError(f"pattern {name!r} does not trace in any dtype it allows ("
                            + "; ".join(failed) + ")", file=where, key=f"patterns.{name}")
    ordered = sorted(graphs.values(), key=lambda g: -len(g.graph.nodes))
    return CompiledPattern(name, tuple(ordered), wildcards, check)


def compile_pattern(backend: type[Backend] | Backend, name: str) -> CompiledPattern:
    """The traced forms of pattern ``name`` of ``backend``'s manifest (cached)."""
    manifest = backend.manifest()
    entry = manifest.patterns[name]
    dtypes = tuple(entry.dtypes if entry.dtypes is not None else manifest.defaults.dtypes)
    return _compiled(name, entry.model_dump_json(), dtypes, str(backend.manifest_path()))


def checked(check: Optional[Callable[["Match"], Optional[str]]], m: "Match") -> Optional[str]:
    """A pattern's check on match ``m``: why it is refused, or None. A check that raises
    refuses the match, saying so (a planning step never fails on a pattern's check)."""
    if check is None:
        return None
    try:
        return check(m)
    except Exception as exc:  # noqa: BLE001 - refused, with the reason
        log.warning("pattern %s: its check failed on the match at %s (%s: %s); refused",
                    m.pattern, m.nodes[-1].name, type(exc).__name__, exc)
        return f"its check failed on this match ({type(exc).__name__}: {str(exc)[:160]})"


# -- matching ------------------------------------------------------------------------------
def _matcher(pattern_graph: torch.fx.Graph, wildcards: bool):
    from torch.fx.passes.utils.matcher_utils import SubgraphMatcher

    class Matcher(SubgraphMatcher):
        # Tracers leave a getitem for every output of a multi-output op, read or not; an
        # unread one does not make a match leak (AOT's graphs have none).
        def _is_contained(self, nodes_map):
            inside = {gn for pn, gn in nodes_map.items() if pn.op != "placeholder"}
            for pn, gn in nodes_map.items():
                if pn.op == "placeholder" or pn in self.pattern_returning_nodes:
                    continue
                for user in gn.users:
                    if user not in inside and not (is_getitem(user) and not user.users):
                        return False
            return True

    return Matcher(pattern_graph, match_output=False, match_placeholder=False,
                   remove_overlapping_matches=True, ignore_literals=wildcards)


def find_matches(graph: torch.fx.Graph, patterns: Sequence[CompiledPattern]) -> list[Match]:
    """Every match of ``patterns`` in ``graph``, none overlapping another of the same
    pattern; the library's literal checks are not applied here."""
    targets = {n.target for n in graph.nodes if n.op == "call_function"}
    order = {n: i for i, n in enumerate(graph.nodes)}
    out: list[Match] = []
    for cp in patterns:
        taken: set = set()
        for pg in cp.graphs:
            needed = {n.target for n in pg.graph.nodes if n.op == "call_function"}
            if not needed <= targets:  # cheap: most graphs hold none of a pattern's ops
                continue
            placeholders = [n for n in pg.graph.nodes if n.op == "placeholder"]
            for im in _matcher(pg.graph, cp.literal_wildcards).match(graph):
                compute = {gn for pn, gn in im.nodes_map.items()
                           if pn.op not in ("placeholder", "output")}
                if compute & taken:
                    continue
                taken |= compute
                out.append(Match(cp.name, sorted(compute, key=order.__getitem__),
                                 [im.nodes_map.get(p) for p in placeholders],
                                 list(im.returning_nodes), dict(im.nodes_map)))
    out.sort(key=lambda m: (order[m.nodes[0]], m.pattern))
    return out


# -- who claims a match --------------------------------------------------------------------
def entry_refuses(entry, descs: Sequence) -> Optional[str]:
    """Why a resolved pattern entry refuses tensors described by ``descs``, or None."""
    for d in descs:
        if d is None:
            continue
        why = dtype_device_refused(d, entry, "pattern")
        if why is not None:
            return why
        if d.symbolic and not entry.dynamic:
            return "symbolic (dynamic) shapes not supported"
        if entry.max_rank is not None and d.rank > entry.max_rank:
            return f"rank {d.rank} tensor exceeds max_rank {entry.max_rank}"
    return None


class PatternTable:
    """A ``SupportTable`` (the capability table it wraps) that also answers
    ``pattern_groups``: the matches of the chain's patterns and who claims each."""

    def __init__(self, table: CapabilityTable):
        self._table = table
        self.fallback_name = table.fallback_name
        self.backends: list[Backend] = list(table.backends)
        unavailable = getattr(table, "unavailable", {})
        # (backend, pattern name) in chain order; patterns traced now, not while compiling
        self.claims = [(b, name) for b in self.backends if b.name not in unavailable
                       for name in b.manifest().patterns]
        self.patterns: dict[str, CompiledPattern] = {}
        for b, name in self.claims:
            cp = compile_pattern(b, name)
            have = self.patterns.get(name)
            if have is None:
                self.patterns[name] = cp
            elif have is not cp:  # two backends, one name: match every form of both
                self.patterns[name] = CompiledPattern(
                    name, tuple(dict.fromkeys(have.graphs + cp.graphs)),
                    have.literal_wildcards and cp.literal_wildcards, have.check or cp.check)
        self._cache: "weakref.WeakKeyDictionary[torch.fx.Graph, tuple]" = \
            weakref.WeakKeyDictionary()

    def support_all(self, nodes: Sequence[torch.fx.Node]) -> list[NodeSupport]:
        return self._table.support_all(nodes)

    def __getattr__(self, name: str) -> Any:  # the rest of the capability table
        if name == "_table":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self._table, name)

    def pattern_groups(self, nodes: Sequence[torch.fx.Node],
                       support: Sequence[Optional[NodeSupport]]) -> list[PatternGroup]:
        """Every match in the nodes' graph; the claimed ones, not overlapping, first.
        ``support``: each node's own support (None for getitems), as the partitioner has it."""
        if not nodes:
            return []
        graph = nodes[0].graph
        hit = self._cache.get(graph)
        if hit is not None and hit[0] == len(graph.nodes):
            return hit[1]
        per_node = {n: s for n, s in zip(nodes, support) if s is not None}
        claimed: list[PatternGroup] = []
        unclaimed: list[PatternGroup] = []
        for m in find_matches(graph, list(self.patterns.values())):
            g = self._judge(m, per_node)
            (claimed if g.claimed_by else unclaimed).append(g)
        order = {n: i for i, n in enumerate(nodes)}
        claimed.sort(key=lambda g: (-len(g.nodes), order.get(g.nodes[0], -1)))
        taken: set = set()
        kept = []
        for g in claimed:
            if taken.isdisjoint(g.nodes):
                taken.update(g.nodes)
                kept.append(g)
        kept += [g for g in unclaimed if taken.isdisjoint(g.nodes)]
        kept.sort(key=lambda g: order.get(g.nodes[0], -1))
        self._cache[graph] = (len(graph.nodes), kept)
        return kept

    def _judge(self, m: Match, per_node: dict) -> PatternGroup:
        table = self._table
        unavailable = getattr(table, "unavailable", {})
        exclude = getattr(table, "exclude", frozenset())
        pin = getattr(table, "pin", {})
        compute = [n for n in m.nodes if not is_getitem(n)]
        names = [op_name(n.target) for n in compute]
        # what crosses the match's boundary: its inputs and outputs (inside, a kernel's own)
        descs = [d for v in m.inputs if isinstance(v, torch.fx.Node)
                 for d in value_descs(v.meta.get("val"))]
        descs += [d for v in m.outputs for d in value_descs(v.meta.get("val"))]
        cp = self.patterns[m.pattern]
        literal = checked(cp.check, m)
        refusals: dict[str, str] = {}
        claimers: list[str] = []
        for b, name in self.claims:
            if name != m.pattern or b.name in claimers or b.name in refusals:
                continue
            why = None
            if b.name in unavailable:
                why = f"unavailable: {unavailable[b.name]}"
            elif any(n in exclude or packet_name(n) in exclude for n in names):
                why = "an op of it is excluded by the config's exclude_ops"
            elif any((pin.get(n) or pin.get(packet_name(n))) not in (None, b.name)
                     for n in names):
                why = "an op of it is pinned to another backend by the config"
            else:
                why = (entry_refuses(b.manifest().pattern_entry(name), descs) or literal
                       or b.check_pattern(name, m))
            if why is None:
                claimers.append(b.name)
            else:
                refusals[b.name] = f"pattern {name}: {why}"
        sups = [per_node.get(n) for n in compute]
        able = [b.name for b in self.backends
                if b.name in claimers or all(s is not None and b.name in s.candidates
                                             for s in sups)]
        return PatternGroup(m, NodeSupport(tuple(able), refusals), tuple(claimers))


def with_patterns(table: CapabilityTable) -> "CapabilityTable | PatternTable":
    """``table`` wrapped in a ``PatternTable`` when a backend of it that is available
    claims patterns; else ``table`` itself (no matching cost)."""
    unavailable = getattr(table, "unavailable", {})
    if any(b.manifest().patterns for b in table.backends if b.name not in unavailable):
        return PatternTable(table)
    return table


def pattern_groups(table: Any, nodes: Sequence[torch.fx.Node],
                   support: Sequence[Optional[NodeSupport]]) -> list[PatternGroup]:
    """The partitioner's hook: the table's pattern groups, or none."""
    find = getattr(table, "pattern_groups", None)
    return find(nodes, support) if find is not None else []
