"""``Arbiter``: the torch.compile backend that splits graphs across backends.

Call hierarchy for one Dynamo graph::

    Arbiter.__call__(gm, example_inputs)          # Dynamo hands us a Torch-IR graph
      lowering.lower                              # AOTAutograd -> ATen graphs
        Arbiter._compile_graph(graph, kind)       # once per inference/forward/backward graph
          Arbiter.plan -> partition.partition_graph   # who runs what
          split.extract / runtime.Piece           # one lazily compiled piece per partition
          split.stitch                            # one GraphModule calling the pieces
    Arbiter.report()                              # what ran where, from the live records
"""
from __future__ import annotations

import logging
import platform
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.fx

from .capability import CapabilityTable, is_getitem
from .config import Config, ConfigLike, load_config
from .ops import op_name
from .partition import Plan, partition_graph
from .registry import Backend, get_backend_class
from .report import (BackendStatus, FallbackReport, GraphReport, PartitionReport,
                     RefusalReport, Report, WeightEventReport)
from .runtime import Piece, PieceRecord
from .split import extract, stitch

log = logging.getLogger(__name__)


@dataclass
class _GraphRecord:
    graph_id: int
    kind: str
    plan: Plan
    records: dict[int, PieceRecord]
    constants: int
    plan_s: float
    constant_nodes: frozenset = frozenset()  # placeholders frozen as constants (report)
    weight_events: list = field(default_factory=list)  # freeze.WeightEvent, in order
    weights_as_inputs: bool = False  # frozen weights changed too often: now inputs


