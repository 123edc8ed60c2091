"""Checked before trusted: a partition holding unverified ops is compared with eager first.

With ``verify: {mode: unverified}`` (the default), when a backend has compiled a partition,
``FirstUse.needed`` lists the (op, dtype) pairs of what the backend got (its
decompositions applied) that no probe verified (arbiter/plan/evidence.py), and the
partition itself when it holds several compute nodes (``composed``: the probes verify ops
one by one, never what a backend makes of them together). If there are any, the
partition's first call on that backend is a verified call (``run.piece.Piece``):
the inputs are copied, the backend runs, eager ATen runs on the copies, and every output
of the partition is compared, saved-for-backward ones included (a forward graph returns
them). If they differ, the partition falls back down its chain (stage ``verify``) and
that call returns eager's result; then ``FirstUse.localize`` runs each unverified node
alone through the backend, on the values eager computed for its inputs, to find which op
and which output differ, and keeps each as a finding (arbiter/plan/findings.py): the planner
refuses it from then on, in this process and, through the persistent cache, in later
ones. A difference no single node reproduces is kept as the partition's own finding:
later processes skip that backend for that partition (``FirstUse.skip``).

Each check is kept on the partition's record (``FirstUseCheck``) for the report.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.fx
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from ...backend import Backend
from ...cache import fingerprint
from ...errors import describe
from ...ops import op_name
from ...plan.evidence import Unverified, compute_nodes, manifest_owner, node_dtypes, \
    principal_dtype, unverified
from ...plan.findings import ALL_OUTPUTS, PARTITION_OP, Finding, findings, new_finding
from ..chain import Entry
from ..isolation import tracing_in_this_thread
from .verify import compare

log = logging.getLogger(__name__)

#: at most this many distinct nodes are run alone to find the one that differs
LOCALIZE_LIMIT = 16


@dataclass
class FirstUseCheck:
    """One backend's first-use check of a partition."""

    backend: str
    unverified: list[str]  # "aten.x.default float32 (verified: declared)"
    result: str = "pending"  # "passed", "failed", "not checked: <why>"
    detail: str = ""  # what differed
    findings: list[str] = field(default_factory=list)  # "aten.x.default output 3 float32"


