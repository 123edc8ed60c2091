"""Policies: how a graph's placement is chosen. A registry, like backends.

A policy gets a ``Planner`` and a graph and returns a ``Choice``: the plan to build, the
candidate placements it considered, its ``PolicyOutcome`` (kept on the graph's record,
shown in the report) and ``timed``, what the graph's first real call times, as data (a
``TimedChoice``: candidates, the margin by which another must beat the policy's own
plan, whether mixing and refinement follow); ``arbiter.measure`` times them on that call.
Built in: ``priority`` (config order), ``cost`` (the lowest static estimate, cost.py),
``measure`` (every candidate timed) and ``calibrated`` (the lowest time predicted from
this machine's calibration, predict.py; the two best timed when close). The candidates
are whole-graph plans (``priority``, ``only <backend>``, ``only eager``) from the linear
partitioner. A third-party policy subclasses ``Policy`` and registers with
``@register_policy``. docs/policies.md says what each decides and why.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Optional

import torch.fx

from ..errors import ArbiterError, unknown_name
from ..ops import is_mutating
from .capability import CapabilityTable
from .cost import plan_ms
from .evidence import is_compute
from .partition import Plan
from .planner import Planner
from .predict import predict, predict_compile_s
from .quantized import int8_rivals
from .segments import SegmentTimes

log = logging.getLogger(__name__)

PRIORITY = "priority"
ONLY = "only "
#: Config `against_eager`: eager replaces a policy's plan only when faster by more than this.
EAGER_MARGIN = 0.03
#: Policy `calibrated`: a runner-up predicted within this fraction of the best is timed
#: against it on the first call (the prediction cannot tell them apart).
CLOSE_MARGIN = 0.25
#: ... unless, for an inference graph, its compile is predicted to take more than
#: COMPILE_SHARE times the best's plus COMPILE_SLACK_S (the cost table's compile rows,
#: ``predict_compile_s``): the default runs the fastest placement at about the cost of
#: one compile, and Inductor's 14 s on BERT-base, timed beside OpenVINO's 1 s, was most of
#: its first call there. Training graphs time the runner-up whatever it costs.
COMPILE_SHARE = 2.0
COMPILE_SLACK_S = 1.0
#: The revision of the rules on what a policy times (part of the decision
#: cache's key): 2 adds a quantized graph's plans that run its int8 units
#: (``quantized.int8_rivals``); 3: an inference graph's close candidate that compiles
#: far faster than the predicted best is chosen instead (``_cheaper_to_compile``)
TIMED = 3
#: Policy `measure`, with this machine's calibration known: a compiled candidate
#: predicted slower than this many times the best prediction is not compiled and timed.
MEASURE_FAR = 2.0


@dataclass
class Candidate:
    label: str
    plan: Plan
    estimate_ms: float
    measured_ms: Optional[float] = None  # median of an end-to-end timing, when measured
    spread_ms: Optional[tuple[float, float]] = None  # its quartiles (measure/timing.py)
    also: list[str] = field(default_factory=list)  # labels of candidates equal to this one
    steer: Optional[dict] = None  # refined, mixed placements: node name -> backend
    eligible: bool = True  # False: a refinement step that did not beat its base enough
    # lower-precision variants (config `accuracy`, docs/precision.md): the variant
    # backends the plan uses; the max error of its outputs against float32 eager on the
    # first call; why it was refused ("" if it was not)
    lowered: tuple[str, ...] = ()
    error: Optional[float] = None
    rejected: str = ""
    # policy `calibrated`: the backends its estimate priced by the static table
    uncalibrated: list[str] = field(default_factory=list)

    @property
    def labels(self) -> list[str]:
        return [self.label, *self.also]


@dataclass
class PolicyOutcome:
    """What a policy decided for one graph, and on what grounds (the report shows it)."""

    policy: str = PRIORITY
    chosen: str = ""  # the candidate's label ("" for priority: there is no choice)
    estimates_ms: dict[str, float] = field(default_factory=dict)  # label -> estimate
    candidates_ms: dict[str, Optional[float]] = field(default_factory=dict)  # None: not timed
    measured_ms: dict[int, dict[str, float]] = field(default_factory=dict)  # partition -> backend -> ms
    spread_ms: dict[str, list[float]] = field(default_factory=dict)  # label -> [q1, q3] ms
    rounds: int = 0  # interleaved timing rounds of the whole-graph candidates
    # config `accuracy`: (rtol, atol); lower-precision candidates' max errors against
    # float32 eager on the first call, and why some were refused (label -> text)
    tolerance: Optional[tuple[float, float]] = None
    errors: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    confident: Optional[bool] = None  # the winner's timings apart from every other's
    # distributed (torch.distributed, world > 1): "measured here, broadcast" on rank 0,
    # "from rank 0" on the others; "" when not distributed
    broadcast: str = ""
    rank: Optional[int] = None  # with `broadcast`: this process's rank
    world_size: Optional[int] = None  # with `broadcast`: the process group's size
    # config `against_eager`: this policy's plan was timed against eager ATen on the
    # first call (eager runs the graph when faster by more than its margin)
    against_eager: bool = False
    # candidates not installed whose partitions fell back while timed (a backend that
    # failed there must show, whichever placement won): label -> "partition N: a -> b
    # (stage: reason)"
    fallbacks: dict[str, list[str]] = field(default_factory=dict)
    # measure.mix: the segment probes' times and the DP's placement (not in the report)
    mix: Optional[SegmentTimes] = None
    # config `accuracy`: the per-module precision search and drift watch
    # (measure.permodule.PrecisionOutcome; the report's accuracy.modules, drift)
    precision: Optional[Any] = None


@dataclass(frozen=True)
class TimedChoice:
    """What a graph's first call times (``arbiter.measure``), as a policy asks for it."""

    candidates: list[Candidate]  # the policy's own plan first
    # the first candidate gives way only to one measured faster by more than this fraction
    # (EAGER_MARGIN under `against_eager`: noise does not move a graph off its plan)
    margin: float = 0.0
    # the mixed candidate and refinement follow the candidates (config `measure.mix`,
    # `measure.refine`)
    search: bool = False
    # untimed compiled candidates, best predicted first: one is timed in the place of a
    # timed candidate whose partitions fell back while it warmed up (a backend failing
    # its check left that candidate running something else than predicted)
    reserve: tuple = ()


