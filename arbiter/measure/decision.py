"""The measured decision: what the decision cache keeps and what rank 0 broadcasts.

A ``Decision`` names the chosen candidate by its label; a refined or mixed placement,
which another process's candidates do not hold, also carries its node -> backend map by
node position (names may differ between processes), from which it is rebuilt; and every
candidate's measured time, for the report. On disk and on the wire it is JSON
(``to_json``, ``from_json``): an entry of another shape is no decision.
``DecisionCache.for_graph`` keys it by the graph, its real input shapes and dtypes, its
frozen weights' shapes, dtypes and strides (not their bytes: docs/cache.md says why),
the planner's ``decision_parts``, the revision of what policies time (``policy.TIMED``)
and ``measure.mix_max_segments`` when mixing is on.
Under torch.distributed (``process_group``, ``send``, ``receive``) rank 0 alone decides
and broadcasts; the others install its decision untimed (docs/policies.md, "`measure`").
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch.fx

from ..cache import Cache, fingerprint
from ..plan.planner import Planner
from ..plan.policy import TIMED, Candidate

#: The cache's kind of entry for decisions.
KIND = "decision"


@dataclass(frozen=True)
class Decision:
    label: str  # the chosen candidate's
    steer: Optional[dict[int, str]] = None  # refined or mixed: node position -> backend
    measured_ms: dict[str, float] = field(default_factory=dict)  # label -> ms

    @classmethod
    def of(cls, chosen: Candidate, candidates: Sequence[Candidate],
           gm: torch.fx.GraphModule) -> "Decision":
        pos = {n.name: i for i, n in enumerate(gm.graph.nodes)}
        steer = ({pos[k]: b for k, b in chosen.steer.items() if k in pos}
                 if chosen.steer else None)
        return cls(chosen.label, steer, {c.label: c.measured_ms for c in candidates
                                         if c.measured_ms is not None})

    def steer_by_name(self, gm: torch.fx.GraphModule) -> dict[str, str]:
        """The node -> backend map on ``gm``'s node names (positions past its end dropped)."""
        names = [n.name for n in gm.graph.nodes]
        return {names[i]: b for i, b in (self.steer or {}).items() if i < len(names)}

    def to_json(self) -> dict:
        return {"label": self.label,
                "steer": None if self.steer is None else {str(i): b for i, b in self.steer.items()},
                "measured_ms": dict(self.measured_ms)}

    @classmethod
    def from_json(cls, raw: Any) -> Optional["Decision"]:
        """The decision ``raw`` holds, or None when it holds none."""
        if not isinstance(raw, dict) or not isinstance(raw.get("label"), str):
            return None
        steer = raw.get("steer")
        times = raw.get("measured_ms")
        return cls(raw["label"],
                   {int(i): b for i, b in steer.items() if str(i).isdigit()}
                   if isinstance(steer, dict) else None,
                   {k: float(v) for k, v in times.items() if isinstance(v, (int, float))}
                   if isinstance(times, dict) else {})


@dataclass(frozen=True)
class DecisionCache:
    """One graph's entry in the persistent decision cache."""

    cache: Cache
    key: str

    @classmethod
    def for_graph(cls, cache: Optional[Cache], planner: Planner, options: Any,
                  gm: torch.fx.GraphModule,
                  args: Sequence[Any]) -> Optional["DecisionCache"]:
        """The entry of ``gm`` on these inputs (see the module docstring); None without a
        cache."""
        if cache is None:
            return None
        # TIMED: the rules of what a policy times; a decision made under older ones (a
        # PT2E CNN's, made before its int8 candidate was timed) is made again
        parts = {**planner.decision_parts(), "weights": "shapes only", "timed": TIMED}
        if getattr(options, "mix", False):
            # mixing adds a candidate: a decision made without it is made again
            parts = {**parts, "mix": options.mix_max_segments}
        # the weights are placeholders: graph_text keys their shapes, dtypes and strides
        return cls(cache, fingerprint(gm, args, parts))

    def get(self) -> Any:
        """What the entry holds (None when nothing): ``Decision.from_json`` reads it."""
        return self.cache.get_json(KIND, self.key)

    def put(self, decision: Decision) -> None:
        self.cache.put_json(KIND, self.key, decision.to_json())


def process_group() -> Any:
    """``torch.distributed`` when a process group of more than one rank is up, else
    None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return dist


def send(group: Any, decision: Decision) -> None:
    """Rank 0: broadcast ``decision`` to the other ranks."""
    group.broadcast_object_list([decision.to_json()], src=0)


def receive(group: Any) -> Any:
    """Another rank: what rank 0 broadcast (``Decision.from_json`` reads it)."""
    box: list = [None]
    group.broadcast_object_list(box, src=0)
    return box[0]
