"""``Arbiter``: the torch.compile backend that splits graphs across backends.

Call hierarchy for one Dynamo graph::

    Arbiter.__call__(gm, example_inputs)          # Dynamo hands us a Torch-IR graph
      lowering.lower                              # AOTAutograd -> ATen graphs
        Arbiter._compile_graph(graph, kind)       # once per inference/forward/backward graph
          Arbiter.plan -> partition.partition_graph   # who runs what
          split.extract / runtime.Piece           # one lazily compiled piece per partition
          split.stitch                            # one GraphModule calling the pieces
    Arbiter.report()                              # what ran where, from the live records
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.fx

from .capability import CapabilityTable, is_getitem
from .config import Config, ConfigLike, load_config
from .ops import op_name
from .partition import Plan, partition_graph
from .registry import Backend, get_backend_class
from .report import (BackendStatus, FallbackReport, GraphReport, PartitionReport,
                     RefusalReport, Report)
from .runtime import Piece, PieceRecord
from .split import extract, stitch

log = logging.getLogger(__name__)


@dataclass
class _GraphRecord:
    graph_id: int
    kind: str
    plan: Plan
    records: dict[int, PieceRecord]
    constants: int
    plan_s: float


class Arbiter:
    """A torch.compile backend over the backends of one config.

    ``Arbiter(config)`` takes a path, the name of a shipped config, a dict, an
    ``arbiter.Config``, or None (the embedded default). Use it as
    ``torch.compile(model, backend=Arbiter(...))``; ``report()`` then says what ran where.
    With ``dry_run=True`` it plans but compiles nothing and runs the graphs in eager.
    """

    def __init__(self, config: ConfigLike = None, *, dry_run: bool = False):
        self.config: Config = load_config(config)
        self.dry_run = dry_run
        self.backends: dict[str, Backend] = {}
        self.unavailable: dict[str, str] = {}
        for name in self.config.chain_names():
            cls = get_backend_class(name)
            backend = cls(cls.Options.model_validate(self.config.options_for(name)))
            ok, why = backend.available()
            if not ok:
                hint = f" (install: {cls.install_hint})" if cls.install_hint else ""
                self.unavailable[name] = why + hint
                log.warning("backend %s is unavailable: %s%s", name, why, hint)
            self.backends[name] = backend
        chain = list(self.backends.values())
        self.table = CapabilityTable(chain, exclude_ops=self.config.exclude_ops,
                                     pin=self.config.pin, unavailable=self.unavailable)
        self._graphs: list[_GraphRecord] = []
        self._lock = threading.Lock()
        names = list(self.config.decompositions)
        for backend in chain:
            if backend.name not in self.unavailable:
                names += [d for d in backend.manifest().decompositions if d not in names]
        from .lowering import decomposition_table

        self._decompositions = decomposition_table(names)

    # -- torch.compile backend -------------------------------------------------------
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **_: Any) -> Callable:
        from .lowering import lower

        return lower(gm, example_inputs, self._compile_graph,
                     decompositions=self._decompositions,
                     freeze_weights=self.config.freeze_weights)

    # -- planning --------------------------------------------------------------------
    def plan(self, gm: torch.fx.GraphModule) -> Plan:
        """The partition plan for an ATen FX graph (nodes need ``meta["val"]``)."""
        return partition_graph(gm, self.table, self.config.min_block_size)

    def chain_for(self, plan: Plan, part) -> list[Backend]:
        """The planned backend, then every later backend able to run all its nodes."""
        names = list(self.backends)
        start = names.index(part.backend)
        chain = [self.backends[part.backend]]
        for name in names[start + 1:]:
            backend = self.backends[name]
            if backend.inline_aten or all(
                    name in plan.support[n].candidates for n in part.nodes if not is_getitem(n)):
                chain.append(backend)
        return chain

    def _compile_graph(self, gm: torch.fx.GraphModule, kind: str,
                       constants: dict[torch.fx.Node, torch.Tensor]) -> Callable:
        start = time.perf_counter()
        plan = self.plan(gm)
        plan_s = time.perf_counter() - start
        with self._lock:
            graph_id = len(self._graphs)
        label = f"graph {graph_id} ({kind})"
        records: dict[int, PieceRecord] = {}
        runners = {}
        inline = set()
        for part in plan.partitions:
            chain = self.chain_for(plan, part)
            record = PieceRecord(part.id, part.backend, [b.name for b in chain])
            records[part.id] = record
            if chain[0].inline_aten or self.dry_run:
                record.backend = part.backend if not self.dry_run else ""
                inline.add(part.id)
                continue
            sub = extract(plan, part, constants)
            runners[part.id] = (sub, Piece(record, sub.gm, chain, label))
        stitched = stitch(plan, runners, inline)
        with self._lock:
            self._graphs.append(_GraphRecord(graph_id, kind, plan, records, len(constants), plan_s))
        log.info("%s: %d nodes in %d partitions (%s), planned in %.1f ms", label,
                 sum(p.size for p in plan.partitions), len(plan.partitions),
                 ", ".join(sorted({p.backend for p in plan.partitions})), plan_s * 1e3)
        return stitched

    # -- reporting -------------------------------------------------------------------
    def report(self) -> Report:
        """What ran where: built from the live records, so fallbacks show at once."""
        statuses = []
        for name, backend in self.backends.items():
            ok = name not in self.unavailable
            statuses.append(BackendStatus(name=name, available=ok,
                                          reason=self.unavailable.get(name, ""),
                                          version=_safe_version(backend) if ok else None))
        with self._lock:
            graphs = list(self._graphs)
        return Report(config=self.config.source, dry_run=self.dry_run, backends=statuses,
                      graphs=[_graph_report(g) for g in graphs])


def _safe_version(backend: Backend) -> Optional[str]:
    try:
        return backend.version()
    except Exception:  # noqa: BLE001 - a version probe must not break a report
        return None


def _graph_report(g: _GraphRecord) -> GraphReport:
    parts = []
    for p in g.plan.partitions:
        rec = g.records[p.id]
        compute = [n for n in p.nodes if not is_getitem(n)]
        parts.append(PartitionReport(
            id=p.id, planned_backend=p.backend,
            backend=rec.backend or "(not compiled yet)",
            nodes=len(compute), ops=dict(Counter(op_name(n.target) for n in compute)),
            node_names=[n.name for n in compute], chain=rec.chain,
            fallbacks=[FallbackReport(from_backend=f.from_backend, to_backend=f.to_backend,
                                      stage=f.stage, reason=f.reason) for f in rec.fallbacks],
            compile_s=round(rec.compile_s, 4), calls=rec.calls, run_s=round(rec.run_s, 6),
            copies=rec.copies, restride_copies=rec.restride_copies,
            verify_checks=rec.verify_checks, verify_max_error=rec.verify_max_error,
            measured_ms=g.plan.measured_ms.get(p.id, {})))
    refusals: Counter = Counter()
    for node, sup in g.plan.support.items():
        if is_getitem(node):
            continue
        for backend, reason in sup.refusals.items():
            refusals[(op_name(node.target), backend, reason)] += 1
    return GraphReport(
        graph_id=g.graph_id, kind=g.kind, nodes=sum(x.nodes for x in parts), partitions=parts,
        refusals=[RefusalReport(op=o, backend=b, reason=r, nodes=c)
                  for (o, b, r), c in sorted(refusals.items())],
        constants=g.constants, plan_s=round(g.plan_s, 5), policy=g.plan.policy)