@dataclass
class Choice:
    plan: Plan
    outcome: PolicyOutcome
    candidates: list[Candidate] = field(default_factory=list)
    timed: Optional[TimedChoice] = None  # None: nothing timed, the plan is built as is


@dataclass(frozen=True)
class GraphContext:
    """What a policy's ``timed`` reads of the graph beyond its nodes, and of the config."""

    kind: str = "inference"  # "inference", "forward" or "backward"
    symbolic: bool = False  # some input sizes are symbolic
    against_eager: str = "off"  # config `against_eager`: "off", "training" or "all"

    @property
    def lowered_ok(self) -> bool:
        """Lower-precision candidates: inference graphs of static shapes only
        (docs/precision.md)."""
        return self.kind == "inference" and not self.symbolic

    @property
    def eager_checked(self) -> bool:
        """Whether config `against_eager` times this graph against eager ATen."""
        return self.against_eager == "all" or (self.against_eager == "training"
                                               and self.kind != "inference")


def candidates(planner: Planner, gm: torch.fx.GraphModule) -> list[Candidate]:
    """The priority plan first, then each single-backend plan; each with its estimate."""
    plans: list[tuple[str, Plan]] = [(PRIORITY, planner.plan(gm))]
    names = list(planner.backends)
    fallback = planner.backends[names[-1]]
    for name, backend in planner.backends.items():
        if backend.inline_aten or name in planner.unavailable or name == fallback.name:
            continue
        plans.append((ONLY + name, planner.plan(gm, planner.table_for([backend, fallback]))))
    plans.append(fallback_plan(planner, gm))
    plans += variant_plans(planner, gm, only=True)
    return _unique(planner, plans)


def fallback_plan(planner: Planner, gm: torch.fx.GraphModule) -> tuple[str, Plan]:
    """``only <fallback>``: the whole graph on the chain's last backend (eager ATen). It
    is a single-backend placement too, and the fastest on tiny graphs where every compiled
    backend's per-call cost dominates (seed MLP), and on backward graphs whose gradient
    kernels eager runs faster (config `against_eager`). No excludes or pins apply to it:
    there is nothing else to pin to."""
    fallback = planner.backends[list(planner.backends)[-1]]
    return ONLY + fallback.name, planner.plan(gm, CapabilityTable([fallback]))


