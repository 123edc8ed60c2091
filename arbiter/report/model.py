"""The capability report's model: what ran where, what fell back, and why.

The report is a pydantic model (``Report``); renderers read only the model. It is built
from the live records of the compiled pieces, so after a runtime fallback the next
report shows the demoted backend: the report says what actually ran, not what was
planned (both are kept: ``planned_backend`` and ``backend``).
"""
from __future__ import annotations

import datetime
from typing import Any, Callable, Optional

from pydantic import BaseModel, Field

from .words import plural, tensor_op_count
from .accuracy_model import AccuracyReport  # noqa: F401 - part of the model (GraphReport)

#: ``str(report)``'s rendering (``text.plain``), handed over by arbiter/report/text.py when
#: it is imported (the package imports it): the renderings import the model, never the
#: other way round.
_TEXT: Optional[Callable[[Report], str]] = None


def use_text_rendering(render: Callable[[Report], str]) -> None:
    """Make ``render`` (``text.plain``) what ``str(report)`` returns."""
    global _TEXT
    _TEXT = render


#: Bumped when a field is renamed or removed (adding fields keeps it); docs/report.md.
#: 2: a partition's `compiled` and `backend: null` until compiled (was the sentence
#: "(not compiled yet)"); graphs' and ops' `planned` apart from `placement`/`placed`
#: (was "x (planned)" keys); the policy's outcome fields unchanged.
SCHEMA_VERSION = 2


class TensorReport(BaseModel):
    """One value crossing a partition boundary."""

    name: str = Field(description="the FX node that produces the value")
    shape: list[Any] = Field(description="sizes; symbolic sizes are strings (`s0`)")
    dtype: str
    bytes: Optional[int] = Field(None, description="size in bytes; None when symbolic")
    source: str = Field("partition", description="`partition` (another partition's "
                        "output), `graph input`, `constant` (a frozen weight baked into "
                        "the partition), or `graph output` for outputs")


class FallbackReport(BaseModel):
    from_backend: str
    to_backend: str
    stage: str = Field(description="`compile`, `run` or `verify`")
    reason: str


class FirstUseReport(BaseModel):
    """A first-use check (config `verify: {mode: unverified}`): the partition held ops no
    probe verified on this backend, so its first call there was compared with eager."""

    backend: str
    unverified: list[str] = Field(description="the (op, dtype) pairs no probe verified, "
                                  "and why: `aten.x.default float32 (verified: declared)`")
    result: str = Field(description="`pending` (not called yet), `passed`, `failed`, or "
                        "`not checked: <why>`")
    detail: str = Field("", description="what differed from eager, when failed")
    findings: list[str] = Field(default_factory=list, description="what the failure was "
                                "traced to (op, dtype, output), refused on this backend from "
                                "then on (arbiter/plan/findings.py)")

    def line(self) -> str:
        """The check in a line: backend, result, what it was about."""
        what = ", ".join(self.unverified[:3]) + (
            f" and {len(self.unverified) - 3} more" if len(self.unverified) > 3 else "")
        if self.result == "failed":
            found = f"; traced to {', '.join(self.findings)}" if self.findings else ""
            return (f"first use on {self.backend} differed from eager ({self.detail})"
                    f"{found}; unverified: {what}")
        result = "checked against eager: passed" if self.result == "passed" else self.result
        return f"first use on {self.backend} {result}; unverified: {what}"


