"""Evidence before trust: which nodes of a graph no probe verified on a backend.

A manifest entry is a claim until a probe ran it and compared it with eager. A node
handed to a backend is *verified* when its op's entry was probed (``verified: probed``)
in every dtype the node's tensors have, and, when the backend compiles it with symbolic
sizes, the entry says ``dynamic: true``. Anything else is *unverified*: ``declared`` or
``built`` entries, dtypes no probe tried, an op without an entry of its own (a
pattern's node), and every entry whose probe ran with another torch release, backend
version or device. With ``verify: {mode: unverified}`` (the default) a partition holding
one is compared with eager ATen on its first call (arbiter/run/checks/first_use.py;
docs/robustness.md, "`unverified`"). Callers pass the graph the backend gets, after
``decompose.for_backend``.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from ..backend import Backend
from ..manifest import other_torch, release
from ..ops import is_getitem, op_name, produces_tensor
from .capability import tensor_descs


@dataclass(frozen=True)
class Unverified:
    """One (op, dtype) of a graph that no probe verified on a backend, and why."""

    op: str
    dtype: str  # "" when the op has no manifest entry at all
    why: str

    def __str__(self) -> str:
        return f"{self.op}{' ' + self.dtype if self.dtype else ''} ({self.why})"


def manifest_owner(backend: Any) -> Any:
    """The backend whose manifest speaks for ``backend`` (a shape view of run/dynamic.py
    wraps one as ``.backend``; a lower-precision variant shares its base's manifest)."""
    while not hasattr(backend, "manifest") and hasattr(backend, "backend"):
        backend = backend.backend
    return backend


def unverified(backend: Any, gm: torch.fx.GraphModule, symbolic: bool = False
               ) -> list[Unverified]:
    """The (op, dtype) pairs of ``gm`` (as ``backend`` gets it) no probe verified, in graph
    order, each once. ``symbolic``: the backend compiles ``gm`` once for every size."""
    owner = manifest_owner(backend)
    manifest = owner.manifest()
    stale = other_versions(owner, manifest)
    found: dict[tuple[str, str], Unverified] = {}
    memo: dict = {}
    for node in _compute_nodes(gm.graph.nodes):
        name = op_name(node.target)
        entry = manifest.entry(name)
        descs = tensor_descs(node, memo)
        dtypes = list(dict.fromkeys(_dtype_name(d.dtype) for d in descs if d.dtype is not None))
        if entry is None:
            found.setdefault((name, ""), Unverified(
                name, "", f"not in the {owner.name} manifest (a pattern's node)"))
            continue
        why_not = stale or _other_device(manifest, descs)
        probed = {_dtype_name(d) for d in entry.probed_dtypes or ()} \
            if entry.verified == "probed" and not why_not else set()
        for dt in dtypes:
            if dt in probed:
                continue
            why = (why_not if why_not and entry.verified == "probed"
                   else f"verified: {entry.verified}" if not probed
                   else f"probed in {', '.join(sorted(probed))} only")
            found.setdefault((name, dt), Unverified(name, dt, why))
        if symbolic and not entry.dynamic and any(d.symbolic for d in descs):
            dt = dtypes[0] if dtypes else ""
            found.setdefault((name, dt + ":dynamic"), Unverified(
                name, dt, "not probed with symbolic shapes"))
    return list(found.values())


def _other_device(manifest: Any, descs: list) -> str:
    """Why the probe's device is not this node's (``""`` when it is, or no probe ran)."""
    devices = {d.device for d in descs if d.device}
    if manifest.probe is None or devices <= {manifest.probe.device}:
        return ""
    return f"probed on {manifest.probe.device}, this runs on {', '.join(sorted(devices))}"


def other_versions(backend: Backend, manifest: Any) -> str:
    """Why ``manifest``'s probe results were found with other software than this
    process runs (another torch release, another backend version), or ``""``."""
    probe = manifest.probe
    if probe is None:
        return ""
    why = other_torch(manifest)
    if why:
        return why
    try:
        version = str(backend.version())
    except Exception as exc:  # noqa: BLE001 - a version we cannot read is not the probe's
        return f"probed with {probe.backend_version}; this version unreadable ({exc})"
    if release(version) != release(probe.backend_version):  # `+cpu` / `+cu130`: one release
        return f"probed with {probe.backend_version}, this is {version}"
    return ""


def principal_dtype(node: torch.fx.Node) -> str:
    """The dtype a finding about ``node`` is filed under: its first floating tensor's,
    else its first tensor's."""
    descs = [d for d in tensor_descs(node) if d.dtype is not None]
    for d in descs:
        if d.dtype.is_floating_point or d.dtype.is_complex:
            return _dtype_name(d.dtype)
    return _dtype_name(descs[0].dtype) if descs else ""


def node_dtypes(node: torch.fx.Node) -> list[str]:
    return [_dtype_name(d.dtype) for d in tensor_descs(node) if d.dtype is not None]


def is_compute(n: torch.fx.Node) -> bool:
    """Whether ``n`` is an ATen node that computes tensors (not a ``getitem``, not size
    arithmetic)."""
    return n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) \
        and not is_getitem(n) and produces_tensor(n)


def _compute_nodes(nodes: Iterable[torch.fx.Node]) -> Iterable[torch.fx.Node]:
    return (n for n in nodes if is_compute(n))


def compute_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The ATen nodes of ``gm`` that compute tensors (what a backend is judged on)."""
    return list(_compute_nodes(gm.graph.nodes))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
