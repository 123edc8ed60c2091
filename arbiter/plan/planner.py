"""One config's planning facts: what policies read instead of the ``Arbiter``.

A ``Planner`` holds the chain of backends (config order, eager last), the ones that are
unavailable and why, the capability table, and the knobs that shape a plan
(``min_block_size``; ``exclude_ops`` and ``pin`` live in the table). It plans a graph,
gives a partition its fallback chain, and says what besides the graph decides a measured
choice (the decision cache's key).
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Optional, Union

import torch.fx

from ..backend import Backend
from ..ops import is_getitem
from .capability import CapabilityTable
from .partition import Partition, Plan, partition_graph
from .patterns import PatternTable, with_patterns
from .support import SupportTable


class Planner:
    def __init__(self, backends: Mapping[str, Backend], unavailable: Mapping[str, str], *,
                 exclude_ops: Sequence[str] = (), pin: Optional[Mapping[str, str]] = None,
                 min_block_size: int = 1, decision_config: Optional[dict] = None,
                 max_specializations: int = 8, random: str = "eager"):
        self.random = random  # the config's `random:` (capability.CapabilityTable)
        self.backends: dict[str, Backend] = dict(backends)  # config order, eager last
        self.unavailable: dict[str, str] = dict(unavailable)
        self.exclude_ops = list(exclude_ops)
        self.pin = dict(pin or {})
        self.min_block_size = min_block_size
        self.max_specializations = max_specializations
        self._decision_config = dict(decision_config or {})
        #: lower-precision variants (config `accuracy`), by name (``openvino:bf16``);
        #: not in the chain: candidates only (docs/precision.md)
        self.variants: dict[str, Backend] = {}
        #: policy `calibrated`: backend -> ``predict.BackendCalibration`` of this machine
        #: (set by the Arbiter: ``measure.calibration.Calibrations.get``; called with
        #: False, nothing is measured); None: the static table prices every backend
        self.calibration: Optional[Callable[..., dict]] = None
        #: fed a first call's timed candidates, to correct later predictions (set by the
        #: Arbiter: ``measure.calibration.Calibrations.observe``)
        self.observe: Optional[Callable[..., None]] = None
        self.table = self.table_for(list(self.backends.values()))
        self.fallback_name = self.table.fallback_name

    def table_for(self, backends: Sequence[Backend],
                  pin: Optional[Mapping[str, str]] = None
                  ) -> Union[CapabilityTable, PatternTable]:
        """A capability table over ``backends`` (the last takes everything) with this
        config's excludes, pins and unavailable backends, and the patterns their
        manifests claim (``patterns.with_patterns``)."""
        return with_patterns(CapabilityTable(backends, exclude_ops=self.exclude_ops,
                                             pin=self.pin if pin is None else pin,
                                             unavailable=self.unavailable,
                                             max_specializations=self.max_specializations,
                                             random=self.random))

    def backend(self, name: str) -> Backend:
        """A backend of the chain or a variant, by name."""
        return self.backends[name] if name in self.backends else self.variants[name]

    @property
    def inline(self) -> set[str]:
        """Backends whose partitions run in place (eager): no call, no boundary."""
        return {n for n, b in self.backends.items() if b.inline_aten}

    def plan(self, gm: torch.fx.GraphModule, table: Optional[SupportTable] = None) -> Plan:
        """The plan of ``gm`` (nodes need ``meta["val"]``) under ``table`` (default: the
        config's, in priority order)."""
        return partition_graph(gm, table if table is not None else self.table,
                               self.min_block_size)

    def with_variant(self, variant: Backend) -> Union[CapabilityTable, PatternTable]:
        """The config's table with ``variant`` in its base backend's place, and the pins
        to that backend pinned to it: the priority plan with that backend at the
        variant's lower precision."""
        base = variant.base_name
        return self.table_for([variant if b.name == base else b
                               for b in self.backends.values()],
                              pin={op: variant.name if b == base else b
                                   for op, b in self.pin.items()})

    def chain_for(self, plan: Plan, part: Partition) -> list[Backend]:
        """The planned backend, then every later backend able to run all its nodes. A
        lower-precision variant's chain is the variant, then its base backend's chain
        (the same manifest: the base runs whatever the variant was given)."""
        variant = self.variants.get(part.backend)
        if variant is not None:
            base = self.backends[variant.base_name]
            rest = [base] + [b for b in self.backends.values() if b.inline_aten]
            return [variant] + list(dict.fromkeys(rest))
        names = list(self.backends)
        chain = [self.backends[part.backend]]
        for name in names[names.index(part.backend) + 1:]:
            backend = self.backends[name]
            if backend.inline_aten or all(
                    name in plan.support[n].candidates for n in part.nodes if not is_getitem(n)):
                chain.append(backend)
        return chain

    def decision_parts(self) -> dict:
        """What besides the graph decides a measured choice: part of its cache key."""
        live = {n: b for n, b in self.backends.items() if n not in self.unavailable}
        # the manifests decide which placements exist: a decision measured before a
        # manifest changed (a re-probe, a hand edit) is measured again
        return {"policy": "measure", "config": self._decision_config,
                "versions": {n: safe_version(b) for n, b in live.items()},
                "manifests": {n: manifest_digest(b) for n, b in live.items()}}


def safe_version(backend: Backend) -> Optional[str]:
    try:
        return backend.version()
    except Exception:  # noqa: BLE001 - a version probe must not break a report
        return None


def manifest_digest(backend: Backend) -> Optional[str]:
    """A short digest of the backend's manifest (what it declares it can run)."""
    try:
        return hashlib.sha256(backend.manifest().model_dump_json().encode()).hexdigest()[:16]
    except Exception:  # noqa: BLE001 - an unreadable manifest fails planning, not this
        return None
