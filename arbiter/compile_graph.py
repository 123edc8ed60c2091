"""One ATen graph compiled for an ``Arbiter``, and its record kept.

Its passes (run/passes.py), the policy's plan (plan/policy.py), its pieces built
(run/build.py), timed on the first call when the policy measures (measure/graph.py),
behind a frozen-weight guard (run/freeze.py), and its ``GraphRecord`` for the report."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Optional

import torch.fx

from .config import Config
from .measure.calibration import Calibrations
from .measure.graph import GraphToMeasure, MeasuredGraph
from .plan.partition import Plan
from .plan.planner import Planner
from .plan.policy import PRIORITY, Choice, GraphContext, Policy
from .plan.rules import RuleWatch
from .report.from_record import SHAPE_EAGER_WARN, quantization_warning, shape_eager_share
from .run import passes
from .run.build import Builder
from .run.freeze import FrozenGraph, placeholder_positions
from .run.owner import UNKNOWN, Owner
from .run.piece import PieceRecord
from .run.record import GraphRecord
from .run.resources import spin_follows
from .shapes import input_values, symbols

log = logging.getLogger(__name__)


class GraphCompiler:
    """Compiles the graphs of one Arbiter (its config, planner, policy, builder) and keeps
    their records (``graphs``)."""

    def __init__(self, config: Config, planner: Planner, policy: Policy, builder: Builder,
                 calibrations: Calibrations, cache: Any, rule_watch: RuleWatch, *,
                 dry_run: bool, split_dropout: bool):
        self.config = config
        self.planner = planner
        self.policy = policy
        self.builder = builder
        self.calibrations = calibrations
        self.cache = cache
        self.rule_watch = rule_watch
        self.dry_run = dry_run
        self._optional = ("split_dropout",) if split_dropout else ()
        #: `spin: auto` follows each plan (set when the resources are applied)
        self.spin_follows = False
        self.lock = threading.Lock()
        self._graphs: list[GraphRecord] = []
        self._frames: dict[int, set[int]] = {}  # Dynamo frame id -> its compile indices
        self._sizes: dict[tuple, set] = {}  # (frame id, kind) -> its graphs' input sizes

    @property
    def graphs(self) -> list[GraphRecord]:
        with self.lock:
            return list(self._graphs)

    def compile(self, gm: torch.fx.GraphModule, kind: str,
                constants: dict[torch.fx.Node, torch.Tensor], owner: Owner = UNKNOWN,
                guard: bool = True, started: Optional[float] = None,
                exported: bool = False, keep: Optional[list] = None) -> Callable:
        """The callable of ``gm`` (a graph of ``kind``; ``constants``: frozen weights baked
        into its partitions, ``guard``: checked on every call); ``started``: when arbiter
        began on this graph (before AOTAutograd's trace), for measure's compile bound;
        ``exported``: a graph of ``arbiter.export`` (run/passes.py); ``keep``: a list the
        graph's record is appended to."""
        start = time.perf_counter()
        passes.apply(gm, kind, exported=exported, wanted=self._optional)
        syms = symbols(input_values(gm))
        context = GraphContext(kind, symbolic=bool(syms), against_eager="off"
                               if self.dry_run else self.config.against_eager)
        calibrating = self.calibrations.measuring_s
        choice = self.policy.decide(self.planner, gm, context)
        self.follow_spin(choice.plan)
        # the machine's calibration, measured on first need, is no graph's planning
        plan_s = time.perf_counter() - start - (self.calibrations.measuring_s - calibrating)
        with self.lock:
            graph_id = len(self._graphs)
            frame = own_frame(self._frames, _compile_id())
            if frame is not None:
                self._sizes.setdefault((frame[0], kind), set()).add(input_sizes(gm))
        label = f"graph {graph_id} ({kind})"
        # Pieces shared by every plan of this graph, by (chain, nodes): a partition that
        # two candidates have in common compiles once.
        pieces: dict = {}

        def build(p: Plan) -> tuple[Callable, dict[int, PieceRecord]]:
            return self.builder.build(p, constants, label, pieces)

        stitched, records = build(choice.plan)
        with self.lock:
            record = GraphRecord(graph_id, kind, choice.plan, records, choice.outcome, plan_s,
                                 frozenset(constants), owner=owner, symbols=syms,
                                 frame=frame, support=every_verdict(choice))
            self._graphs.append(record)
            if keep is not None:
                keep.append(record)
        self.rule_watch.check(gm, kind, label)
        self._log(record, label, choice.outcome.policy)
        fn: Callable = stitched
        acc = self.config.accuracy
        if acc is not None:  # the report states the tolerance
            choice.outcome.tolerance = (acc.rtol, acc.atol)
        # what the policy has timed on the first call (measure/); a dry run times nothing
        timed = None if self.dry_run else choice.timed
        # config `accuracy`: the per-module search may find a placement even when every
        # whole-graph variant plan equals the policy's (a variant of a backend that runs
        # nothing of it in the policy's plan)
        per_module = acc is not None and acc.per_module and bool(self.planner.variants) \
            and context.lowered_ok
        if timed is not None and (len(timed.candidates) > 1 or per_module):
            def install(p: Plan, r: dict[int, PieceRecord]) -> None:
                self.follow_spin(p)
                self.install(record, p, r)
                # the placements not chosen: their pieces (compiled sessions) go with them
                keep = set(map(id, r.values()))
                for key in [k for k, (_, piece) in pieces.items()
                            if id(piece.record) not in keep]:
                    del pieces[key]

            def build_timed(c: Any) -> tuple[Callable, dict[int, PieceRecord]]:
                # a timed candidate's pieces compile right after (measure/timing.py),
                # with the spin for the backend holding most of it: each timed as it runs
                self.follow_spin(c.plan)
                return build(c.plan)

            graph = GraphToMeasure(gm, record, label, build_timed, install,
                                   before_s=time.perf_counter() - (started or start))
            fn = MeasuredGraph(timed, graph, self.planner, self.config.measure, self.cache,
                               accuracy=acc, per_module=per_module)
        if constants and not self.dry_run and guard:
            return self._guarded(fn, gm, constants, record, label)
        return fn

    def _log(self, record: GraphRecord, label: str, policy: str) -> None:
        plan = record.plan
        log.info("%s: %d nodes in %d partitions (%s), planned in %.1f ms (policy %s); "
                 "%d to compile", label,
                 sum(p.size for p in plan.partitions), len(plan.partitions),
                 ", ".join(sorted({p.backend for p in plan.partitions})), record.plan_s * 1e3,
                 policy, 0 if self.dry_run else sum(p.backend not in self.planner.inline
                                                    for p in plan.partitions))
        if record.frame and record.frame[1] >= 2 and not record.symbols:
            with self.lock:
                resized = len(self._sizes.get((record.frame[0], record.kind), ())) > 1
            limit = ("past torch._dynamo.config.recompile_limit it runs the frame in eager "
                     "without arbiter")
            why = (f"with other input sizes (static shapes each time); {limit}. "
                   "torch.compile(dynamic=None or True) lets one symbolic graph serve every "
                   "size" if resized else
                   "with the same input sizes: a guard other than a size failed "
                   "(TORCH_LOGS=recompiles names it; threads making a model's first calls "
                   f"at once do this); {limit}")
            log.warning("%s: Dynamo compiled this frame %d times %s", label,
                        record.frame[1] + 1, why)
        quantized = quantization_warning(record, self.planner.backends)
        if quantized and not self.dry_run:
            log.warning("%s: %s", label, quantized)
        if record.symbols:
            share = shape_eager_share(record, self.planner.backends)
            log.log(logging.WARNING if share > SHAPE_EAGER_WARN else logging.INFO,
                    "%s: symbolic shapes %s; %.0f%% of its compute planned in eager because "
                    "of them", label, ", ".join(f"{r.name} in [{r.min}, {r.max or 'inf'}]"
                                                for r in record.symbols.values()), share * 100)

    def follow_spin(self, plan: Plan) -> None:
        """`spin: auto` (inference): the backend holding most of ``plan`` gets this
        config's spin for the pieces compiled from now (run/resources.spin_follows)."""
        if self.spin_follows and not self.dry_run:
            spun = spin_follows(plan, {**self.planner.backends, **self.planner.variants},
                                self.planner.inline)
            if spun:
                log.info("resources: spin auto: %s's pools spin from now", spun)

    def _guarded(self, fn: Callable, gm: torch.fx.GraphModule, constants: dict,
                 record: GraphRecord, label: str) -> Callable:
        """``fn`` behind a check that the frozen weights are still the model's (freeze.py)."""
        where = placeholder_positions(gm)

        def rebuild(consts: dict) -> Callable:
            # the plan in force (policy measure installed its choice at the first call)
            # built around other constants; pieces are new, so they compile again
            new, records = self.builder.build(record.plan, consts, label, {})
            self.install(record, record.plan, records)
            with self.lock:
                record.constant_nodes = frozenset(consts)
                record.weights_as_inputs = not consts
            return new

        return FrozenGraph(fn, constants, {n: where[n] for n in constants}, rebuild,
                           record.weight_events, label, self.config.refreeze_limit)

    def install(self, record: GraphRecord, plan: Plan, records: dict[int, PieceRecord]) -> None:
        """Put ``plan`` and its pieces' records on the graph's record (a policy's choice
        at the first call, or pieces rebuilt around re-frozen weights)."""
        for part in plan.partitions:
            records[part.id].partition_id = part.id
        with self.lock:
            record.plan = plan
            record.records = records


def every_verdict(choice: Choice) -> Optional[dict]:
    """The priority plan's node verdicts (what every configured backend said of each
    node) when the policy weighed it among other candidates, whose own plans know only
    their backends; None where the chosen plan is the only one made."""
    for c in choice.candidates:
        if c.label == PRIORITY:
            return c.plan.support
    return None


def own_frame(frames: dict, frame: Optional[tuple[int, int]]) -> Optional[tuple[int, int]]:
    """``frame`` (Dynamo's frame id, its compile index) with the index counted among the
    compiles of that frame in ``frames`` (one Arbiter's) alone: a frame Dynamo compiled
    before for another backend or config (one model compiled with three configs, to
    compare them) is no recompile of this Arbiter's."""
    if frame is None:
        return None
    seen = frames.setdefault(frame[0], set())
    index = sum(1 for i in seen if i < frame[1])
    seen.add(frame[1])
    return (frame[0], index)


def input_sizes(gm: torch.fx.GraphModule) -> tuple:
    """The sizes of ``gm``'s tensor inputs, as traced (symbols as text)."""
    return tuple(tuple(str(d) for d in v.shape) if isinstance(v, torch.Tensor) else None
                 for v in input_values(gm))


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