class PartitionReport(BaseModel):
    id: int
    planned_backend: str = Field(description="the backend the policy chose")
    compiled: bool = Field(description="whether a backend compiled it yet (not before the "
                                       "first call, nor in a dry run)")
    backend: Optional[str] = Field(description="the backend that runs it now; null until "
                                               "compiled")
    nodes: int = Field(description="compute nodes (getitem not counted)")
    ops: dict[str, int] = Field(description="op -> number of nodes")
    node_names: list[str]
    chain: list[str] = Field(description="backends tried in order if one fails")
    precision: str = Field("native", description="what it computes in: `native` (the "
                           "graph's own dtypes) or a lower-precision variant's label "
                           "(`bf16`; config `accuracy`, docs/precision.md); its verify "
                           "errors are its outputs against its eager ATen on the same inputs")
    fallbacks: list[FallbackReport] = Field(default_factory=list)
    compile_s: float = 0.0
    calls: int = Field(0, description="calls timed (a timed run)")
    run_s: float = Field(0.0, description="time spent in this partition over timed calls")
    copies: int = Field(0, description="tensor copies made at this partition's boundary")
    restride_copies: int = Field(0, description="outputs copied into the traced layout")
    verify_checks: int = Field(0, description="accuracy checks against eager ATen")
    verify_max_error: Optional[float] = Field(None, description="largest error seen by verify")
    first_use: list[FirstUseReport] = Field(
        default_factory=list, description="first-use checks against eager, one per backend "
        "that compiled it holding ops no probe verified (verify mode `unverified`)")
    nonfinite_guard: list[str] = Field(
        default_factory=list, description="ops its backend computes unlike eager on NaN or "
        "inf inputs, taken under `exact_nonfinite: guard`: every call checks the inputs")
    nonfinite_eager_calls: int = Field(0, description="calls run in eager ATen because an "
                                       "input held NaN or inf (`exact_nonfinite: guard`)")
    measured_ms: dict[str, float] = Field(default_factory=dict,
                                          description="backend -> median ms, where measured")
    inputs: list[TensorReport] = Field(default_factory=list,
                                       description="values flowing in, in call order")
    outputs: list[TensorReport] = Field(default_factory=list,
                                        description="values used outside the partition")
    bytes_in: int = Field(0, description="bytes read from other partitions (graph inputs "
                                         "not counted; see graph_input_bytes)")
    graph_input_bytes: int = Field(0, description="bytes read from graph inputs (weights "
                                                  "included unless frozen as constants)")
    constant_bytes: int = Field(0, description="bytes of frozen weights baked in")
    bytes_out: int = Field(0, description="bytes produced for other partitions or the output")
    inline: bool = Field(False, description="runs as ATen nodes inside the stitched graph "
                                            "(eager); timed only as part of the whole call")
    shapes: str = Field("static", description="`static`; with symbolic shapes: `symbolic` "
                        "(one artifact for every size) or `per shape` (compiled per concrete "
                        "shape); `eager` when it runs in eager")
    specializations: int = Field(0, description="`per shape`: shapes compiled so far")
    quantized: list[str] = Field(
        default_factory=list, description="where it runs on a backend (not in eager): "
        "the integer dtypes of its quantize/dequantize nodes (a model the user quantized, "
        "PT2E: `uint8` activations, `int8` weights), which that backend runs with the "
        "layers they feed (docs/precision.md)")

    @property
    def runs_on(self) -> str:
        """The backend running it (compiled), or planned to (not compiled yet)."""
        return self.backend if self.compiled else self.planned_backend


class RefusalReport(BaseModel):
    op: str
    backend: str
    reason: str
    nodes: int


class OpReport(BaseModel):
    """One ATen op of a graph: who could run it, who got it, who refused and why."""

    op: str
    nodes: int
    able: list[str] = Field(description="backends able to run at least one of its nodes, "
                                        "in config order")
    conditions: dict[str, str] = Field(default_factory=dict,
                                       description="backend -> the manifest's conditions "
                                                   "(dtypes, devices, dynamic, max_rank)")
    placed: dict[str, int] = Field(default_factory=dict,
                                   description="backend -> nodes of this op it runs "
                                               "(compiled partitions)")
    planned: dict[str, int] = Field(default_factory=dict,
                                    description="backend -> nodes of this op planned for it "
                                                "in partitions not compiled yet")
    refused: dict[str, str] = Field(default_factory=dict,
                                    description="backend -> why it refused (first reason)")


class NodeReport(BaseModel):
    """One node of the graph, for drawing it (the HTML page)."""

    name: str
    op: str
    partition: int
    inputs: list[str] = Field(description="names of the nodes it reads (graph inputs "
                                          "appear as `input:<name>`)")
    shape: list[Any] = Field(default_factory=list)
    dtype: str = ""
    module: str = Field("", description="the module it comes from, as a path "
                                        "(`encoder.layer.5.attention`; Dynamo's "
                                        "nn_module_stack); empty for top-level code")


class WeightEventReport(BaseModel):
    """A graph's frozen weights changed after it was compiled (arbiter/run/freeze.py)."""

    reason: str = Field(description="which weights changed, and how")
    action: str = Field(description="`re-frozen` (pieces rebuilt around the new weights) "
                                    "or `weights as inputs` (from then on, no constants)")


