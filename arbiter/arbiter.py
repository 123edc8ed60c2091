"""``Arbiter``: the torch.compile backend that splits graphs across backends.

Orchestration only: each stage lives in its own module. Call hierarchy for one Dynamo
graph::

    Arbiter.__call__(gm, example_inputs)          # Dynamo hands us a Torch-IR graph
      run.lower.lower                             # AOTAutograd -> ATen graphs
        Arbiter._compile_graph(graph, kind)       # once per inference/forward/backward graph
          policy.choose(planner, graph)           # plan.policy: who runs what
          run.split.extract / run.piece.Piece     # one lazily compiled piece per partition
          run.split.stitch                        # one GraphModule calling the pieces
          run.measured.MeasuredGraph              # a policy that times on the first call
          run.freeze.FrozenGraph                  # frozen weights checked on every call
    Arbiter.report()                              # report.build, from the live records
"""
from __future__ import annotations

import logging
import platform
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from ._version import __version__
from .cache import from_options as cache_from_options
from .capability import MUTATES, NOT_ATEN, RANDOM, SCALAR
from .config import Config, ConfigLike, load_config
from .plan.partition import Plan
from .plan.planner import Planner, safe_version
from .plan.policy import get_policy
from .registry import Backend, get_backend_class
from .report import BackendStatus, Report
from .report.advice import advise
from .report.build import graph_report
from .run.freeze import FrozenGraph, placeholder_positions
from .run.isolation import tracing_in_this_thread
from .run.lower import decomposition_table, lower
from .run.measured import MeasuredGraph
from .run.piece import Piece, PieceRecord
from .run.record import GraphRecord
from .run.resources import apply as apply_resources
from .run.resources import in_force as resources_in_force
from .run.split import extract, stitch

