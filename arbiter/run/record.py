"""What happened to one compiled graph (``GraphRecord``) and its pieces (``PieceRecord``).

Its plan, its pieces' records (what ran, its fallbacks and checks), the policy's
outcome, its frozen weights and their changes. Kept by the ``Arbiter``, updated by the
runtime (``piece`` falls back, ``measured`` installs a choice, ``freeze`` re-freezes),
read by the report.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from ..plan.partition import Plan
from ..plan.policy import PolicyOutcome
from .chain import Link
from .checks.first_use import FirstUseCheck
from .freeze import WeightEvent
from .owner import UNKNOWN, Owner
from .step import StepRecord


@dataclass
class Fallback:
    """One step down a chain: from which backend to which, at which stage, and why."""

    from_backend: str
    to_backend: str
    stage: str  # "compile", "run" (raised, or wrong output metadata) or "verify"
    reason: str


@dataclass
class PieceRecord:
    """What happened to one partition. Mutable: runtime fallbacks update it."""

    partition_id: int
    planned: str
    chain: list[str]
    backend: str = ""  # what runs now ("" until compiled)
    precision: str = ""  # the running backend's lower precision ("bf16"); "": the graph's
    compile_s: float = 0.0
    restride_copies: int = 0
    calls: int = 0  # counted only while timing is on (Piece.timed)
    run_s: float = 0.0
    copies: int = 0  # tensor copies made at this partition's boundary (inputs, outputs)
    verify_checks: int = 0  # accuracy checks against eager ATen (config `verify`)
    verify_max_error: Optional[float] = None
    fallbacks: list[Fallback] = field(default_factory=list)
    shapes: str = "static"  # or "symbolic" (one artifact), "per shape" (run.dynamic)
    specializations: int = 0  # shapes compiled, when "per shape"
    # exact_nonfinite: guard: the ops the running backend computes unlike eager on NaN or
    # inf inputs, and the calls that therefore ran in eager (an input held NaN or inf)
    nonfinite_ops: list[str] = field(default_factory=list)
    nonfinite_calls: int = 0
    # verify `unverified`: each backend's first-use check (run/checks/first_use.py)
    first_use: list[FirstUseCheck] = field(default_factory=list)
    # the chain as data (run/chain.py), whose labels ``chain`` holds: what a saved file keeps
    links: list[Link] = field(default_factory=list)

    @classmethod
    def of_links(cls, partition_id: int, planned: str, links: Sequence[Link],
                 **fields: Any) -> "PieceRecord":
        return cls(partition_id, planned, [k.label for k in links], links=list(links),
                   **fields)


@dataclass
class GraphRecord:
    graph_id: int
    kind: str  # inference, forward or backward
    plan: Plan
    records: dict[int, PieceRecord]  # partition id -> its piece's record
    outcome: PolicyOutcome
    plan_s: float
    constant_nodes: frozenset = frozenset()  # placeholders frozen as constants
    weight_events: list[WeightEvent] = field(default_factory=list)
    weights_as_inputs: bool = False  # frozen weights changed too often: now inputs
    owner: Owner = UNKNOWN  # the compiled model it belongs to (run/owner.py)
    symbols: dict = field(default_factory=dict)  # name -> shapes.SymbolRange (inputs' symbols)
    frame: Optional[tuple[int, int]] = None  # Dynamo's (frame id, compile index of that frame)
    # a training graph's compiled plan against Dynamo's graph in eager (run/step.py)
    step: Optional[StepRecord] = None
    # node -> what every configured backend said of it (the priority plan's verdicts):
    # a single-backend plan's own ``support`` knows only its backend (the report's
    # coverage and op table read this); None: ``plan.support``
    support: Optional[dict] = None

    @property
    def verdicts(self) -> dict:
        """Node -> its NodeSupport from every configured backend (see ``support``)."""
        return self.support if self.support is not None else self.plan.support

    def verdict(self, node: Any) -> Any:
        """``node``'s NodeSupport from every configured backend, else the plan's own."""
        found = self.support.get(node) if self.support is not None else None
        return found if found is not None else self.plan.support[node]

    @property
    def constants(self) -> int:
        return len(self.constant_nodes)

    def running(self, part: Any) -> str:
        """The backend running partition ``part`` of this graph now: its piece's (after
        any fallback), the planned one before it compiled."""
        piece = self.records.get(part.id)
        return piece.backend if piece is not None and piece.backend else part.backend


@dataclass
class DynamoGraph:
    """One graph Dynamo handed to the backend: whose, and why Dynamo ended it there
    (``gm.compile_subgraph_reason``, what ``torch._dynamo.explain`` reads)."""

    owner: Owner
    graph_break: bool
    reason: str = ""


def dynamo_graph(gm: object, owner: Owner) -> DynamoGraph:
    """What Dynamo says of ``gm``: a graph break ended it (and where), or not."""
    r = getattr(gm, "compile_subgraph_reason", None)
    if r is None or not getattr(r, "graph_break", False):
        return DynamoGraph(owner, False)
    frames = getattr(r, "user_stack", None) or []
    where = f" [{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}]" if frames else ""
    text = str(getattr(r, "reason", r)).strip().splitlines()
    return DynamoGraph(owner, True, f"{text[0][:300] if text else '?'}{where}")