class RuleReport(BaseModel):
    """A config `pin` or `exclude_ops` entry, and what it did in one graph."""

    kind: str = Field(description="`pin` or `exclude`")
    op: str = Field(description="the op as the config names it (`aten.x` or `aten.x.overload`)")
    backend: Optional[str] = Field(None, description="a pin's backend")
    nodes: int = Field(description="nodes of the graph the rule names")
    applied: int = Field(description="of them, the nodes it holds for: a pin's run (or are "
                                     "planned to run) on its backend, an exclude's on the "
                                     "fallback")
    why_not: dict[str, int] = Field(default_factory=dict,
                                    description="for the other nodes: reason -> nodes")


class PatternReport(BaseModel):
    """A pattern match in the graph (a manifest's ``patterns:``) and who took it."""

    pattern: str
    node_names: list[str] = Field(description="the matched nodes, graph order")
    claimed_by: list[str] = Field(default_factory=list, description="backends whose "
                                  "manifest claims the pattern and that accepted this match")
    refused: dict[str, str] = Field(default_factory=dict, description="backend -> why it "
                                    "did not claim this match")
    partition: Optional[int] = Field(None, description="the partition holding it (a "
                                     "claimed match is never split)")
    backend: Optional[str] = Field(None, description="the partition's backend: the one that "
                                   "runs it now when compiled, else the planned one")
    compiled: bool = False
    whole: bool = Field(False, description="run as one unit by a backend that claimed it "
                        "(else op by op)")
class SymbolReport(BaseModel):
    """One symbolic dimension of a graph's inputs (Dynamo's dynamic shapes)."""

    name: str = Field(description="the symbol, as in partitions' shapes (`s77`)")
    min: int
    max: Optional[int] = Field(None, description="null: unbounded")
    sources: list[str] = Field(default_factory=list,
                               description="the user's inputs carrying it (`x.size(0)`)")
    data_dependent: bool = Field(False, description="a size computed from data (nonzero)")


#: StepReport.route when the step runs Dynamo's graph in eager, and the name its nodes
#: are counted under in the summary and the per-kind table
DYNAMO_EAGER = "dynamo eager"
EAGER_NAME = "eager"


class StepReport(BaseModel):
    """A training graph's compiled plan against Dynamo's own graph in eager (run/step.py)."""

    route: str = Field(description="what runs the forward and its backward now: `compiled` "
                       "(the partitions below), `dynamo eager` (Dynamo's graph in eager, "
                       "the module's own ops and autograd's backward: the partitions below "
                       "no longer run), `trial` (the two alternating, timed) or `pending` "
                       "(the backward not compiled yet)")
    reason: str = ""
    ms: dict[str, float] = Field(default_factory=dict, description="route -> median ms of "
                                 "one call's forward and backward, timed on the user's calls")
    samples: int = Field(0, description="timed calls per route")


