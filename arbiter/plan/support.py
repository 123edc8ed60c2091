"""What the partitioner reads: a declared interface, and a view preferring one backend.

``SupportTable`` is the partitioner's whole view of capability (torch.fx's
``OperatorSupportBase`` plays this part upstream): for each node, the backends able to run
it, best first, and why the others refused (``capability.NodeSupport``).
``capability.CapabilityTable`` implements it from manifests and validators; ``Preferred``
wraps any implementation to put a chosen backend first for chosen nodes, which is how
policy `measure` steers a refinement and how the report's advice asks "what if backend X
ran op Y".
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Optional, Protocol

import torch.fx

from .capability import NodeSupport


class SupportTable(Protocol):
    """Which backends can run each node, best first; the last one takes everything.

    A table may also have ``pattern_groups(nodes, support) -> [patterns.PatternGroup]``:
    matches of patterns that backends claim whole (``patterns.PatternTable`` does)."""

    fallback_name: str

    def support_all(self, nodes: Sequence[torch.fx.Node]) -> list[NodeSupport]: ...


class Preferred:
    """``table`` with ``prefer(node)`` (a backend name, or None) first for each node.

    By default the preferred backend is moved to the front only where it is already able
    to run the node; with ``force`` it is put first even where it refused (a what-if:
    the report's advice)."""

    def __init__(self, table: SupportTable, prefer: Callable[[torch.fx.Node], Optional[str]],
                 *, force: bool = False):
        self._table = table
        self._prefer = prefer
        self._force = force
        self.fallback_name = table.fallback_name

    def support_all(self, nodes: Sequence[torch.fx.Node]) -> list[NodeSupport]:
        out = []
        for node, sup in zip(nodes, self._table.support_all(nodes)):
            b = self._prefer(node)
            if b is not None and sup.candidates[0] != b and (self._force or b in sup.candidates):
                sup = replace(sup, candidates=(b, *(c for c in sup.candidates if c != b)))
            out.append(sup)
        return out

    def pattern_groups(self, nodes, support) -> list:
        """The wrapped table's pattern groups, a match's preferred backend first (the first
        of its nodes with a preference decides)."""
        find = getattr(self._table, "pattern_groups", None)
        out = []
        for g in find(nodes, support) if find is not None else ():
            cands = g.support.candidates
            b = next((p for p in map(self._prefer, g.nodes) if p is not None), None)
            if g.claimed_by and b is not None and cands[0] != b and (self._force or b in cands):
                g = replace(g, support=NodeSupport((b, *(c for c in cands if c != b)),
                                                   g.support.refusals))
            out.append(g)
        return out


class FixedSupport:
    """A ``SupportTable`` answering from support already computed (a plan's
    ``support`` and ``patterns``): replanning a graph under other preferences checks
    nothing again."""

    def __init__(self, support: dict[torch.fx.Node, NodeSupport], fallback_name: str,
                 groups: Sequence = ()):
        self._support = support
        self._groups = list(groups)
        self.fallback_name = fallback_name

    def support_all(self, nodes: Sequence[torch.fx.Node]) -> list[NodeSupport]:
        return [self._support[n] for n in nodes]

    def pattern_groups(self, nodes, support) -> list:
        return self._groups
