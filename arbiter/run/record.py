"""What happened to one compiled graph: its plan, its pieces' records, the policy's
outcome, its frozen weights and their changes. Kept by the ``Arbiter``, updated by the
runtime (``measured`` installs a choice, ``freeze`` re-freezes), read by the report."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..plan.partition import Plan
from ..plan.policy import PolicyOutcome
from .freeze import WeightEvent
from .piece import PieceRecord


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
    symbols: dict = field(default_factory=dict)  # name -> shapes.SymbolRange (inputs' symbols)
    frame: Optional[tuple[int, int]] = None  # Dynamo's (frame id, compile index of that frame)

    @property
    def constants(self) -> int:
        return len(self.constant_nodes)