def variant_plans(planner: Planner, gm: torch.fx.GraphModule,
                  only: bool) -> list[tuple[str, Plan]]:
    """Plans with a lower-precision variant (config `accuracy`) in its backend's place:
    ``priority with <variant>``, and with ``only`` also ``only <variant>``."""
    out = []
    fallback = planner.backends[list(planner.backends)[-1]]
    for name, variant in planner.variants.items():
        out.append((f"{PRIORITY} with {name}", planner.plan(gm, planner.with_variant(variant))))
        if only:
            out.append((ONLY + name, planner.plan(gm, planner.table_for([variant, fallback]))))
    return out


def checked(planner: Planner, gm: torch.fx.GraphModule, choice: Choice,
            graph: GraphContext) -> Optional[TimedChoice]:
    """What a policy that does not measure has timed on the first call beside its own
    plan (first), or None when nothing: with config `accuracy` (an inference graph of
    static shapes), the priority plan with each lower-precision variant in its backend's
    place, verified before it is timed (docs/precision.md); with ``against_eager`` for
    this graph, the whole graph in eager ATen (``fallback_plan``), which replaces the plan
    only past ``EAGER_MARGIN``. Sets ``choice.outcome.against_eager``."""
    variants = bool(planner.variants) and graph.lowered_ok
    eager = graph.eager_checked
    if not (variants or eager):
        return None
    plans = [(choice.outcome.chosen or PRIORITY, choice.plan)]
    if variants:
        plans += variant_plans(planner, gm, False)
    if eager:
        plans.append(fallback_plan(planner, gm))
    cands = _unique(planner, plans)
    choice.outcome.against_eager = eager and len(cands) > 1
    return TimedChoice(cands, EAGER_MARGIN if eager else 0.0, search=False)


def _unique(planner: Planner, plans: list[tuple[str, Plan]]) -> list[Candidate]:
    """Candidates of ``plans``, equal plans kept once (later labels go to ``also``)."""
    out: list[Candidate] = []
    seen: dict = {}
    for label, plan in plans:
        key = plan_key(plan)
        if key in seen:
            seen[key].also.append(label)
            continue
        lowered = tuple(sorted({p.backend for p in plan.partitions}
                               & set(planner.variants)))
        seen[key] = Candidate(label, plan, plan_ms(plan, planner.inline), lowered=lowered)
        out.append(seen[key])
    return out


def plan_key(plan: Plan) -> tuple:
    """Equal for plans with the same partitions, backends and nodes."""
    return tuple((b, tuple(names)) for b, names in plan.as_lists())


def choose_by_cost(cands: list[Candidate]) -> Candidate:
    """The candidate with the lowest estimate; ties go to the earlier (priority first)."""
    return min(enumerate(cands), key=lambda ic: (ic[1].estimate_ms, ic[0]))[1]


# -- the registry -----------------------------------------------------------------------
class Policy:
    """Base class of every policy: a ``name``, ``choose`` (the plan, its candidates, the
    outcome) and ``timed`` (what the first real call times, ``arbiter.measure``).
    ``measures = True`` has the default ``timed`` time every candidate of the choice,
    with mixing and refinement after them."""

    name: ClassVar[str] = ""
    measures: ClassVar[bool] = False
    #: a dry run (``arbiter.explain``) plans with this policy (it times nothing while
    #: planning); otherwise a dry run shows the priority plan
    dry_runs: ClassVar[bool] = False

    def choose(self, planner: Planner, gm: torch.fx.GraphModule) -> Choice:
        raise NotImplementedError

    def timed(self, planner: Planner, gm: torch.fx.GraphModule, choice: Choice,
              graph: GraphContext) -> Optional[TimedChoice]:
        """What the graph's first call times (None: nothing; the plan is built as is).
        Default: with ``measures``, every candidate of ``choice`` (lower-precision ones
        only where ``graph.lowered_ok``), with search; else what the config asks beside
        the policy's plan (``checked``)."""
        if not self.measures:
            return checked(planner, gm, choice, graph)
        return TimedChoice([c for c in choice.candidates if graph.lowered_ok or not c.lowered],
                           search=True)

    def decide(self, planner: Planner, gm: torch.fx.GraphModule,
               graph: GraphContext) -> Choice:
        """``choose``, with ``Choice.timed`` from ``timed`` unless ``choose`` set it."""
        choice = self.choose(planner, gm)
        if choice.timed is None:
            choice.timed = self.timed(planner, gm, choice, graph)
        return choice