log = logging.getLogger(__name__)


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
        # The persistent cache (decisions and artifacts); None when off or unusable.
        self.cache = None if dry_run else cache_from_options(self.config.cache.enabled,
                                                             self.config.cache.dir,
                                                             self.config.cache.max_size_gb)
        for backend in self.backends.values():
            backend.artifact_cache = self.cache
        self.planner = Planner(
            self.backends, self.unavailable, exclude_ops=self.config.exclude_ops,
            pin=self.config.pin, min_block_size=self.config.min_block_size,
            decision_config=self.config.model_dump(mode="json", include={
                "backends", "fallback", "min_block_size", "exclude_ops", "pin",
                "decompositions", "freeze_weights"}))
        self.policy = get_policy(self.config.policy if not dry_run else "priority")
        self._graphs: list[GraphRecord] = []
        self._lock = threading.Lock()
        # every live compiled-by-a-backend piece (set_timing); weak, so pieces replaced
        # when weights are re-frozen are freed with their sessions and weights
        self._pieces: weakref.WeakSet[Piece] = weakref.WeakSet()
        self._timed = False
        names = list(self.config.decompositions)
        for name, backend in self.backends.items():
            if name not in self.unavailable:
                names += [d for d in backend.manifest().decompositions if d not in names]
        self._decompositions = decomposition_table(names)
        if not dry_run:  # one thread budget and arena per process, before any compile
            apply_resources(self.config.resources,
                            [b for n, b in self.backends.items() if n not in self.unavailable],
                            first_backend=self.config.backends[0].name)

    # -- torch.compile backend -------------------------------------------------------
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **_: Any) -> Callable:
        # AOTAutograd traces (make_fx) here; keep its process-global tracing state from
        # threads running compiled graphs meanwhile (run/isolation.py)
        with tracing_in_this_thread():
            return lower(gm, example_inputs, self._compile_graph,
                         decompositions=self._decompositions,
                         freeze_weights=self.config.freeze_weights)

    def plan(self, gm: torch.fx.GraphModule) -> Plan:
        """The priority plan for an ATen FX graph (nodes need ``meta["val"]``)."""
        return self.planner.plan(gm)

    @property
    def graphs(self) -> list[GraphRecord]:
        """The records of every graph compiled so far, in order."""
        with self._lock:
            return list(self._graphs)

    def _compile_graph(self, gm: torch.fx.GraphModule, kind: str,
                       constants: dict[torch.fx.Node, torch.Tensor]) -> Callable:
        start = time.perf_counter()
        choice = self.policy.choose(self.planner, gm)
        plan_s = time.perf_counter() - start
        with self._lock:
            graph_id = len(self._graphs)
        label = f"graph {graph_id} ({kind})"
        # Pieces shared by every plan of this graph, by (chain, nodes): a partition that
        # two candidates have in common compiles once.
        pieces: dict = {}

        def build(p: Plan) -> tuple[Callable, dict[int, PieceRecord]]:
            return self._build(p, constants, label, pieces)

        stitched, records = build(choice.plan)
        record = GraphRecord(graph_id, kind, choice.plan, records, choice.outcome, plan_s,
                             frozenset(constants))
        with self._lock:
            self._graphs.append(record)
        plan = choice.plan
        log.info("%s: %d nodes in %d partitions (%s), planned in %.1f ms (policy %s)", label,
                 sum(p.size for p in plan.partitions), len(plan.partitions),
                 ", ".join(sorted({p.backend for p in plan.partitions})), plan_s * 1e3,
                 choice.outcome.policy)
        fn: Callable = stitched
        if self.policy.measures and len(choice.candidates) > 1:
            fn = MeasuredGraph(self.planner, self.config.measure, self.cache, gm, constants,
                               choice.candidates, record, label, lambda c: build(c.plan),
                               lambda p, r: self._install(record, p, r))
        if constants and not self.dry_run:
            return self._guarded(fn, gm, constants, record, label)
        return fn

    def _guarded(self, fn: Callable, gm: torch.fx.GraphModule, constants: dict,
                 record: GraphRecord, label: str) -> Callable:
        """``fn`` behind a check that the frozen weights are still the model's (freeze.py)."""
        where = placeholder_positions(gm)

        def rebuild(consts: dict) -> Callable:
            # the plan in force (policy measure installed its choice at the first call)
            # built around other constants; pieces are new, so they compile again
            new, records = self._build(record.plan, consts, label, {})
            self._install(record, record.plan, records)
            with self._lock:
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
            chain = self.planner.chain_for(plan, part)
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
                piece = Piece(record, sub.gm, chain, label, verify=self.config.verify,
                              compile_timeout_s=self.config.compile_timeout_s)
                piece.node_names = names  # measured.py keys per-partition timings by it
                self._track(piece)
                pieces[key] = (sub, piece)
            sub, piece = pieces[key]
            records[part.id] = piece.record
            runners[part.id] = (sub, piece)
        return stitch(plan, runners, inline), records

    def _install(self, record: GraphRecord, plan: Plan, records: dict[int, PieceRecord]) -> None:
        """Put ``plan`` and its pieces' records on the graph's record (a policy's choice
        at the first call, or pieces rebuilt around re-frozen weights)."""
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
        statuses = []
        versions = {"python": platform.python_version(), "torch": torch.__version__,
                    "arbiter": __version__}
        for name, backend in self.backends.items():
            ok = name not in self.unavailable
            version = safe_version(backend) if ok else None
            statuses.append(BackendStatus(name=name, available=ok,
                                          reason=self.unavailable.get(name, ""),
                                          version=version))
            versions[name] = version or ("unavailable" if not ok else "unknown")
        graphs = self.graphs
        tips = advise([g.plan for g in graphs], self.planner.table, self.config.min_block_size,
                      (MUTATES, NOT_ATEN, RANDOM, SCALAR)) if advice else []
        return Report(config=self.config.source, dry_run=self.dry_run, backends=statuses,
                      config_dump=self.config.model_dump(mode="json"), versions=versions,
                      advice=tips, graphs=[graph_report(g, self.backends) for g in graphs],
                      resources={} if self.dry_run else resources_in_force())