class Arbiter:
    """A torch.compile backend over the backends of one config.

    ``Arbiter(config)`` takes a path, the name of a shipped config, a dict, an
    ``arbiter.Config``, or None (the embedded default). Use it as
    ``torch.compile(model, backend=Arbiter(...))``; ``report()`` then says what ran where.
    With ``dry_run=True`` it plans but compiles nothing and runs the graphs in eager.
    """

    def __init__(self, config: ConfigLike = None, *, dry_run: bool = False):
        self.config: Config = load_config(config)
        self.dry_run = dry_run
        self.backends: dict[str, Backend] = {}
        self.unavailable: dict[str, str] = {}
        for name in self.config.chain_names():
            cls = get_backend_class(name)
            backend = cls(cls.Options.model_validate(self.config.options_for(name)))
            try:
                ok, why = backend.available()
            except Exception as exc:  # noqa: BLE001 - a broken install (not only ImportError)
                ok, why = False, f"broken: {type(exc).__name__}: {exc}"
            if not ok:
                hint = f" (install: {cls.install_hint})" if cls.install_hint else ""
                self.unavailable[name] = why + hint
                log.warning("backend %s is unavailable: %s%s", name, why, hint)
            self.backends[name] = backend
        chain = list(self.backends.values())
        # The persistent cache (decisions and artifacts); None when off or unusable.
        from .cache import from_options

        self.cache = None if dry_run else from_options(self.config.cache.enabled,
                                                       self.config.cache.dir)
        for backend in chain:
            backend.artifact_cache = self.cache
        self.table = CapabilityTable(chain, exclude_ops=self.config.exclude_ops,
                                     pin=self.config.pin, unavailable=self.unavailable)
        self._graphs: list[_GraphRecord] = []
        self._lock = threading.Lock()
        # every live compiled-by-a-backend piece (set_timing); weak, so pieces replaced
        # when weights are re-frozen are freed with their sessions and weights
        self._pieces: weakref.WeakSet[Piece] = weakref.WeakSet()
        self._timed = False
        names = list(self.config.decompositions)
        for backend in chain:
            if backend.name not in self.unavailable:
                names += [d for d in backend.manifest().decompositions if d not in names]
        from .lowering import decomposition_table

        self._decompositions = decomposition_table(names)
        if not dry_run:  # one thread budget and arena per process, before any compile
            from .resources import apply as apply_resources

            apply_resources(self.config.resources,
                            [b for n, b in self.backends.items() if n not in self.unavailable],
                            first_backend=self.config.backends[0].name)

    # -- torch.compile backend -------------------------------------------------------
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **_: Any) -> Callable:
        from .lowering import lower

        return lower(gm, example_inputs, self._compile_graph,
                     decompositions=self._decompositions,
                     freeze_weights=self.config.freeze_weights)

    # -- planning --------------------------------------------------------------------
    def plan(self, gm: torch.fx.GraphModule) -> Plan:
        """The priority plan for an ATen FX graph (nodes need ``meta["val"]``).

        Policies `cost` and `measure` choose among ``policy.candidates``, of which this
        is the first."""
        return partition_graph(gm, self.table, self.config.min_block_size)

    def chain_for(self, plan: Plan, part) -> list[Backend]:
        """The planned backend, then every later backend able to run all its nodes."""
        names = list(self.backends)
        start = names.index(part.backend)
        chain = [self.backends[part.backend]]
        for name in names[start + 1:]:
            backend = self.backends[name]
            if backend.inline_aten or all(
                    name in plan.support[n].candidates for n in part.nodes if not is_getitem(n)):
                chain.append(backend)
        return chain

    def decision_parts(self) -> dict:
        """What besides the graph decides a measured choice: part of its cache key."""
        cfg = self.config.model_dump(mode="json", include={
            "backends", "fallback", "min_block_size", "exclude_ops", "pin",
            "decompositions", "freeze_weights"})
        live = {n: b for n, b in self.backends.items() if n not in self.unavailable}
        # the manifests decide which placements exist: a decision measured before a
        # manifest changed (a re-probe, a hand edit) is measured again
        return {"policy": "measure", "config": cfg,
                "versions": {n: _safe_version(b) for n, b in live.items()},
                "manifests": {n: _manifest_digest(b) for n, b in live.items()}}

    def _compile_graph(self, gm: torch.fx.GraphModule, kind: str,
                       constants: dict[torch.fx.Node, torch.Tensor]) -> Callable:
        from .policy import candidates, choose_by_cost

        start = time.perf_counter()
        policy = self.config.policy if not self.dry_run else "priority"
        cands = None
        if policy == "priority":
            plan = self.plan(gm)
        else:
            cands = candidates(self, gm)
            # `cost` picks here; `measure` starts from the cost pick's rival, priority,
            # and times them all on the first call (see measure.py).
            picked = choose_by_cost(cands) if policy == "cost" else cands[0]
            plan = picked.plan
            plan.policy = policy
            plan.candidates_ms = {label: None for c in cands for label in c.labels}
            plan.estimates_ms = {label: round(c.estimate_ms, 4)
                                 for c in cands for label in c.labels}
            if policy == "cost":
                plan.chosen = picked.label
        plan_s = time.perf_counter() - start
        with self._lock:
            graph_id = len(self._graphs)
        label = f"graph {graph_id} ({kind})"
        # Pieces shared by every plan of this graph, by (chain, nodes): a partition that
        # two candidates have in common compiles once.
        pieces: dict = {}

        def build(p: Plan) -> tuple[Callable, dict[int, PieceRecord]]:
            return self._build(p, constants, label, pieces)

        stitched, records = build(plan)
        record = _GraphRecord(graph_id, kind, plan, records, len(constants), plan_s,
                              frozenset(constants))
        with self._lock:
            self._graphs.append(record)
        log.info("%s: %d nodes in %d partitions (%s), planned in %.1f ms (policy %s)", label,
                 sum(p.size for p in plan.partitions), len(plan.partitions),
                 ", ".join(sorted({p.backend for p in plan.partitions})), plan_s * 1e3, policy)
        fn: Callable = stitched
        if policy == "measure" and len(cands) > 1:
            from .measure import MeasuredGraph

            fn = MeasuredGraph(self, gm, constants, cands, record, label,
                               lambda c: build(c.plan))
        if constants and not self.dry_run:
            return self._guarded(fn, gm, constants, record, label)
        return fn

    def _guarded(self, fn: Callable, gm: torch.fx.GraphModule, constants: dict,
                 record: _GraphRecord, label: str) -> Callable:
        """``fn`` behind a check that the frozen weights are still the model's (freeze.py)."""
        from .freeze import FrozenGraph, placeholder_positions

        where = placeholder_positions(gm)

        def rebuild(consts: dict) -> Callable:
            # the plan in force (policy measure installed its choice at the first call)
            # built around other constants; pieces are new, so they compile again
            new, records = self._build(record.plan, consts, label, {})
            self._replace_plan(record, record.plan, records)
            with self._lock:
                record.constants = len(consts)
                record.constant_nodes = frozenset(consts)
                record.weights_as_inputs = not consts
            return new

        return FrozenGraph(fn, constants, {n: where[n] for n in constants}, rebuild,
                           record.weight_events, label, self.config.refreeze_limit)

    def _build(self, plan: Plan, constants: dict, label: str,
               pieces: dict) -> tuple[Callable, dict[int, PieceRecord]]:
        """The stitched module of ``plan``, reusing pieces from ``pieces`` (updated)."""
        records: dict[int, PieceRecord] = {}
        runners = {}
        inline = set()
        for part in plan.partitions:
            chain = self.chain_for(plan, part)
            if chain[0].inline_aten or self.dry_run:
                record = PieceRecord(part.id, part.backend, [b.name for b in chain])
                record.backend = part.backend if not self.dry_run else ""
                records[part.id] = record
                inline.add(part.id)
                continue
            names = tuple(n.name for n in part.nodes)
            key = (tuple(b.name for b in chain), names)
            if key not in pieces:
                record = PieceRecord(part.id, part.backend, [b.name for b in chain])
                sub = extract(plan, part, constants)
                piece = Piece(record, sub.gm, chain, label, verify=self.config.verify)
                piece.node_names = names  # measure.py keys per-partition timings by it
                self._track(piece)
                pieces[key] = (sub, piece)
            sub, piece = pieces[key]
            records[part.id] = piece.record
            runners[part.id] = (sub, piece)
        return stitch(plan, runners, inline), records

    def _replace_plan(self, record: _GraphRecord, plan: Plan,
                      records: dict[int, PieceRecord]) -> None:
        """Install the plan a policy chose at the first call (measure.py)."""
        for part in plan.partitions:
            records[part.id].partition_id = part.id
        with self._lock:
            record.plan = plan
            record.records = records

    # -- reporting -------------------------------------------------------------------
    def set_timing(self, on: bool) -> None:
        """Time every piece's calls (``calls``/``run_s`` in the report) from now on.

        Applies to pieces compiled later too. Inline (eager) partitions are not pieces:
        their time is only part of the whole call's."""
        with self._lock:
            self._timed = bool(on)
            for piece in self._pieces:
                piece.timed = self._timed

    def _track(self, piece: Piece) -> None:
        with self._lock:
            piece.timed = self._timed
            self._pieces.add(piece)

    def report(self, *, advice: bool = True) -> Report:
        """What ran where: built from the live records, so fallbacks show at once.

        ``advice`` replans each graph under other settings (fast: planning is linear)."""
        from .capability import MUTATES, NOT_ATEN, RANDOM, SCALAR
        from .report_advice import advise

        statuses = []
        versions = {"python": platform.python_version(), "torch": torch.__version__,
                    "arbiter": _arbiter_version()}
        for name, backend in self.backends.items():
            ok = name not in self.unavailable
            version = _safe_version(backend) if ok else None
            statuses.append(BackendStatus(name=name, available=ok,
                                          reason=self.unavailable.get(name, ""),
                                          version=version))
            versions[name] = version or ("unavailable" if not ok else "unknown")
        with self._lock:
            graphs = list(self._graphs)
        tips = advise([g.plan for g in graphs], self.table, self.config.min_block_size,
                      (MUTATES, NOT_ATEN, RANDOM, SCALAR)) if advice else []
        return Report(config=self.config.source, dry_run=self.dry_run, backends=statuses,
                      config_dump=self.config.model_dump(mode="json"), versions=versions,
                      advice=tips, graphs=[_graph_report(g, self.backends) for g in graphs],
                      resources={} if self.dry_run else _resources_in_force())


