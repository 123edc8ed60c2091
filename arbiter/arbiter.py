"""``Arbiter``: the torch.compile backend that splits graphs across backends.

The session: the config's backends, planner, policy, calibration and resources, the
graphs Dynamo handed it and their records; each stage lives in its own module. Call
hierarchy for one Dynamo graph::

    Arbiter.__call__(gm, example_inputs)          # Dynamo hands us a Torch-IR graph
      run.lower.lower                             # AOTAutograd -> ATen graphs
        GraphCompiler.compile(graph, kind)        # compile_graph.py: once per graph kind
          run.passes.apply                        # the graph passes, in one order
          policy.decide(planner, graph, context)  # plan.policy: who runs what, what is timed
          run.split.extract / run.piece.Piece     # one lazily compiled piece per partition
          run.split.stitch                        # one GraphModule calling the pieces
                                                  # (run.split.Direct: one piece, called)
          measure.graph.MeasuredGraph             # Choice.timed: timed on the first call
          run.freeze.FrozenGraph                  # frozen weights checked on every call
    Arbiter.report()                              # report.assemble, from the live records
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from .cache import from_options as cache_from_options
from .config import Config, ConfigLike, VerifyOptions, load_config
from .errors import ConfigError
from .plan.findings import findings
from .measure.calibration import Calibrations
from .ops import op_name
from .compile_graph import GraphCompiler
from .plan.partition import Plan
from .plan.planner import Planner
from .plan.policy import get_policy
from .plan.rules import RuleWatch, config_rules, names
from .backend import Backend
from .registry import install_advice
from .report import Report
from .report.assemble import assemble
from .run.build import Builder, instantiate
from .run.checks.first_use import FirstUse
from .run.isolation import tracing_in_this_thread
from .run.lower import decomposition_table, lower
from .run.owner import Owner, current_owner, matches, owner_of
from .run.piece import Piece
from .run.record import DynamoGraph, GraphRecord, dynamo_graph
from .run.resources import apply as apply_resources
from .run.step import StepChoice

log = logging.getLogger(__name__)

#: every Arbiter that compiled a graph, in order of its first graph (weakly held)
_ARBITERS: list = []
_ARBITERS_LOCK = threading.Lock()


def arbiters() -> list["Arbiter"]:
    """The live Arbiters that compiled a graph in this process, oldest first."""
    with _ARBITERS_LOCK:
        _ARBITERS[:] = [r for r in _ARBITERS if r() is not None]
        return [b for b in (r() for r in _ARBITERS) if b is not None]


def forget(dropped: Sequence["Arbiter"]) -> None:
    """Leave ``dropped`` out of ``arbiters()`` (Dynamo was reset: their graphs are gone)."""
    ids = {id(b) for b in dropped}
    with _ARBITERS_LOCK:
        _ARBITERS[:] = [r for r in _ARBITERS if r() is not None and id(r()) not in ids]


def _plannable(backend: Backend) -> bool:
    try:
        return bool(backend.plannable()[0])
    except Exception:  # noqa: BLE001 - a broken install plans nothing
        return False


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
        self.plans_only: dict[str, str] = {}  # dry runs: cannot run here, planned onto
        for name in self.config.chain_names():
            backend = instantiate(self.config, name)
            try:
                ok, why = backend.available()
            except Exception as exc:  # noqa: BLE001 - a broken install (not only ImportError)
                ok, why = False, f"broken: {type(exc).__name__}: {exc}"
            if not ok and dry_run and _plannable(backend):
                # builds and plans here, cannot run here (TensorRT without CUDA): a dry run
                # plans onto it and the report says it cannot run
                self.plans_only[name] = why
                log.info("backend %s cannot run here (%s); the dry run plans onto it", name, why)
            elif not ok:
                hint = install_advice(type(backend))  # only when a package it needs is missing
                self.unavailable[name] = why + hint
                log.warning("backend %s is unavailable: %s%s", name, why, hint)
            self.backends[name] = backend
        # The persistent cache (decisions and artifacts); None when off or unusable.
        self.cache = None if dry_run else cache_from_options(self.config.cache.enabled,
                                                             self.config.cache.dir,
                                                             self.config.cache.max_size_gb)
        for backend in self.backends.values():
            backend.artifact_cache = self.cache
        findings().attach(self.cache)  # what first-use checks found, kept between processes
        self.planner = Planner(
            self.backends, self.unavailable, exclude_ops=self.config.exclude_ops,
            pin=self.config.pin, min_block_size=self.config.min_block_size,
            max_specializations=self.config.shapes.max_specializations,
            random=self.config.random,
            decision_config=self.config.decision_settings())
        lowered_verify = None
        if self.config.accuracy is not None and not dry_run:
            lowered_verify = self._add_variants()
        self._builder = Builder(self.planner, self.config, dry_run=dry_run,
                                lowered_verify=lowered_verify,
                                first_use=FirstUse(self.config.verify.tolerances),
                                track=self._track)
        self.policy = get_policy(self.config.policy)
        if dry_run and not self.policy.dry_runs:
            self.policy = get_policy("priority")
        self.calibrations = self._calibrations()
        self._dynamo_graphs: list[DynamoGraph] = []  # what Dynamo handed us, in order
        # every live compiled-by-a-backend piece (set_timing); weak, so pieces replaced
        # when weights are re-frozen are freed with their sessions and weights
        self._pieces: weakref.WeakSet[Piece] = weakref.WeakSet()
        self._timed = False
        # The config's decompositions apply to the whole graph, when it is lowered; a
        # backend's (its manifest's) only to the nodes it takes (arbiter/decompose/).
        self._decompositions = decomposition_table(self.config.decompositions)
        self._decomposed = sorted({op_name(k) for k in self._decompositions})
        # random: eager draws dropout masks apart from the data (decompose.split_dropout),
        # unless a pin or exclude names the dropout (the user's rule then sees it whole)
        split = self.config.random == "eager" and not any(
            names(op, "aten.native_dropout.default")
            for op in (*self.config.exclude_ops, *self.config.pin))
        # pins and excludes that name no op of the graphs compiled so far: warned once
        self._rule_watch = RuleWatch(config_rules(self.config.pin, self.config.exclude_ops),
                                     self._decomposed)
        self.compiler = GraphCompiler(self.config, self.planner, self.policy, self._builder,
                                      self.calibrations, self.cache, self._rule_watch,
                                      dry_run=dry_run, split_dropout=split)
        self._lock = self.compiler.lock
        # one thread budget and arena per process, applied at the first graph (before any
        # compile): `spin: auto` depends on whether that graph trains (apply_resources)
        self._resources_applied = dry_run

    def _calibrations(self) -> Calibrations:
        """This machine's calibration (policy `calibrated`), read or measured when first
        needed; a dry run reads the cache but never measures."""
        opts = self.config.calibration
        cache = self.cache
        if self.dry_run and opts.file is None and self.policy.dry_runs:
            cache = cache_from_options(self.config.cache.enabled, self.config.cache.dir,
                                       self.config.cache.max_size_gb)
        calib = Calibrations(self.planner, cache, opts.file, opts.time_budget_s,
                             measure=not self.dry_run, progress=opts.progress)
        self.planner.calibration = calib.get
        self.planner.observe = calib.observe
        return calib

    def apply_resources(self, training: bool = False) -> dict[str, Any]:
        """Apply the config's ``resources:`` now (run/resources.py; the first Arbiter of
        the process fixes the budget) and return the settings in force. Done by itself
        at this Arbiter's first graph, with ``training`` true when that graph trains
        (grad mode on, an input that requires grad: AOTAutograd makes a forward and a
        backward graph), which ``spin: auto`` reads (docs/resources.md); call it first
        to use a backend's sessions before any compile."""
        self._resources_applied = True
        # `spin: auto` follows each graph's plan (run/resources.spin_follows), unless the
        # process's first graph trains (then no backend spins)
        self.compiler.spin_follows = self.config.resources.spin == "auto" and not training
        settings = apply_resources(self.config.resources,
                                   [b for n, b in self.backends.items()
                                    if n not in self.unavailable],
                                   first_backend=self.config.backends[0].name,
                                   training=training)
        for variant in self.planner.variants.values():  # lower precision: its base's
            variant.use_budget(self.backends[variant.base_name].budget)
        return settings

    def _add_variants(self) -> VerifyOptions:
        """Config `accuracy`: the lower-precision variants the configured backends offer
        become candidates (``Planner.variants``); returns how their pieces are checked
        while they run: not one by one (a partition's outputs are not the graph's, and
        the bound is the graph's): the graph is, one call in ``accuracy.every_n``, by its
        measured callable (arbiter/measure/drift.py, docs/precision.md)."""
        acc = self.config.accuracy
        for spec in self.config.backends:
            backend = self.backends[spec.name]
            if spec.name in self.unavailable or backend.inline_aten:
                continue
            try:
                offered = backend.precision_variants()
            except Exception as exc:  # noqa: BLE001 - a backend that cannot say offers none
                log.warning("backend %s: cannot list its lower-precision variants (%s)",
                            spec.name, exc)
                continue
            for label, opts in offered.items():
                options = type(backend).Options.model_validate({**spec.options, **opts})
                variant = backend.variant(label, options)
                self.planner.variants[variant.name] = variant
        log.info("accuracy %s: lower-precision candidates %s", acc.describe(),
                 ", ".join(self.planner.variants) or "none (no backend offers one)")
        return VerifyOptions(mode="off")

    # -- torch.compile backend -------------------------------------------------------
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 **kwargs: Any) -> Callable:
        if kwargs:  # torch.compile(backend=Arbiter(...), mode=... or options=...)
            raise ConfigError(
                f"torch.compile({', '.join(f'{k}=...' for k in sorted(kwargs))}) with an "
                "Arbiter instance: its config is fixed when it is made; put the settings in "
                "Arbiter(config), or use backend=\"arbiter\", which reads options and mode",
                file="torch.compile(...)", key=sorted(kwargs)[0])
        called = time.perf_counter()  # measure's bound counts arbiter's trace and planning
        owner = current_owner()  # the compiled model this graph belongs to (its report)
        if not self._resources_applied:
            self.apply_resources(training=torch.is_grad_enabled() and any(
                isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs))
        handed = dynamo_graph(gm, owner)
        with self._lock:
            first = not self._dynamo_graphs
            self._dynamo_graphs.append(handed)
        if first:
            with _ARBITERS_LOCK:
                _ARBITERS.append(weakref.ref(self))

        records: list[GraphRecord] = []  # this Dynamo graph's, as they compile

        def compile_graph(graph: torch.fx.GraphModule, kind: str, constants: dict) -> Callable:
            # the backward graph compiles later, at the first backward: owner kept here
            return self.compiler.compile(graph, kind, constants, owner=owner,
                                         started=None if kind == "backward" else called,
                                         keep=records)

        # AOTAutograd traces (make_fx) here; keep its process-global tracing state from
        # threads running compiled graphs meanwhile (run/isolation.py)
        try:
            with tracing_in_this_thread():
                fn = lower(gm, example_inputs, compile_graph,
                           decompositions=self._decompositions,
                           freeze_weights=self.config.freeze_weights)
        except torch._dynamo.exc.RestartAnalysis:
            # Dynamo restarts its trace (a scalar it tensorifies) and hands the graph
            # over again: this one was no graph of the model (the report counted it)
            with self._lock:
                self._dynamo_graphs = [g for g in self._dynamo_graphs if g is not handed]
            raise
        if self.dry_run or not any(r.kind == "forward" for r in records):
            return fn
        # a graph that trains: its plan against Dynamo's own graph in eager (run/step.py)
        return StepChoice(fn, gm, records, self.planner.inline,
                          trial=self.config.against_eager != "off",
                          label=f"graph {records[0].graph_id} (forward and its backward)")

    def plan(self, gm: torch.fx.GraphModule) -> Plan:
        """The priority plan for an ATen FX graph (nodes need ``meta["val"]``)."""
        return self.planner.plan(gm)

    @property
    def graphs(self) -> list[GraphRecord]:
        """The records of every graph compiled so far, in order."""
        return self.compiler.graphs

    def compile_exported(self, gm: torch.fx.GraphModule,
                         constants: dict[torch.fx.Node, torch.Tensor],
                         owner: Owner) -> tuple[Callable, GraphRecord]:
        """An inference ATen graph that did not come through Dynamo (torch.export's:
        arbiter.deploy) planned and built as ``__call__`` builds Dynamo's, with
        ``constants`` baked in; the caller owns those weights, so no frozen-weight guard.
        Returns the callable (pieces compile at its first call) and the graph's record."""
        if not self._resources_applied:
            self.apply_resources(training=False)
        with _ARBITERS_LOCK:
            if not any(r() is self for r in _ARBITERS):
                _ARBITERS.append(weakref.ref(self))
        fn = self.compiler.compile(gm, "inference", constants, owner=owner, guard=False,
                                   exported=True)
        return fn, self.graphs[-1]

    def pieces_of(self, record: GraphRecord) -> dict[int, Piece]:
        """Partition id -> the live piece running it, for the graph of ``record``."""
        with self._lock:
            by_record = {id(p.record): p for p in self._pieces}
            return {pid: by_record[id(r)] for pid, r in record.records.items()
                    if id(r) in by_record}

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

    def owners(self) -> list[Owner]:
        """The compiled models this Arbiter made graphs for, in order of their first graph."""
        with self._lock:
            dynamo = [g.owner for g in self._dynamo_graphs]
        seen = dynamo + [g.owner for g in self.graphs]
        return list(dict.fromkeys(seen))

    def report(self, model: Any = None, *, advice: bool = True) -> Report:
        """What ran where: built from the live records, so fallbacks show at once.

        ``model``: only the graphs of that model (a compiled model, or the module or
        function that was compiled; run/owner.py); None: every graph this Arbiter
        compiled, each labelled with its model. ``advice`` replans each graph under
        other settings (fast: planning is linear). Dynamo's graph breaks are those seen
        while compiling (what ``torch._dynamo.explain`` would count)."""
        wanted = model if isinstance(model, Owner) or model is None else owner_of(model)
        graphs = self.graphs
        with self._lock:
            dynamo = list(self._dynamo_graphs)
        if wanted is not None:
            graphs = [g for g in graphs if matches(g.owner, wanted)]
            dynamo = [d for d in dynamo if matches(d.owner, wanted)]
        return assemble(self.config, self.planner, self.plans_only, graphs, dynamo,
                        model=None if wanted is None else str(wanted), rules=self._rule_watch.rules,
                        decomposed=self._decomposed, dry_run=self.dry_run, advice=advice)

