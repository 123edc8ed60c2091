"""Policies: how a graph's placement is chosen. A registry, like backends.

A policy gets a ``Planner`` and a graph and returns a ``Choice``: the plan to build, the
candidate placements it considered, and its ``PolicyOutcome`` (kept on the graph's
record, shown in the report). A policy with ``measures = True`` has its candidates timed
on the graph's first real call (``arbiter.run.measured``), which then installs the
fastest and completes the outcome.

Built in:

* ``priority``: the config's order (the first able backend gets a node);
* ``cost``: the candidate with the lowest static estimate (``cost.py``);
* ``measure``: every candidate timed end to end on the first call.

The candidates are whole-graph plans, each made by the linear partitioner:
``priority``, then for every available compiled backend ``only <backend>`` (that
backend alone with the fallback for what it cannot run), and ``only eager``. So a policy
choosing the cheapest of them by its own yardstick never picks something slower than the
best single backend; boundary costs are in the yardstick (the cost model counts
crossings; an end-to-end timing includes them). A plan equal to an earlier candidate is
not kept twice: its label goes to the earlier one's ``also``.

A third-party policy subclasses ``Policy`` and registers with ``@register_policy``; a
config then names it under ``policy:``.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import ClassVar, Optional

import torch.fx

from ..errors import ArbiterError, unknown_name
from .capability import CapabilityTable
from .cost import plan_ms
from .partition import Plan
from .planner import Planner
from .segments import SegmentTimes

PRIORITY = "priority"
ONLY = "only "


@dataclass
class Candidate:
    label: str
    plan: Plan
    estimate_ms: float
    measured_ms: Optional[float] = None  # median of an end-to-end timing, when measured
    spread_ms: Optional[tuple[float, float]] = None  # its quartiles (run/measured.py)
    also: list[str] = field(default_factory=list)  # labels of candidates equal to this one
    steer: Optional[dict] = None  # refined placements: node name -> backend (measured.py)
    eligible: bool = True  # False: a refinement step that did not beat its base enough
    # lower-precision variants (config `accuracy`, docs/precision.md): the variant
    # backends the plan uses; the max error of its outputs against float32 eager on the
    # first call; why it was refused ("" if it was not)
    lowered: tuple[str, ...] = ()
    error: Optional[float] = None
    rejected: str = ""

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


@dataclass
class Choice:
    plan: Plan
    outcome: PolicyOutcome
    candidates: list[Candidate] = field(default_factory=list)


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


def checked_candidates(planner: Planner, gm: torch.fx.GraphModule, plan: Plan,
                       label: str = PRIORITY, variants: bool = False,
                       eager: bool = False) -> list[Candidate]:
    """What a policy that does not measure has timed on the first call beside its own
    ``plan`` (first): with ``variants`` (config `accuracy`), the priority plan with each
    lower-precision variant in its backend's place, verified before it is timed
    (docs/precision.md); with ``eager`` (config `against_eager`), the whole graph in
    eager ATen (``fallback_plan``)."""
    plans = [(label or PRIORITY, plan)]
    if variants:
        plans += variant_plans(planner, gm, False)
    if eager:
        plans.append(fallback_plan(planner, gm))
    return _unique(planner, plans)


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
    """Base class of every policy: a ``name`` and ``choose``; ``measures`` says whether
    the candidates are timed on the first real call (``arbiter.run.measured``)."""

    name: ClassVar[str] = ""
    measures: ClassVar[bool] = False

    def choose(self, planner: Planner, gm: torch.fx.GraphModule) -> Choice:
        raise NotImplementedError


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
        # verified beside this choice (precision_candidates, docs/precision.md)
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