class GraphReport(BaseModel):
    graph_id: int
    kind: str = Field(description="inference, forward or backward")
    model: str = Field("", description="the compiled model (module class or function) "
                           "Dynamo was tracing when it made this graph; `?` if unknown")
    nodes: int
    partitions: list[PartitionReport]
    refusals: list[RefusalReport] = Field(default_factory=list,
                                          description="why backends refused ops, per op")
    constants: int = Field(0, description="weights handed to backends as constants")
    weight_events: list[WeightEventReport] = Field(
        default_factory=list, description="changes of the frozen weights seen at a call, "
                                          "in order, and what was done")
    weights_as_inputs: bool = Field(False, description="the frozen weights changed more "
                                    "often than `refreeze_limit`: weights are now inputs")
    plan_s: float = 0.0
    policy: str = "priority"
    ops: list[OpReport] = Field(default_factory=list, description="per ATen op, by count")
    coverage: dict[str, float] = Field(default_factory=dict,
                                       description="backend -> % of compute nodes it could run")
    placement: dict[str, int] = Field(default_factory=dict,
                                      description="backend -> compute nodes it runs now "
                                                  "(compiled partitions)")
    planned: dict[str, int] = Field(default_factory=dict,
                                    description="backend -> compute nodes planned for it in "
                                                "partitions not compiled yet")
    graph: list[NodeReport] = Field(default_factory=list, description="every compute node")
    rules: list[RuleReport] = Field(default_factory=list,
                                    description="the config's pins and excludes in this graph")
    patterns: list[PatternReport] = Field(default_factory=list,
                                          description="pattern matches and who took them")
    chosen: str = Field("", description="policies cost/measure, or a plan timed against "
                        "eager (`against_eager`): the placement chosen")
    candidate_fallbacks: dict[str, list[str]] = Field(
        default_factory=dict, description="timed placements not chosen whose partitions "
        "fell back while timed (a backend failed there): placement -> what fell back")
    against_eager: bool = Field(False, description="config `against_eager`: the policy's "
                                "plan was timed against eager ATen on the first call, and "
                                "`chosen` says which ran (`only eager`: eager was faster "
                                "by more than 3%)")
    candidates_ms: dict[str, Optional[float]] = Field(
        default_factory=dict, description="policy measure: placement -> measured ms "
                                          "(null: not measured)")
    estimates_ms: dict[str, float] = Field(default_factory=dict,
                                           description="policy cost: placement -> estimated ms")
    candidates_spread_ms: dict[str, list[float]] = Field(
        default_factory=dict, description="policy measure: placement -> [lower, upper] "
                                          "quartile of its timings")
    measure_rounds: int = Field(0, description="policy measure: interleaved timing rounds")
    measure_confident: Optional[bool] = Field(
        None, description="policy measure: whether the winner's timings were apart from "
                          "every other candidate's (its upper quartile below their lower)")
    accuracy: Optional[AccuracyReport] = Field(None, description="config `accuracy`: the "
                                               "tolerance and the lower-precision candidates' "
                                               "errors; null without it")
    measure_broadcast: str = Field(
        "", description="policy measure under torch.distributed (world size > 1): "
                        "`rank 0: broadcast` on rank 0, which decides (measured or from its "
                        "cache) and broadcasts; `from rank 0` on the others, which install "
                        "rank 0's decision untimed; empty when not distributed")
    measure_rank: Optional[int] = Field(None, description="with `measure_broadcast`: this "
                                        "process's rank in the process group")
    measure_world_size: Optional[int] = Field(None, description="with `measure_broadcast`: "
                                              "the process group's size")
    symbols: list[SymbolReport] = Field(default_factory=list,
                                        description="symbolic dimensions and their ranges")
    frame: Optional[int] = Field(None, description="Dynamo's frame id of the graph")
    recompile: int = Field(0, description="0: the frame's first compile; n: its n-th "
                           "recompile (new shapes, or guards that failed)")
    step: Optional[StepReport] = Field(None, description="forward and backward graphs: "
                                       "their plan against Dynamo's graph in eager")
    shape_eager_share: float = Field(0.0, description="share of the graph's tensor "
                                     "compute nodes run in eager because of symbolic shapes")
    warnings: list[str] = Field(default_factory=list)

    @property
    def on_dynamo_graph(self) -> bool:
        """Whether the step runs Dynamo's graph in eager now: the partitions do not run."""
        return self.step is not None and self.step.route == DYNAMO_EAGER

    def ran_on(self, p: "PartitionReport") -> str:
        """What runs ``p``'s nodes now: ``eager`` where the step runs Dynamo's graph,
        else the backend running it (compiled) or planned to (not compiled yet)."""
        return EAGER_NAME if self.on_dynamo_graph else p.runs_on


class BackendStatus(BaseModel):
    name: str
    available: bool
    reason: str = ""
    version: Optional[str] = None
    color: str = Field("", description="the color reports draw it in (the backend's own)")
    plans_only: bool = Field(False, description="cannot run here (`reason`), but a dry run "
                             "plans onto it (TensorRT without CUDA)")


class GraphBreakReport(BaseModel):
    """What Dynamo made of the model (``torch._dynamo.explain``)."""

    graphs: int = Field(description="graphs Dynamo captured (recompiles included)")
    breaks: int = Field(description="graphs a graph break ended")
    reasons: list[str] = Field(default_factory=list, description="why, with user frames")


class AdviceReport(BaseModel):
    """A suggestion computed from the plan (by replanning), not a canned tip."""

    kind: str = Field(description="`min_block_size` or `op_support`")
    message: str
    data: dict[str, Any] = Field(default_factory=dict)


class TimingReport(BaseModel):
    """A timed run: whole calls, and the partitions' share of them."""

    calls: int
    total_s: float = Field(description="wall time of all timed calls")
    pieces_s: float = Field(description="time inside non-inline partitions")
    note: str = ""


class KindBackendReport(BaseModel):
    """One backend's share of the graphs of one kind (``KindReport.backends``)."""

    backend: str
    compiled: bool = Field(description="true: compiled partitions (what runs now); false: "
                                       "partitions planned for it, not compiled yet")
    eager: bool = Field(False, description="the backend runs ATen in place (eager)")
    nodes: int = Field(description="compute nodes")
    partitions: int
    ops: dict[str, int] = Field(default_factory=dict,
                                description="op -> nodes, most first")
    fell_back_nodes: int = Field(0, description="of its nodes, those it took over from "
                                 "another backend at a runtime fallback")


