"""What the steps of one probe share (``Probe``), and one OpInfo in one dtype (``Case``).

Passed to each step instead of their fields one by one.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.fx

from ..plan.capability import narrow_refusal
from ..manifest import Manifest
from ..ops import op_name, packet_name
from ..backend import Backend
from .result import ProbeResult, SampleResult


@dataclass
class Probe:
    """One probe: the backend, its manifest, the result being filled, the tolerances."""

    backend: Backend
    manifest: Manifest
    result: ProbeResult
    tolerances: Optional[dict] = None

    def refused(self, nodes: Sequence[torch.fx.Node]) -> str:
        """Why the backend refuses a node of the sample ("" if none): a tensor of a dtype
        it holds narrower (``Backend.narrow_dtypes``: OpenVINO's int64) or one of its
        validators; arbiter never hands such a node to it (plan/capability.py), so the sample
        says nothing about the backend."""
        validators = self.backend.validators
        for n in nodes:
            name = op_name(n.target)
            why = narrow_refusal(self.backend, n, name)
            if why:
                return f"{name}: {why}"
            check = validators.get(name) or validators.get(packet_name(name))
            why = check(n) if check is not None else None
            if why:
                return f"{name}: {why}"
        return ""

    def missing(self, names: Sequence[str]) -> list[str]:
        """The op names the manifest has no entry for, sorted."""
        return sorted({n for n in names if self.manifest.entry(n) is None})


@dataclass(frozen=True)
class Case:
    """One OpInfo in one dtype: ``label`` is its name with its variant, ``dname`` the
    dtype's name."""

    info: Any
    label: str
    dname: str
    dtype: torch.dtype

    def sample(self, ops: Sequence[str], status: str, stage: str = "", reason: str = "",
               max_error: Optional[float] = None, graph: str = "") -> SampleResult:
        return SampleResult(self.label, self.dname, list(ops), status, stage, reason,
                            max_error, graph)

    def skipped(self, stage: str, reason: str, ops: Sequence[str] = (),
                graph: str = "") -> SampleResult:
        return self.sample(ops, "skipped", stage, reason, graph=graph)