_POLICIES: dict[str, type[Policy]] = {}
_lock = threading.Lock()


def register_policy(cls: type[Policy]) -> type[Policy]:
    """Class decorator registering a ``Policy`` subclass under its ``name``."""
    if not (isinstance(cls, type) and issubclass(cls, Policy)) or not cls.name:
        raise ArbiterError(f"@register_policy expects a named Policy subclass, got {cls!r}")
    with _lock:
        old = _POLICIES.get(cls.name)
        if old is not None and old.__qualname__ != cls.__qualname__:
            raise ArbiterError(f"policy {cls.name!r} is registered twice: by "
                               f"{old.__module__}.{old.__qualname__} and "
                               f"{cls.__module__}.{cls.__qualname__}")
        _POLICIES[cls.name] = cls
    return cls


def policy_names() -> list[str]:
    return list(_POLICIES)


def get_policy(name: str) -> Policy:
    try:
        return _POLICIES[name]()
    except KeyError:
        raise ArbiterError(unknown_name("policy", name, _POLICIES)) from None


@register_policy
class Priority(Policy):
    """The first backend in config order able to run a node gets it."""

    name = PRIORITY

    def choose(self, planner: Planner, gm: torch.fx.GraphModule) -> Choice:
        return Choice(planner.plan(gm), PolicyOutcome(PRIORITY))


def _outcome(name: str, cands: list[Candidate]) -> PolicyOutcome:
    return PolicyOutcome(
        name, candidates_ms={label: None for c in cands for label in c.labels},
        estimates_ms={label: round(c.estimate_ms, 4) for c in cands for label in c.labels})


@register_policy
class Cost(Policy):
    """The candidate with the lowest static estimate (docs/policies.md)."""

    name = "cost"

    def choose(self, planner: Planner, gm: torch.fx.GraphModule) -> Choice:
        # lower-precision variants are never chosen unmeasured: they are timed and
        # verified beside this choice (``checked``, docs/precision.md)
        cands = [c for c in candidates(planner, gm) if not c.lowered]
        picked = choose_by_cost(cands)
        outcome = _outcome(self.name, cands)
        outcome.chosen = picked.label
        return Choice(picked.plan, outcome, cands)


@register_policy
class Measure(Policy):
    """Every candidate timed on the first real call; the fastest is installed. Until
    then the plan is priority's (the first candidate)."""

    name = "measure"
    measures = True

    def choose(self, planner: Planner, gm: torch.fx.GraphModule) -> Choice:
        cands = candidates(planner, gm)
        return Choice(cands[0].plan, _outcome(self.name, cands), cands)

    def timed(self, planner: Planner, gm: torch.fx.GraphModule, choice: Choice,
              graph: GraphContext) -> Optional[TimedChoice]:
        """Every candidate, except, when this machine's calibration is known (nothing is
        measured for it here) for every backend they use, a compiled one predicted slower
        than ``MEASURE_FAR`` times the best prediction: its compile is saved (`priority`
        and eager whole are always timed)."""
        timed = super().timed(planner, gm, choice, graph)
        calib = planner.calibration(False) if planner.calibration is not None else {}
        if timed is None or not calib:
            return timed
        got = {id(c): predict(c.plan, planner.inline, calib) for c in timed.candidates}
        if any(p.uncalibrated for p in got.values()):
            return timed
        best = min(p.ms for p in got.values())
        eager = ONLY + planner.fallback_name
        keep = [c for c in timed.candidates if PRIORITY in c.labels or eager in c.labels
                or got[id(c)].ms <= MEASURE_FAR * best]
        for c in timed.candidates:
            c.estimate_ms = got[id(c)].ms
        return TimedChoice(keep, timed.margin, timed.search)