class KindReport(BaseModel):
    """What ran where in the graphs of one kind (forward, backward or inference), summed
    over those graphs' partitions."""

    kind: str = Field(description="inference, forward or backward")
    graphs: list[int] = Field(description="ids of the graphs of this kind")
    nodes: int = Field(description="compute nodes (getitem not counted)")
    partitions: int
    compiled_partitions: int = Field(description="partitions a backend compiled (the rest "
                                     "are planned only: a dry run, or before the first call)")
    backends: list[KindBackendReport] = Field(
        default_factory=list, description="per backend that runs (or is planned to run) "
        "nodes of this kind, most nodes first")
    eager_nodes: int = Field(0, description="nodes that run (or are planned) in eager")
    eager_ops: dict[str, int] = Field(default_factory=dict,
                                      description="op -> nodes in eager, most first")
    fell_back_partitions: int = Field(0, description="partitions run by another backend than "
                                      "planned, after a fallback (each with its reason)")
    fell_back_nodes: int = Field(0, description="the nodes of those partitions")
    fallbacks: int = Field(0, description="fallbacks recorded (a partition may fall back "
                                          "more than once down its chain)")
    compile_s: float = Field(0.0, description="backends' compile time, summed")
    calls: int = Field(0, description="timed calls (the most any partition of this kind had)")
    run_s: float = Field(0.0, description="time inside backend-compiled partitions over the "
                                          "timed calls (inline eager ones are not timed)")


class BroadcastReport(BaseModel):
    """A graph whose placement was decided on rank 0 and broadcast (policy measure)."""

    graph_id: int
    kind: str
    model: str = ""
    chosen: str = Field("", description="the placement every rank runs")
    role: str = Field(description="`rank 0: broadcast` (decided here and sent) or `from rank "
                                  "0` (installed untimed)")


class DistributedReport(BaseModel):
    """Graphs compiled under a torch.distributed process group (world size > 1) whose
    decisions were broadcast; absent from the report when none was."""

    rank: Optional[int] = Field(None, description="this process's rank, when recorded")
    world_size: Optional[int] = Field(None, description="the process group's size, when "
                                      "recorded")
    sent: int = Field(0, description="graphs whose decision this rank (rank 0) took and "
                                     "broadcast")
    received: int = Field(0, description="graphs whose decision this rank installed from "
                                         "rank 0")
    broadcast: list[BroadcastReport] = Field(default_factory=list,
                                             description="each graph with a broadcast decision")
    not_broadcast: list[int] = Field(
        default_factory=list, description="ids of the other graphs: their policy decides "
        "from the graph alone (the same on every rank), or they were not called yet")


class DeployedPartition(BaseModel):
    """One partition of a loaded program: what was saved, what runs (docs/deploy.md)."""

    id: int
    saved_backend: str = Field(description="the backend that ran it when it was saved")
    artifact: str = Field(description="its saved form: `onnx`, `openvino-ir`, "
                          "`aotinductor`..., or `aten` (compiled again at load)")
    loaded: str = Field(description="how it runs: `saved artifact`, `compiled at load`, "
                        "`eager`, or `pending` (compiles at its first call)")
    reason: str = Field("", description="why it is not the saved artifact that runs")


class DeployedReport(BaseModel):
    """A program loaded by ``arbiter.load``: where from, with which versions, and what
    loading did; absent for programs compiled in this process."""

    path: str
    format_version: int
    saved_versions: dict[str, str] = Field(default_factory=dict)
    loaded_versions: dict[str, str] = Field(default_factory=dict)
    load_s: float = Field(0.0, description="seconds arbiter.load took, its check included")
    check: str = Field("", description="the check at load: the saved example inputs run "
                       "and compared with eager's saved outputs")
    partitions: list[DeployedPartition] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list, description="version differences, "
                             "backends missing at load, fallbacks")


#: What a report of a compiled model says before its first call.
NOT_CALLED = ("not called yet: torch.compile compiles at the first call; call the model, "
              "then ask for its report")


