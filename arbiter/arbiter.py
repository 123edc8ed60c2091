"""``Arbiter``: the torch.compile backend that splits graphs across backends.

Orchestration only: each stage lives in its own module. Call hierarchy for one Dynamo
graph::

    Arbiter.__call__(gm, example_inputs)          # Dynamo hands us a Torch-IR graph
      run.lower.lower                             # AOTAutograd -> ATen graphs
        Arbiter._compile_graph(graph, kind)       # once per inference/forward/backward graph
          policy.choose(planner, graph)           # plan.policy: who runs what
          run.split.extract / run.piece.Piece     # one lazily compiled piece per partition
          run.split.stitch                        # one GraphModule calling the pieces
                                                  # (run.split.Direct: one piece, called)
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
from types import SimpleNamespace
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from ._version import __version__
from .cache import from_options as cache_from_options
from .capability import MUTATES, NOT_ATEN, RANDOM, SCALAR
from .config import Config, ConfigLike, load_config
from .decompose import split_dropout
from .errors import ConfigError, warn_at_user_line
from .findings import findings
from .ops import op_name
from .plan.partition import Plan
from .plan.planner import Planner, safe_version
from .plan.policy import checked_candidates, get_policy
from .plan.rules import graph_ops, names, pending_backward_ops, unmatched_message
from .registry import Backend, get_backend_class, install_advice
from .report import BackendStatus, GraphBreakReport, Report
from .report.advice import advise
from .report.build import (SHAPE_EAGER_WARN, distributed_report, graph_report,
                           kind_reports, shape_eager_share)
from .run.dynamic import chain_labels, shape_chain
from .run.first_use import FirstUse
from .run.freeze import FrozenGraph, placeholder_positions
from .run.isolation import tracing_in_this_thread
from .run.lower import decomposition_table, lower
from .run.measured import EAGER_MARGIN, MeasuredGraph
from .run.piece import Piece, PieceRecord
from .run.owner import UNKNOWN, Owner, current_owner, matches, owner_of
from .run.record import DynamoGraph, GraphRecord, dynamo_graph
from .run.resources import apply as apply_resources
from .run.resources import in_force as resources_in_force
from .run.split import extract, stitch
from .run.verify import uniform_tolerances
from .shapes import input_values, symbols

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
            cls = get_backend_class(name)
            backend = cls(cls.Options.model_validate(self.config.options_for(name)))
            if name in self.config.manifests:  # a user's manifest (`arbiter probe --out`)
                backend.use_manifest(self.config.manifests[name])
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
                hint = install_advice(cls)  # only when a package it needs is missing
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
        self._first_use = FirstUse(self.config.verify.tolerances)
        self.planner = Planner(
            self.backends, self.unavailable, exclude_ops=self.config.exclude_ops,
            pin=self.config.pin, min_block_size=self.config.min_block_size,
            max_specializations=self.config.shapes.max_specializations,
            random=self.config.random,
            decision_config=self.config.model_dump(mode="json", include={
                "backends", "fallback", "min_block_size", "exclude_ops", "pin",
                "decompositions", "freeze_weights", "manifests", "shapes", "accuracy",
                "policy", "random", "against_eager"}))
        self._lowered_verify = None
        if self.config.accuracy is not None and not dry_run:
            self._add_variants()
        self.policy = get_policy(self.config.policy if not dry_run else "priority")
        self._graphs: list[GraphRecord] = []
        self._dynamo_graphs: list[DynamoGraph] = []  # what Dynamo handed us, in order
        self._lock = threading.Lock()
        # every live compiled-by-a-backend piece (set_timing); weak, so pieces replaced
        # when weights are re-frozen are freed with their sessions and weights
        self._pieces: weakref.WeakSet[Piece] = weakref.WeakSet()
        self._timed = False
        # The config's decompositions apply to the whole graph, when it is lowered; a
        # backend's (its manifest's) only to the nodes it takes (arbiter/decompose.py).
        self._decompositions = decomposition_table(self.config.decompositions)
        self._decomposed = sorted({op_name(k) for k in self._decompositions})
        # random: eager draws dropout masks apart from the data (decompose.split_dropout),
        # unless a pin or exclude names the dropout (the user's rule then sees it whole)
        self._split_dropout = self.config.random == "eager" and not any(
            names(op, "aten.native_dropout.default")
            for op in (*self.config.exclude_ops, *self.config.pin))
        self._seen_ops: set[str] = set()  # ops of every graph compiled (pins, excludes)
        self._warned: set = set()
        # one thread budget and arena per process, applied at the first graph (before any
        # compile): `spin: auto` depends on whether that graph trains (apply_resources)
        self._resources_applied = dry_run

    def apply_resources(self, training: bool = False) -> dict[str, Any]:
        """Apply the config's ``resources:`` now (run/resources.py; the first Arbiter of
        the process fixes the budget) and return the settings in force. Done by itself
        at this Arbiter's first graph, with ``training`` true when that graph trains
        (grad mode on, an input that requires grad: AOTAutograd makes a forward and a
        backward graph), which ``spin: auto`` reads (docs/resources.md); call it first
        to use a backend's sessions before any compile."""
        self._resources_applied = True
        settings = apply_resources(self.config.resources,
                                   [b for n, b in self.backends.items()
                                    if n not in self.unavailable],
                                   first_backend=self.config.backends[0].name,
                                   training=training)
        for variant in self.planner.variants.values():  # lower precision: its base's
            variant.use_budget(self.backends[variant.base_name].budget)
        return settings

    def _add_variants(self) -> None:
        """Config `accuracy`: the lower-precision variants the configured backends offer
        become candidates (``Planner.variants``), checked while they run one call in
        ``accuracy.every_n`` with that tolerance (docs/precision.md)."""
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
        self._lowered_verify = SimpleNamespace(
            mode="every", every_n=acc.every_n,
            tolerances=uniform_tolerances(acc.rtol, acc.atol))
        log.info("accuracy rtol %g, atol %g: lower-precision candidates %s", acc.rtol,
                 acc.atol, ", ".join(self.planner.variants) or "none (no backend offers one)")

    # -- torch.compile backend -------------------------------------------------------
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 **kwargs: Any) -> Callable:
        if kwargs:  # torch.compile(backend=Arbiter(...), mode=... or options=...)
            raise ConfigError(
                f"torch.compile({', '.join(f'{k}=...' for k in sorted(kwargs))}) with an "
                "Arbiter instance: its config is fixed when it is made; put the settings in "
                "Arbiter(config), or use backend=\"arbiter\", which reads options and mode",
                file="torch.compile(...)", key=sorted(kwargs)[0])
        owner = current_owner()  # the compiled model this graph belongs to (its report)
        if not self._resources_applied:
            self.apply_resources(training=torch.is_grad_enabled() and any(
                isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs))
        with self._lock:
            first = not self._dynamo_graphs
            self._dynamo_graphs.append(dynamo_graph(gm, owner))
        if first:
            with _ARBITERS_LOCK:
                _ARBITERS.append(weakref.ref(self))

        def compile_graph(graph: torch.fx.GraphModule, kind: str, constants: dict) -> Callable:
            # the backward graph compiles later, at the first backward: owner kept here
            return self._compile_graph(graph, kind, constants, owner=owner)

        # AOTAutograd traces (make_fx) here; keep its process-global tracing state from
        # threads running compiled graphs meanwhile (run/isolation.py)
        with tracing_in_this_thread():
            return lower(gm, example_inputs, compile_graph,
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
                       constants: dict[torch.fx.Node, torch.Tensor],
                       owner: Owner = UNKNOWN) -> Callable:
        start = time.perf_counter()
        if self._split_dropout:  # eager's dropout masks, drawn apart from the data
            split_dropout(gm)
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
                             frozenset(constants), owner=owner,
                             symbols=symbols(input_values(gm)), frame=_compile_id())
        with self._lock:
            self._graphs.append(record)
        self._check_rules(gm, kind, label)
        plan = choice.plan
        log.info("%s: %d nodes in %d partitions (%s), planned in %.1f ms (policy %s); "
                 "%d to compile", label,
                 sum(p.size for p in plan.partitions), len(plan.partitions),
                 ", ".join(sorted({p.backend for p in plan.partitions})), plan_s * 1e3,
                 choice.outcome.policy,
                 0 if self.dry_run else sum(p.backend not in self.planner.inline
                                            for p in plan.partitions))
        if record.frame and record.frame[1] >= 2 and not record.symbols:
            log.warning("%s: Dynamo compiled this frame %d times (static shapes each time); "
                        "past torch._dynamo.config.recompile_limit it runs the frame in "
                        "eager without arbiter. torch.compile(dynamic=None or True) lets one "
                        "symbolic graph serve every size", label, record.frame[1] + 1)
        if record.symbols:
            share = shape_eager_share(record, self.backends)
            log.log(logging.WARNING if share > SHAPE_EAGER_WARN else logging.INFO,
                    "%s: symbolic shapes %s; %.0f%% of its compute planned in eager because "
                    "of them", label, ", ".join(f"{r.name} in [{r.min}, {r.max or 'inf'}]"
                                                for r in record.symbols.values()), share * 100)
        fn: Callable = stitched
        cands, options = choice.candidates, self.config.measure
        timed, margin = self.policy.measures, 0.0
        if self.config.accuracy is not None:  # the report states the tolerance
            choice.outcome.tolerance = (self.config.accuracy.rtol, self.config.accuracy.atol)
        # lower precision: inference graphs of static shapes only (docs/precision.md)
        lowered_ok = kind == "inference" and not record.symbols
        if not lowered_ok:
            cands = [c for c in cands if not c.lowered]
        if not self.policy.measures and not self.dry_run:
            # a policy that does not time: its choice, timed on the first call against a
            # lower-precision variant of priority's plan that is within the tolerance
            # (`accuracy`), and against eager ATen (`against_eager`)
            variants = bool(self.planner.variants) and lowered_ok
            eager = self.config.against_eager == "all" or (
                self.config.against_eager == "training" and kind != "inference")
            if variants or eager:
                cands = checked_candidates(self.planner, gm, choice.plan,
                                           choice.outcome.chosen, variants=variants,
                                           eager=eager)
                options = options.model_copy(update={"refine": False, "mix": False})
                timed, margin = True, EAGER_MARGIN if eager else 0.0
                choice.outcome.against_eager = eager and len(cands) > 1
        if timed and len(cands) > 1:
            def install(p: Plan, r: dict[int, PieceRecord]) -> None:
                self._install(record, p, r)
                # the placements not chosen: their pieces (compiled sessions) go with them
                keep = set(map(id, r.values()))
                for key in [k for k, (_, piece) in pieces.items()
                            if id(piece.record) not in keep]:
                    del pieces[key]

            fn = MeasuredGraph(self.planner, options, self.cache, gm, constants,
                               cands, record, label, lambda c: build(c.plan), install,
                               accuracy=self.config.accuracy, margin=margin)
        if constants and not self.dry_run:
            return self._guarded(fn, gm, constants, record, label)
        return fn

    def _rules(self) -> list[tuple[str, str, str]]:
        return [("pin", op, b) for op, b in self.config.pin.items()] + \
            [("exclude", op, "") for op in self.config.exclude_ops]

    def _check_rules(self, gm: torch.fx.GraphModule, kind: str, label: str) -> None:
        """Warn (once per rule) about a pin or exclude that names no op of the graphs
        compiled so far. A forward graph is judged with its backward, which may hold the
        op: AOTAutograd made that graph already and compiles it at the first backward,
        which may never come (a forward with gradients on and no backward)."""
        rules = self._rules()
        if not rules:
            return
        with self._lock:
            self._seen_ops |= graph_ops(gm)
            seen = set(self._seen_ops)
        if kind == "forward":
            backward = pending_backward_ops()
            if backward is None:  # not found: wait for the backward's own compile
                return
            seen |= backward
            label += " and its backward"
        for rule, op, backend in rules:
            if (rule, op) in self._warned or any(names(op, o) for o in seen):
                continue
            self._warned.add((rule, op))
            msg = unmatched_message(rule, op, backend, seen, self._decomposed,
                                    where=f" in the graphs compiled so far (up to {label})")
            log.debug("%s", msg)
            warn_at_user_line(f"arbiter: {msg}")

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
                sub = extract(plan, part, constants)
                # symbolic shapes: views of the chain's backends (run/dynamic.py)
                per_shape = {b for n in part.nodes for b in plan.support[n].per_shape}
                chain = shape_chain(chain, sub.gm, per_shape,
                                    self.config.shapes.max_specializations,
                                    self.config.verify.tolerances, label)
                record = PieceRecord(part.id, part.backend, chain_labels(chain))
                piece = Piece(record, sub.gm, chain, label, verify=self.config.verify,
                              compile_timeout_s=self.config.compile_timeout_s,
                              lowered_verify=self._lowered_verify,
                              first_use=self._first_use)
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

    def _rule_warnings(self, graphs: list[GraphRecord], reports: list) -> list[str]:
        """Pins and excludes that apply to no node of ``graphs``; pins their backend did
        not take everywhere, with why (the report's ``warnings``)."""
        out = []
        seen = set().union(*(graph_ops(g.plan.graph_module) for g in graphs)) if graphs else set()
        for rule, op, backend in self._rules():
            if graphs and not any(names(op, o) for o in seen):
                out.append(unmatched_message(rule, op, backend, seen, self._decomposed))
        for r in reports:
            for rule in r.rules:
                if rule.kind == "pin" and rule.applied < rule.nodes:
                    why = "; ".join(f"{n} node(s): {w}" for w, n in rule.why_not.items())
                    out.append(f"pin {rule.op} -> {rule.backend}: {rule.applied} of "
                               f"{rule.nodes} node(s) of graph {r.graph_id} on {rule.backend}"
                               f"; {why}")
        return out

    def owners(self) -> list[Owner]:
        """The compiled models this Arbiter made graphs for, in order of their first graph."""
        with self._lock:
            seen = [g.owner for g in self._dynamo_graphs] + [g.owner for g in self._graphs]
        return list(dict.fromkeys(seen))

    def report(self, model: Any = None, *, advice: bool = True) -> Report:
        """What ran where: built from the live records, so fallbacks show at once.

        ``model``: only the graphs of that model (a compiled model, or the module or
        function that was compiled; run/owner.py); None: every graph this Arbiter
        compiled, each labelled with its model. ``advice`` replans each graph under
        other settings (fast: planning is linear). Dynamo's graph breaks are those seen
        while compiling (what ``torch._dynamo.explain`` would count)."""
        wanted = model if isinstance(model, Owner) or model is None else owner_of(model)
        statuses = []
        versions = {"python": platform.python_version(), "torch": torch.__version__,
                    "arbiter": __version__}
        for name, backend in self.backends.items():
            ok = name not in self.unavailable
            version = safe_version(backend) if ok else None
            statuses.append(BackendStatus(name=name, available=ok and name not in self.plans_only,
                                          reason=self.unavailable.get(name, "")
                                          or self.plans_only.get(name, ""),
                                          version=version, color=backend.color,
                                          plans_only=name in self.plans_only))
            versions[name] = version or ("unavailable" if not ok else "unknown")
        graphs = self.graphs
        with self._lock:
            dynamo = list(self._dynamo_graphs)
        if wanted is not None:
            graphs = [g for g in graphs if matches(g.owner, wanted)]
            dynamo = [d for d in dynamo if matches(d.owner, wanted)]
        breaks = GraphBreakReport(graphs=len(dynamo), breaks=sum(d.graph_break for d in dynamo),
                                  reasons=[d.reason for d in dynamo if d.graph_break]) \
            if dynamo else None
        tips = advise([g.plan for g in graphs], self.planner.table, self.config.min_block_size,
                      (MUTATES, NOT_ATEN, RANDOM, SCALAR)) if advice else []
        names = list(dict.fromkeys(str(g.owner) for g in graphs))
        every = {**self.backends, **self.planner.variants}
        reports = [graph_report(g, every, self.config.pin, self.config.exclude_ops)
                   for g in graphs]
        return Report(config=self.config.source, dry_run=self.dry_run, backends=statuses,
                      model=str(wanted) if wanted is not None else ", ".join(names) or None,
                      graph_breaks=breaks,
                      config_dump=self.config.model_dump(mode="json"), versions=versions,
                      advice=tips, warnings=self._rule_warnings(graphs, reports),
                      graphs=reports,
                      kinds=kind_reports(reports, {n for n, b in every.items()
                                                   if b.inline_aten}),
                      distributed=distributed_report(reports),
                      resources={} if self.dry_run else resources_in_force())


def _compile_id():
    """(frame id, compile index of that frame) of the Dynamo compile under way, or None."""
    try:
        from torch._guards import CompileContext

        cid = CompileContext.current_compile_id()
    except Exception:  # noqa: BLE001 - not under Dynamo, or another torch
        return None
    if cid is None or getattr(cid, "frame_id", None) is None:
        return None
    return (int(cid.frame_id), int(cid.frame_compile_id or 0))