@register_policy
class Calibrated(Policy):
    """The candidate with the lowest time predicted from this machine's calibration
    (``predict.py``; ``Planner.calibration``); a runner-up within ``CLOSE_MARGIN`` is
    timed against it on the first call (docs/policies.md)."""

    name = "calibrated"
    dry_runs = True

    def choose(self, planner: Planner, gm: torch.fx.GraphModule,
               eager: bool = True) -> Choice:
        """``eager``: the whole graph in eager ATen is a candidate (not under config
        ``against_eager: off``, which keeps a graph off eager as a whole)."""
        # lower-precision variants are never chosen unmeasured (``checked`` times them)
        cands = [c for c in candidates(planner, gm) if not c.lowered]
        if not eager and len(cands) > 1:
            only_eager = ONLY + planner.fallback_name
            cands = [c for c in cands if c.labels != [only_eager]] or cands
        calib = planner.calibration() if planner.calibration is not None else {}
        for c in cands:
            got = predict(c.plan, planner.inline, calib)
            c.estimate_ms = got.ms
            c.uncalibrated = sorted(got.uncalibrated)
        picked = choose_by_cost(cands)
        outcome = _outcome(self.name, cands)
        outcome.chosen = picked.label
        return Choice(picked.plan, outcome, cands)

    def decide(self, planner: Planner, gm: torch.fx.GraphModule,
               graph: GraphContext) -> Choice:
        choice = self.choose(planner, gm, eager=graph.against_eager != "off")
        if graph.kind == "inference":
            _cheaper_to_compile(planner, choice)
        choice.timed = self.timed(planner, gm, choice, graph)
        return choice

    def timed(self, planner: Planner, gm: torch.fx.GraphModule, choice: Choice,
              graph: GraphContext) -> Optional[TimedChoice]:
        """The predicted best and, when within ``CLOSE_MARGIN``, the runner-up (each
        compiled once; the decision is cached), with what the config asks beside
        (``checked``: eager under ``against_eager``, lower-precision variants)."""
        base = checked(planner, gm, choice, graph)
        best = _chosen(choice)
        rest = sorted((c for c in choice.candidates if c is not best),
                      key=lambda c: c.estimate_ms)
        close = [c for c in rest if _close(c, best)]
        # a training run's steps repay a second compile, and the calibration, measured on
        # inference cells, predicts training graphs worst (BERT-style: OpenVINO first,
        # whose 39 cut partitions ran 1.8x slower than the Inductor it had timed)
        runner = _affordable(planner, best, close) if graph.kind == "inference" \
            else (close[0] if close else None)
        simple = _simpler(planner, best, rest, graph)
        simple += [c for c in int8_rivals(best, rest, planner.inline)
                   if c is not runner and c not in simple]
        eager = ONLY + planner.fallback_name
        if runner is None and not simple:
            return _with_reserve(base, rest, eager)
        timed = [best]
        keys = {plan_key(best.plan)}
        for c in ([runner] if runner is not None else []) + simple + \
                (base.candidates[1:] if base is not None else []):
            if plan_key(c.plan) not in keys:
                keys.add(plan_key(c.plan))
                timed.append(c)
        if len(timed) < 2:
            return _with_reserve(base, rest, eager)
        if simple and not choice.outcome.against_eager:
            choice.outcome.against_eager = any(ONLY + planner.fallback_name in c.labels
                                               for c in timed)
        margin = base.margin if base is not None else (EAGER_MARGIN if simple else 0.0)
        return _with_reserve(TimedChoice(timed, margin, search=False), rest, eager)


def _with_reserve(timed: Optional[TimedChoice], rest: list[Candidate],
                  eager: str) -> Optional[TimedChoice]:
    """``timed`` with the compiled candidates of ``rest`` (best predicted first) it does
    not time as its reserve (``TimedChoice.reserve``)."""
    if timed is None:
        return None
    keys = {plan_key(c.plan) for c in timed.candidates}
    reserve = tuple(c for c in rest if plan_key(c.plan) not in keys
                    and eager not in c.labels and not c.lowered)
    return replace(timed, reserve=reserve)