def _resources_in_force() -> dict:
    from .resources import in_force

    return in_force()


def _arbiter_version() -> str:
    from . import __version__

    return __version__


def _safe_version(backend: Backend) -> Optional[str]:
    try:
        return backend.version()
    except Exception:  # noqa: BLE001 - a version probe must not break a report
        return None


def _manifest_digest(backend: Backend) -> Optional[str]:
    """A short digest of the backend's manifest (what it declares it can run)."""
    import hashlib

    try:
        return hashlib.sha256(backend.manifest().model_dump_json().encode()).hexdigest()[:16]
    except Exception:  # noqa: BLE001 - an unreadable manifest fails planning, not this
        return None


def _graph_report(g: _GraphRecord, backends: dict[str, Backend]) -> GraphReport:
    from .report_build import boundaries, coverage, node_reports, op_reports

    parts = []
    for p in g.plan.partitions:
        rec = g.records[p.id]
        compute = [n for n in p.nodes if not is_getitem(n)]
        inputs, outputs = boundaries(p, g.constant_nodes)
        parts.append(PartitionReport(
            id=p.id, planned_backend=p.backend,
            backend=rec.backend or "(not compiled yet)",
            nodes=len(compute), ops=dict(Counter(op_name(n.target) for n in compute)),
            node_names=[n.name for n in compute], chain=rec.chain,
            fallbacks=[FallbackReport(from_backend=f.from_backend, to_backend=f.to_backend,
                                      stage=f.stage, reason=f.reason) for f in rec.fallbacks],
            compile_s=round(rec.compile_s, 4), calls=rec.calls, run_s=round(rec.run_s, 6),
            copies=rec.copies, restride_copies=rec.restride_copies,
            verify_checks=rec.verify_checks, verify_max_error=rec.verify_max_error,
            measured_ms=g.plan.measured_ms.get(p.id, {}),
            inputs=inputs, outputs=outputs,
            bytes_in=sum(t.bytes or 0 for t in inputs if t.source == "partition"),
            graph_input_bytes=sum(t.bytes or 0 for t in inputs if t.source == "graph input"),
            constant_bytes=sum(t.bytes or 0 for t in inputs if t.source == "constant"),
            bytes_out=sum(t.bytes or 0 for t in outputs),
            inline=backends[p.backend].inline_aten if p.backend in backends else False))
    refusals: Counter = Counter()
    for node, sup in g.plan.support.items():
        if is_getitem(node):
            continue
        for backend, reason in sup.refusals.items():
            refusals[(op_name(node.target), backend, reason)] += 1
    placement: Counter = Counter()
    for x in parts:
        # Not compiled yet (a dry run, or before the first call): the plan, labelled so.
        placement[x.backend if x.backend != "(not compiled yet)"
                  else f"{x.planned_backend} (planned)"] += x.nodes
    return GraphReport(
        graph_id=g.graph_id, kind=g.kind, nodes=sum(x.nodes for x in parts), partitions=parts,
        refusals=[RefusalReport(op=o, backend=b, reason=r, nodes=c)
                  for (o, b, r), c in sorted(refusals.items())],
        constants=g.constants, plan_s=round(g.plan_s, 5), policy=g.plan.policy,
        weight_events=[WeightEventReport(reason=e.reason, action=e.action)
                       for e in g.weight_events],
        weights_as_inputs=g.weights_as_inputs,
        chosen=getattr(g.plan, "chosen", ""),
        candidates_ms=dict(getattr(g.plan, "candidates_ms", {}) or {}),
        estimates_ms=dict(getattr(g.plan, "estimates_ms", {}) or {}),
        ops=op_reports(g.plan, backends, {x.id: x.backend if x.backend != "(not compiled yet)"
                                          else f"{x.planned_backend} (planned)"
                                          for x in parts}),
        coverage=coverage(g.plan, backends),
        placement=dict(sorted(placement.items())), graph=node_reports(g.plan))