class FirstUse:
    """The first-use checks of one config: what needs one, what a failure was."""

    def __init__(self, tolerances: Any = None):
        self.tolerances = tolerances

    @staticmethod
    def needed(backend: Entry, gm: torch.fx.GraphModule, symbolic: bool) -> list[Unverified]:
        """The unverified (op, dtype) pairs of ``gm`` as ``backend`` compiled it, and the
        partition itself when it holds several compute nodes (``composed``)."""
        try:
            found = unverified(backend, gm, symbolic)
        except Exception as exc:  # noqa: BLE001 - what cannot be judged is checked
            log.debug("cannot judge the evidence for %s", backend.name, exc_info=True)
            found = [Unverified("?", "", f"its evidence could not be read ({describe(exc)})")]
        whole = composed(gm)
        return found + [whole] if whole is not None else found

    @staticmethod
    def skip(backend: Entry, gm: torch.fx.GraphModule, args: Sequence[Any]) -> Optional[str]:
        """Why ``backend`` must not run this partition: a first-use check in an earlier
        process found it wrong as a whole. None otherwise."""
        owner = manifest_owner(backend)
        version = _version(owner)
        known = findings().for_op(owner.name, version, PARTITION_OP)
        if not known:
            return None
        key = _partition_key(owner, version, gm, args)
        for f in known:
            if f.dtype == key:
                return f"this partition {f.reason()}"
        return None

    def localize(self, backend: Entry, gm: torch.fx.GraphModule, args: Sequence[Any],
                 items: Sequence[Unverified], detail: str) -> list[Finding]:
        """After ``gm`` (as ``backend`` compiled it) differed from eager on ``args`` (copies
        of the inputs, as they were): find, keep and return what differs (module docstring)."""
        owner = manifest_owner(backend)
        version = _version(owner)
        found: list[Finding] = []
        try:
            # backends trace: not under the dispatch modes of AOTAutograd's runtime
            with _disable_current_modes(), tracing_in_this_thread():
                found = self._by_node(owner, version, gm, args, items)
        except Exception:  # noqa: BLE001 - a search that fails leaves the partition's finding
            log.debug("first-use localization failed", exc_info=True)
        if not found:
            found = [new_finding(owner.name, version, PARTITION_OP,
                                 _partition_key(owner, version, gm, args), ALL_OUTPUTS,
                                 f"{detail} (no single node differs alone)")]
        for f in found:
            findings().add(f)
        return found

    def _by_node(self, backend: Backend, version: str, gm: torch.fx.GraphModule,
                 args: Sequence[Any], items: Sequence[Unverified]) -> list[Finding]:
        wanted = {(u.op, u.dtype) for u in items}
        ops = {u.op for u in items}
        values = _eager_values(gm, args)
        tried: set = set()
        found: list[Finding] = []
        for node in compute_nodes(gm):
            name = op_name(node.target)
            if name not in ops or not any((name, d) in wanted or (name, "") in wanted
                                          for d in node_dtypes(node)):
                continue
            key = (name, tuple(node_dtypes(node)))
            if key in tried or len(tried) >= LOCALIZE_LIMIT:
                continue
            tried.add(key)
            for k, why in self._alone(backend, node, values):
                found.append(new_finding(backend.name, version, name, principal_dtype(node),
                                         k, why))
        return found

    def _alone(self, backend: Backend, node: torch.fx.Node,
               values: dict) -> list[tuple[int, str]]:
        """(output index or ALL_OUTPUTS, what differs) for ``node`` run alone through
        ``backend`` on the eager values of its inputs; [] when it equals eager (or cannot
        be run alone: that is not evidence against it)."""
        from torch.fx.experimental.proxy_tensor import make_fx

        from ...decompose import for_backend

        # tensors become the graph's inputs; sizes (SymInts in a symbolic graph) constants
        tensors = [a for a in node.all_input_nodes if isinstance(values[a], torch.Tensor)]
        inputs = [values[a] for a in tensors]
        where = {a: i for i, a in enumerate(tensors)}

        def one(*ts):
            def value(a: torch.fx.Node) -> Any:
                return ts[where[a]] if a in where else values[a]

            call_args = torch.fx.node.map_arg(node.args, value)
            call_kwargs = torch.fx.node.map_arg(node.kwargs, value)
            out = node.target(*call_args, **call_kwargs)
            return tuple(t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))

        expected = one(*[t.clone() for t in inputs])
        try:
            alone = make_fx(one, tracing_mode="fake")(*inputs)
            fn = backend.compile(for_backend(alone, backend), [t.clone() for t in inputs])
            got = list(fn(*[t.clone() for t in inputs]))
        except Exception:  # noqa: BLE001 - loud failures are not what we look for
            log.debug("%s alone on %s", node.target, backend.name, exc_info=True)
            return []
        if len(got) != len(expected):
            return [(ALL_OUTPUTS, f"returned {len(got)} outputs, eager {len(expected)}")]
        wrong = []
        for k, (e, g) in enumerate(zip(expected, got)):
            cmp = compare([e], [g], self.tolerances)
            if not cmp.ok:
                wrong.append((k, re.sub(r"^output 0 \((\w+)\):? ?", r"\1 ", cmp.detail)))
        if len(expected) == 1 and wrong:
            return [(ALL_OUTPUTS, wrong[0][1])]
        return wrong


def composed(gm: torch.fx.GraphModule) -> Optional[Unverified]:
    """The partition as a whole, when it holds two compute nodes or more: the probes run
    each op alone, and a backend compiles a partition's ops together (fused kernels, graph
    rewrites), which no probe saw. Inductor's fused backward of a Falcon-style layer
    (transformers' FalconModel, torch 2.13) gave gradients off by 7% (RMS 0.22 against a
    float64 reference, eager's 1.7e-06) with every op probed: unchecked, that was a
    silent wrong gradient. A failure no single node reproduces is kept as the partition's
    own finding (``localize``)."""
    n = len(compute_nodes(gm))
    if n < 2:
        return None
    return Unverified(f"{n} ops compiled together", "",
                      "the probes ran each op alone; counted as the backend got them, "
                      "its decompositions applied")


def _eager_values(gm: torch.fx.GraphModule, args: Sequence[Any]) -> dict:
    """Every node's value when ``gm`` runs in eager on ``args``."""
    values: dict = {}

    class Keep(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            out = super().run_node(n)
            values[n] = out
            return out

    with torch.no_grad():
        Keep(gm).run(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    return values


def _partition_key(backend: Backend, version: str, gm: torch.fx.GraphModule,
                   args: Sequence[Any]) -> str:
    return fingerprint(gm, args, {"first_use": backend.name, "version": version})[:32]


def _version(backend: Backend) -> str:
    try:
        return str(backend.version())
    except Exception:  # noqa: BLE001 - findings are then filed under "unknown"
        return "unknown"