def _simpler(planner: Planner, best: Candidate, rest: list[Candidate],
             graph: GraphContext) -> list[Candidate]:
    """The simple alternatives a cut plan must beat by timing (DESIGN: "a plan is
    measured, not predicted, wherever it differs from the simple alternatives"): when
    ``best`` has more partitions than one, the whole graph in eager ATen (unless config
    ``against_eager: off``) and the fastest-predicted whole graph on one compiled backend
    where that has fewer partitions than ``best`` (for an inference graph only when its
    compile is affordable, as for the runner-up). A prediction from per-op cells put a
    BERT-style training step's backward into 19 OpenVINO partitions between 19 eager ones
    at 0.75x eager (issue 48): nothing had timed it against a plan of one partition."""
    cuts = _cuts(best.plan)
    if cuts <= 1:
        return []
    eager = ONLY + planner.fallback_name
    out = []
    singles = [c for c in rest if eager not in c.labels and _cuts(c.plan) < cuts
               and any(label.startswith(ONLY) for label in c.labels)]
    if singles:
        single = min(singles, key=lambda c: c.estimate_ms)
        if graph.kind != "inference" or _affordable(planner, best, [single]) is not None:
            out.append(single)
    if graph.against_eager != "off":
        out += [c for c in rest if eager in c.labels]
    return out


def _cuts(plan: Plan) -> int:
    """Partitions of ``plan`` that compute tensors: one of writes into inputs alone (a KV
    cache's ``copy_``s after the graph) or of size arithmetic alone cuts nothing."""
    return sum(1 for p in plan.partitions
               if any(is_compute(n) and not is_mutating(n) for n in p.nodes))


def _chosen(choice: Choice) -> Candidate:
    """The candidate ``choice``'s outcome names as chosen."""
    return next(c for c in choice.candidates if c.label == choice.outcome.chosen)


def _close(c: Candidate, best: Candidate) -> bool:
    """Whether ``c`` is predicted within CLOSE_MARGIN of ``best``: a difference the
    prediction cannot tell from its own error."""
    return c.estimate_ms <= best.estimate_ms * (1 + CLOSE_MARGIN)


def _compiles_far_longer(seconds: float, than: float) -> bool:
    """Whether a compile predicted at ``seconds`` is more than COMPILE_SHARE times one
    predicted at ``than`` plus COMPILE_SLACK_S."""
    return seconds > COMPILE_SHARE * than + COMPILE_SLACK_S


def _cheaper_to_compile(planner: Planner, choice: Choice) -> None:
    """An inference graph whose predicted best compiles far longer than a candidate
    predicted within CLOSE_MARGIN of it (more than COMPILE_SHARE times that one's
    compile plus COMPILE_SLACK_S) takes that candidate: the prediction cannot tell their
    times apart, and the compile can (a Llama-style decode step: Inductor predicted 10%
    ahead of ONNX Runtime, 30 s of compile against 1 s, the two within 10% when timed).
    The other is then its runner-up, too costly to time (``_affordable``). Never eager
    whole or a cut plan for a whole one (those are timed as the simple alternatives)."""
    best = _chosen(choice)
    best_s = predict_compile_s(best.plan, planner.inline)
    if best_s is None:
        return
    eager = ONLY + planner.fallback_name
    close = sorted((c for c in choice.candidates if c is not best and eager not in c.labels
                    and _cuts(c.plan) <= _cuts(best.plan) and _close(c, best)),
                   key=lambda c: c.estimate_ms)
    for c in close:
        got = predict_compile_s(c.plan, planner.inline)
        if got is not None and _compiles_far_longer(best_s, got):
            log.info("policy calibrated: %s is predicted within %.0f%% of %s and to compile "
                     "in %.1f s against %.1f s: it is chosen", c.label, CLOSE_MARGIN * 100,
                     best.label, got, best_s)
            choice.plan = c.plan
            choice.outcome.chosen = c.label
            return


def _affordable(planner: Planner, best: Candidate, close: list[Candidate]) -> Optional[Candidate]:
    """The first of ``close`` (the runners-up within CLOSE_MARGIN, nearest first) whose
    compile is predicted within COMPILE_SHARE times the best's plus COMPILE_SLACK_S (the
    cost table's compile rows); any when a compile cannot be predicted."""
    best_s = predict_compile_s(best.plan, planner.inline)
    for c in close:
        got = predict_compile_s(c.plan, planner.inline)
        if best_s is None or got is None or not _compiles_far_longer(got, best_s):
            return c
        log.info("policy calibrated: %s is predicted within %.0f%% of %s, but not timed: "
                 "its compile is predicted to take %.1f s against %.1f s", c.label,
                 CLOSE_MARGIN * 100, best.label, got, best_s)
    return None