class Report(BaseModel):
    schema_version: int = SCHEMA_VERSION
    label: str = Field("", description="the config's name in a side-by-side report")
    model: Optional[str] = Field(None, description="the model reported on, as given")
    config: Optional[str] = Field(None, description="where the config came from")
    config_dump: dict[str, Any] = Field(default_factory=dict,
                                        description="the config in force, every field")
    versions: dict[str, str] = Field(default_factory=dict,
                                     description="python, torch, arbiter, each backend")
    graph_breaks: Optional[GraphBreakReport] = None
    advice: list[AdviceReport] = Field(default_factory=list)
    timing: Optional[TimingReport] = None
    created: str = Field(default_factory=lambda: datetime.datetime.now().isoformat(timespec="seconds"))
    dry_run: bool = False
    not_called: bool = Field(False, description="the compiled model was not called yet: "
                             "torch.compile compiles at the first call, so nothing is planned")
    backends: list[BackendStatus] = Field(default_factory=list)
    graphs: list[GraphReport] = Field(default_factory=list)
    kinds: list[KindReport] = Field(default_factory=list, description="per graph kind "
                                    "(forward, backward, inference): what ran where, summed "
                                    "over the graphs of that kind")
    distributed: Optional[DistributedReport] = Field(
        None, description="decisions broadcast under torch.distributed; null when none was")
    resources: dict[str, Any] = Field(default_factory=dict,
                                      description="thread and memory settings in force")
    deployed: Optional[DeployedReport] = Field(
        None, description="a program loaded by arbiter.load: what was saved and what loading "
        "did; null otherwise")
    warnings: list[str] = Field(default_factory=list,
                                description="what the config asked for and did not get: a "
                                            "pin or exclude that applies to no node, a pin "
                                            "its backend could not take")

    def summary(self) -> str:
        if self.not_called:
            return NOT_CALLED
        parts = [p for g in self.graphs for p in g.partitions]
        by: dict[str, int] = {}
        for g in self.graphs:
            for p in g.partitions:
                # Not compiled (a dry run, or before the first call): the plan, said so.
                b = g.ran_on(p)
                n = tensor_op_count(p.ops) if p.ops else p.nodes
                if n:
                    by[b] = by.get(b, 0) + n
        total = sum(by.values()) or 1
        share = ", ".join(f"{b} {n / total:.0%}" for b, n in sorted(by.items(), key=lambda x: -x[1]))
        falls = sum(len(p.fallbacks) for p in parts)
        # candidates not chosen whose partitions failed while timed: a backend that
        # failed must show (their partitions do not run; the graph's line says which)
        timed_falls = sum(len(v) for g in self.graphs for v in g.candidate_fallbacks.values())
        falls_text = f"{falls} (+{timed_falls} while timed)" if timed_falls else f"{falls}"
        recompiles = len({(g.frame, g.recompile) for g in self.graphs if g.recompile})
        shaped = f"; recompiles: {recompiles}" if recompiles else ""
        breaks = f"; graph breaks: {self.graph_breaks.breaks}" if self.graph_breaks else ""
        per_shape = sum(p.shapes == "per shape" for p in parts)
        if per_shape:  # symbolic sizes a backend takes one size at a time
            breaks += f"; per shape: {per_shape} (a compile per new size)"
        checks = [c.result for p in parts for c in p.first_use]
        if checks:  # verify `unverified`: partitions holding ops no probe verified
            failed = sum(r == "failed" for r in checks)
            breaks += (f"; first-use checks: {len(checks)}"
                       + (f" ({failed} failed)" if failed else ""))
        routes = [g.step.route for g in self.graphs if g.step is not None]
        if DYNAMO_EAGER in routes or "trial" in routes:  # training (run/step.py)
            breaks += (f"; on Dynamo's graph: {routes.count(DYNAMO_EAGER)}"
                       if DYNAMO_EAGER in routes else "") + \
                (f"; step timed: {routes.count('trial')}" if "trial" in routes else "")
        # Short enough for one line of a 100-column terminal with 3-4 backends.
        ran = "ran" if parts and all(p.compiled for p in parts) else \
            "planned" if not any(p.compiled for p in parts) else "ran or planned"
        return (f"{plural(len(self.graphs), 'graph')}, {plural(len(parts), 'partition')}; "
                f"{ran}: {share or '-'}; "
                f"fallbacks: {falls_text}{shaped}{breaks}")

    def __str__(self) -> str:
        # The one text rendering (arbiter/report/text.py), plain: no rich, no wrapping.
        return _TEXT(self) if _TEXT is not None else super().__str__()
