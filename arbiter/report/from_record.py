"""From a graph's record to its report: partitions, per-op, coverage, boundaries, nodes.

Everything here reads the record (the plan, with its nodes' FakeTensor metadata and each
node's ``NodeSupport``; the pieces' records; the policy's outcome) and the backends'
manifests; nothing compiles or runs. ``graph_report`` is the entry point.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any, Optional

import torch
import torch.fx

from ..ops import is_getitem, is_quantization, op_name, tensors_in
from ..plan.partition import Partition, Plan
from ..plan.policy import ONLY
from ..plan.rules import names
from ..backend import Backend
from ..run.record import GraphRecord
from ..run.step import DYNAMO
from ..shapes import REASON as SHAPES_REASON, about_shapes
from .accuracy import accuracy_report
from .choice import step_report
from .model import (EAGER_NAME, BroadcastReport, DistributedReport, FallbackReport,
                    FirstUseReport,
                    GraphReport, KindBackendReport, KindReport, NodeReport, OpReport,
                    PartitionReport, PatternReport, RefusalReport, RuleReport, SymbolReport,
                    TensorReport, WeightEventReport)

#: Above this share of a graph's compute in eager because of shapes, the report warns.
SHAPE_EAGER_WARN = 0.1


def _shape(t: torch.Tensor) -> list[Any]:
    return [s if isinstance(s, int) else str(s) for s in t.shape]


def tensor_reports(node: torch.fx.Node, source: str) -> list[TensorReport]:
    """One record per tensor in ``node.meta["val"]`` (a tuple-producing node gives several)."""
    out = []
    for t in tensors_in(node.meta.get("val")):
        shape = _shape(t)
        size: Optional[int] = None
        if all(isinstance(s, int) for s in shape):
            size = t.element_size()
            for s in shape:
                size *= s
        out.append(TensorReport(name=node.name, shape=shape,
                                dtype=str(t.dtype).removeprefix("torch."), bytes=size,
                                source=source))
    return out


def boundaries(part: Partition, constants: frozenset = frozenset()
               ) -> tuple[list[TensorReport], list[TensorReport]]:
    """What flows into ``part`` (in first-use order) and what it produces for others.

    ``constants``: placeholders frozen as constants (baked into the partition: listed
    with source `constant`, they cross no boundary at run time).

    Inputs from a tuple producer in another partition arrive through its getitem nodes,
    which live with the producer, so each tensor is counted once.
    """
    members = set(part.nodes)
    seen: set[torch.fx.Node] = set()
    inputs: list[TensorReport] = []
    outputs: list[TensorReport] = []
    for node in part.nodes:
        for inp in node.all_input_nodes:
            if inp in members or inp in seen or inp.op == "get_attr":
                continue
            seen.add(inp)
            src = ("constant" if inp in constants else "graph input") \
                if inp.op == "placeholder" else "partition"
            inputs += tensor_reports(inp, src)
        external = [u for u in node.users if u not in members]
        if external and not (_is_tuple(node) and all(is_getitem(u) for u in node.users)):
            src = "graph output" if all(u.op == "output" for u in external) else "partition"
            outputs += tensor_reports(node, src)
    return inputs, outputs


def _is_tuple(node: torch.fx.Node) -> bool:
    return isinstance(node.meta.get("val"), (list, tuple))


def _conditions(backend: Backend, op: str) -> str:
    if backend.inline_aten:
        return "any (runs ATen in place)"
    try:
        entry = backend.manifest().entry(op)
    except Exception:  # noqa: BLE001 - a broken manifest is reported as such, not raised
        return "manifest could not be read"
    decomposed = backend.manifest().decompositions
    if op in decomposed or op.rsplit(".", 1)[0] in decomposed:
        return ("decomposed for it (arbiter/decompose/): taken where it takes every op "
                "of the decomposition")
    if entry is None:
        return "not in manifest"
    dtypes = ",".join(sorted(str(d).removeprefix("torch.") for d in entry.dtypes))
    text = f"dtypes {dtypes}; devices {','.join(sorted(entry.devices))}; " \
           f"{'dynamic' if entry.dynamic else 'static'} shapes"
    if entry.max_rank is not None:
        text += f"; rank <= {entry.max_rank}"
    for k, dtypes, _ in entry.wrong_outputs:
        names = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
        text += f"; output {k} wrong in {names} (refused where used)"
    if op in backend.validators or op.rsplit(".", 1)[0] in backend.validators:
        text += "; plus a validator"
    return text + f" ({_verified(entry)})"


def _verified(entry) -> str:
    """`declared`, `probed`/`built`, or which dtypes the probe passed (ran, or only built)
    when the entry allows more."""
    probed = entry.built_dtypes if entry.verified == "built" else entry.probed_dtypes
    if not probed or not entry.dtypes - probed:
        return entry.verified
    names = ",".join(sorted(str(d).removeprefix("torch.") for d in probed))
    return f"{entry.verified} for {names}; declared for the rest"


def op_reports(plan: Plan, backends: Mapping[str, Backend],
               runs_on: Optional[Mapping[int, str]] = None,
               verdicts: Optional[Mapping] = None) -> list[OpReport]:
    """Per ATen op: nodes, able backends (config order), placement and refusals.

    ``runs_on``: partition id -> the backend that runs it now (after fallbacks), for the
    compiled partitions; the others count as ``planned`` for their planned backend: a
    report never says a backend ran what it was only planned to run. ``verdicts``: node
    -> NodeSupport from every backend (``GraphRecord.verdicts``), else ``plan.support``.
    """
    runs_on = runs_on or {}
    part_of = {n: (runs_on[p.id], True) if p.id in runs_on else (p.backend, False)
               for p in plan.partitions for n in p.nodes}
    order = list(backends)
    count: Counter = Counter()
    able: dict[str, set] = {}
    placed: dict[str, Counter] = {}
    planned: dict[str, Counter] = {}
    refused: dict[str, dict[str, str]] = {}
    for node, sup in (plan.support if verdicts is None else verdicts).items():
        if is_getitem(node):
            continue
        op = op_name(node.target)
        count[op] += 1
        able.setdefault(op, set()).update(sup.candidates)
        backend, ran = part_of.get(node, ("?", False))
        (placed if ran else planned).setdefault(op, Counter())[backend] += 1
        for b, why in sup.refusals.items():
            refused.setdefault(op, {}).setdefault(b, why)
    out = []
    for op, n in sorted(count.items(), key=lambda kv: (-kv[1], kv[0])):
        names = [b for b in order if b in able[op]]
        out.append(OpReport(
            op=op, nodes=n, able=names,
            conditions={b: _conditions(backends[b], op) for b in names if b in backends},
            placed=dict(sorted(placed.get(op, {}).items())),
            planned=dict(sorted(planned.get(op, {}).items())), refused=refused.get(op, {})))
    return out


def coverage(verdicts: Mapping, backends: Mapping[str, Backend]) -> dict[str, float]:
    """Backend -> % of compute nodes it could run (before min_block_size), from each
    node's verdicts (``GraphRecord.verdicts``)."""
    compute = [s for n, s in verdicts.items() if not is_getitem(n)]
    total = len(compute) or 1
    return {b: round(100.0 * sum(1 for s in compute if b in s.candidates) / total, 1)
            for b in backends}


_PATH_PARTS = re.compile(r"\._modules\['([^']*)'\]|\[(\d+)\]|\['([^']*)'\]")


def module_path(node: torch.fx.Node) -> str:
    """The innermost module a node comes from, as a dotted path (``encoder.layer.5.attention``),
    from Dynamo's ``nn_module_stack`` (kept on ATen nodes by AOTAutograd); "" if none."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    last = list(stack.values())[-1]
    path = last[0] if isinstance(last, tuple) else str(last)
    path = _PATH_PARTS.sub(lambda m: "." + (m.group(1) or m.group(2) or m.group(3)), str(path))
    # the compiled callable's own name: `self`, or `fn` (Dynamo's wrap_inline of a module)
    path = re.sub(r"^(L\.self\b|L\.fn\b|L\.|self\b)", "", path)
    return path.strip(".")


def node_reports(plan: Plan) -> list[NodeReport]:
    """Every compute node with its inputs; getitems are folded into their producer."""
    part_id = {n: p.id for p in plan.partitions for n in p.nodes}

    def source(n: torch.fx.Node) -> Optional[str]:
        while is_getitem(n):
            n = n.args[0]
        if n.op == "placeholder":
            return f"input:{n.name}"
        if n.op == "get_attr":
            return None
        return n.name

    out = []
    first = next((n for p in plan.partitions for n in p.nodes), None)
    # within a partition, the graph's (the model's) order: the partitioner's is any
    # topological one (ready nodes first), which a folded input moves (run/fold.py)
    order = {} if first is None else {n: k for k, n in enumerate(first.graph.nodes)}
    for p in plan.partitions:
        for n in sorted(p.nodes, key=lambda m: order.get(m, 0)):
            if is_getitem(n):
                continue
            ins = [s for s in (source(i) for i in n.all_input_nodes) if s is not None]
            ts = tensors_in(n.meta.get("val"))
            out.append(NodeReport(
                name=n.name, op=op_name(n.target), partition=part_id[n],
                inputs=list(dict.fromkeys(ins)), shape=_shape(ts[0]) if ts else [],
                dtype=str(ts[0].dtype).removeprefix("torch.") if ts else "",
                module=module_path(n)))
    return out


def rule_reports(plan: Plan, parts: list[PartitionReport], pin: Mapping[str, str],
                 exclude: list[str], policy: str = "priority") -> list[RuleReport]:
    """What each pin and exclude did in this graph: nodes it names, nodes it holds for,
    and why not for the others (the backend refused, a runtime fallback, the policy)."""
    part_of = {n: x for p, x in zip(plan.partitions, parts) for n in p.nodes}
    fallback = plan.fallback
    out = []
    rules = [("pin", op, b) for op, b in pin.items()] + [("exclude", op, None) for op in exclude]
    for kind, rule_op, backend in rules:
        nodes = applied = 0
        why: Counter = Counter()
        for node, sup in plan.support.items():
            if is_getitem(node) or not names(rule_op, op_name(node.target)):
                continue
            nodes += 1
            part = part_of.get(node)
            runs = part.runs_on if part else "?"
            target = backend if kind == "pin" else fallback
            if runs == target:
                applied += 1
            elif kind == "pin" and backend in sup.refusals:
                why[f"{backend} refused: {sup.refusals[backend]}"] += 1
            elif part is not None and part.planned_backend == target and part.fallbacks:
                f = part.fallbacks[-1]
                why[f"fell back at {f.stage}: {f.from_backend} -> {f.to_backend}: "
                    f"{f.reason}"] += 1
            else:
                why[f"policy {policy} placed it on {runs}"] += 1
        out.append(RuleReport(kind=kind, op=rule_op, backend=backend, nodes=nodes,
                              applied=applied, why_not=dict(why)))
    return out


def pattern_reports(plan: Plan, runs_on: Mapping[int, str]) -> list[PatternReport]:
    """Each pattern match of the plan, where it is and whether it runs whole."""
    part_of = {n: p for p in plan.partitions for n in p.nodes}
    out = []
    for g in plan.patterns:
        part = part_of.get(g.nodes[-1])
        backend = None if part is None else runs_on.get(part.id, part.backend)
        out.append(PatternReport(
            pattern=g.pattern, node_names=[n.name for n in g.nodes],
            claimed_by=list(g.claimed_by), refused=dict(g.support.refusals),
            partition=None if part is None else part.id, backend=backend,
            compiled=part is not None and part.id in runs_on,
            whole=backend in g.claimed_by))
    return out


def graph_report(g: GraphRecord, backends: Mapping[str, Backend],
                 pin: Optional[Mapping[str, str]] = None,
                 exclude: Optional[list[str]] = None) -> GraphReport:
    """The report of one compiled graph, from its live record: fallbacks show at once."""
    parts = []
    for p in g.plan.partitions:
        rec = g.records[p.id]
        compute = [n for n in p.nodes if not is_getitem(n)]
        inputs, outputs = boundaries(p, g.constant_nodes)
        parts.append(PartitionReport(
            id=p.id, planned_backend=p.backend, compiled=bool(rec.backend),
            backend=rec.backend or None,
            nodes=len(compute), ops=dict(Counter(op_name(n.target) for n in compute)),
            node_names=[n.name for n in compute], chain=rec.chain,
            fallbacks=[FallbackReport(from_backend=f.from_backend, to_backend=f.to_backend,
                                      stage=f.stage, reason=f.reason) for f in rec.fallbacks],
            compile_s=round(rec.compile_s, 4), calls=rec.calls, run_s=round(rec.run_s, 6),
            copies=rec.copies, restride_copies=rec.restride_copies,
            verify_checks=rec.verify_checks, verify_max_error=rec.verify_max_error,
            nonfinite_guard=list(rec.nonfinite_ops), nonfinite_eager_calls=rec.nonfinite_calls,
            first_use=[FirstUseReport(backend=c.backend, unverified=list(c.unverified),
                                      result=c.result, detail=c.detail,
                                      findings=list(c.findings)) for c in rec.first_use],
            measured_ms=g.outcome.measured_ms.get(p.id, {}),
            inputs=inputs, outputs=outputs,
            bytes_in=sum(t.bytes or 0 for t in inputs if t.source == "partition"),
            graph_input_bytes=sum(t.bytes or 0 for t in inputs if t.source == "graph input"),
            constant_bytes=sum(t.bytes or 0 for t in inputs if t.source == "constant"),
            bytes_out=sum(t.bytes or 0 for t in outputs),
            inline=backends[p.backend].inline_aten if p.backend in backends else False,
            shapes=_shapes(rec, backends), specializations=rec.specializations,
            precision=rec.precision or "native",
            quantized=[] if _runs_in_eager(g, p, backends) else quantized_dtypes(compute)))
    refusals: Counter = Counter()
    for node, sup in g.verdicts.items():
        if is_getitem(node):
            continue
        for backend, reason in sup.refusals.items():
            refusals[(op_name(node.target), backend, reason)] += 1
    placement: Counter = Counter()
    planned: Counter = Counter()
    for x in parts:
        if x.compiled:
            placement[x.backend] += x.nodes
        else:
            planned[x.planned_backend] += x.nodes
    o = g.outcome
    share = shape_eager_share(g, backends)
    warnings = []
    if share > SHAPE_EAGER_WARN:
        warnings.append(f"{share:.0%} of this graph's compute runs in eager because of "
                        "symbolic shapes (see the refusals and fallbacks saying "
                        f"'{SHAPES_REASON}')")
    quantized = quantization_warning(g, backends)
    if quantized:
        warnings.append(quantized)
    if g.step is not None and g.step.route == DYNAMO and not all(
            _runs_in_eager(g, p, backends) for p in g.plan.partitions):
        warnings.append("the step runs Dynamo's graph in eager, measured faster than this "
                        "plan (`step`): these partitions no longer run")
    return GraphReport(
        graph_id=g.graph_id, kind=g.kind, model=str(g.owner),
        nodes=sum(x.nodes for x in parts), partitions=parts,
        refusals=[RefusalReport(op=op, backend=b, reason=r, nodes=c)
                  for (op, b, r), c in sorted(refusals.items())],
        constants=g.constants, plan_s=round(g.plan_s, 5), policy=o.policy,
        weight_events=[WeightEventReport(reason=e.reason, action=e.action)
                       for e in g.weight_events],
        weights_as_inputs=g.weights_as_inputs,
        chosen=o.chosen, against_eager=o.against_eager,
        candidate_fallbacks={k: list(v) for k, v in o.fallbacks.items()},
        candidates_ms=dict(o.candidates_ms), estimates_ms=dict(o.estimates_ms),
        candidates_spread_ms=dict(o.spread_ms), measure_rounds=o.rounds,
        measure_confident=o.confident, measure_broadcast=o.broadcast,
        measure_rank=o.rank, measure_world_size=o.world_size,
        ops=op_reports(g.plan, backends, {x.id: x.backend for x in parts if x.compiled},
                       g.verdicts),
        coverage=coverage(g.verdicts, backends),
        placement=dict(sorted(placement.items())), planned=dict(sorted(planned.items())),
        graph=node_reports(g.plan),
        rules=rule_reports(g.plan, parts, pin or {}, exclude or [], o.policy),
        patterns=pattern_reports(g.plan, {x.id: x.backend for x in parts if x.compiled}),
        symbols=[SymbolReport(name=r.name, min=r.min, max=r.max, sources=list(r.sources),
                              data_dependent=r.data_dependent) for r in g.symbols.values()],
        frame=g.frame[0] if g.frame else None, recompile=g.frame[1] if g.frame else 0,
        shape_eager_share=round(share, 4), warnings=warnings, step=step_report(g.step),
        accuracy=accuracy_report(o, parts))


#: Graph kinds in the order a training step meets them; others follow in order of appearance.
KIND_ORDER = ("forward", "backward", "inference")


def kind_reports(graphs: list[GraphReport], eager: Collection[str]) -> list[KindReport]:
    """Per graph kind, what ran where: the graphs' partitions summed by the backend that
    runs each (compiled) or is planned to (not compiled yet). ``eager``: the backends that
    run ATen in place (``Backend.inline_aten``)."""
    by_kind: dict[str, list[GraphReport]] = {}
    for g in graphs:
        by_kind.setdefault(g.kind, []).append(g)
    order = sorted(by_kind, key=lambda k: (KIND_ORDER.index(k) if k in KIND_ORDER
                                           else len(KIND_ORDER)))
    out = []
    for kind in order:
        parts = [p for g in by_kind[kind] for p in g.partitions]
        groups: dict[tuple[str, bool], list[PartitionReport]] = {}
        for g in by_kind[kind]:
            for p in g.partitions:  # Dynamo's graph in eager: its nodes count as eager's
                key = (g.ran_on(p), p.compiled or g.on_dynamo_graph)
                groups.setdefault(key, []).append(p)
        backends = []
        for (name, compiled), ps in groups.items():
            ops: Counter = Counter()
            for p in ps:
                ops.update(p.ops)
            backends.append(KindBackendReport(
                backend=name, compiled=compiled, eager=name in eager or name == EAGER_NAME,
                nodes=sum(p.nodes for p in ps), partitions=len(ps),
                ops=dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
                fell_back_nodes=sum(p.nodes for p in ps if p.backend != p.planned_backend)
                if compiled else 0))
        backends.sort(key=lambda b: (-b.nodes, not b.compiled, b.backend))
        eager_ops: Counter = Counter()
        for b in backends:
            if b.eager:
                eager_ops.update(b.ops)
        fell = [p for p in parts if p.compiled and p.backend != p.planned_backend]
        timed = [p for p in parts if p.calls]
        out.append(KindReport(
            kind=kind, graphs=[g.graph_id for g in by_kind[kind]],
            nodes=sum(p.nodes for p in parts), partitions=len(parts),
            compiled_partitions=sum(p.compiled for p in parts), backends=backends,
            eager_nodes=sum(b.nodes for b in backends if b.eager),
            eager_ops=dict(sorted(eager_ops.items(), key=lambda kv: (-kv[1], kv[0]))),
            fell_back_partitions=len(fell), fell_back_nodes=sum(p.nodes for p in fell),
            fallbacks=sum(len(p.fallbacks) for p in parts),
            compile_s=round(sum(p.compile_s for p in parts), 4),
            calls=max((p.calls for p in timed), default=0),
            run_s=round(sum(p.run_s for p in timed), 6)))
    return out


def distributed_report(graphs: list[GraphReport]) -> Optional[DistributedReport]:
    """The graphs whose decision was broadcast under torch.distributed (policy measure,
    arbiter/measure/decision.py), or None when there is none."""
    sent = [g for g in graphs if g.measure_broadcast]
    if not sent:
        return None
    rank = next((g.measure_rank for g in sent if g.measure_rank is not None), None)
    world = next((g.measure_world_size for g in sent if g.measure_world_size is not None),
                 None)
    if rank is None and all(g.measure_broadcast.startswith("rank 0") for g in sent):
        rank = 0  # a record without the rank: only rank 0 broadcasts
    return DistributedReport(
        rank=rank, world_size=world,
        sent=sum(g.measure_broadcast.startswith("rank 0") for g in sent),
        received=sum(g.measure_broadcast == "from rank 0" for g in sent),
        broadcast=[BroadcastReport(graph_id=g.graph_id, kind=g.kind, model=g.model,
                                   chosen=g.chosen, role=g.measure_broadcast) for g in sent],
        not_broadcast=[g.graph_id for g in graphs if not g.measure_broadcast])


def _shapes(rec, backends: Mapping[str, Backend]) -> str:
    backend = backends.get(rec.backend)
    if backend is not None and backend.inline_aten:
        return "eager"
    return rec.shapes


def shape_eager_share(g: GraphRecord, backends: Mapping[str, Backend]) -> float:
    """Share of the graph's tensor compute nodes that run in eager because of symbolic
    shapes: planned there because a backend refused them for their shapes, or in a
    partition that fell back to eager for a reason about shapes."""
    total = shaped = 0
    for p in g.plan.partitions:
        rec = g.records.get(p.id)
        eager = _runs_in_eager(g, p, backends)
        fell = bool(rec and rec.fallbacks and about_shapes(rec.fallbacks[-1].reason))
        for n in p.nodes:
            if is_getitem(n) or not tensors_in(n.meta.get("val")):
                continue
            total += 1
            if eager and (fell or any(about_shapes(r)
                                      for r in g.verdict(n).refusals.values())):
                shaped += 1
    return shaped / total if total else 0.0


def _runs_in_eager(g: GraphRecord, p: Partition, backends: Mapping[str, Backend]) -> bool:
    """Whether partition ``p`` of ``g`` runs in eager: the backend running it (the planned
    one before it compiled) runs ATen in place."""
    running = g.running(p)
    return running in backends and backends[running].inline_aten


def quantized_dtypes(nodes: list[torch.fx.Node]) -> list[str]:
    """The integer dtypes (``dtype`` argument) of the quantize/dequantize nodes among
    ``nodes``, sorted."""
    found: dict[str, None] = {}
    for n in nodes:
        if is_quantization(n):
            names = [a.name for a in n.target._schema.arguments]
            k = names.index("dtype") if "dtype" in names else -1
            dt = n.args[k] if 0 <= k < len(n.args) else n.kwargs.get("dtype")
            if isinstance(dt, torch.dtype):
                found[str(dt).removeprefix("torch.")] = None
    return sorted(found)


def quantization_in_eager(g: GraphRecord, backends: Mapping[str, Backend]
                          ) -> tuple[Counter, Optional[str]]:
    """(op -> nodes of the graph's quantize/dequantize ops that run in eager, a reason a
    backend gave for one of them): a user's quantized model whose int8 runs nowhere."""
    found: Counter = Counter()
    why = None
    for p in g.plan.partitions:
        if not _runs_in_eager(g, p, backends):
            continue
        for n in p.nodes:
            if is_quantization(n):
                found[op_name(n.target)] += 1
                refusals = g.verdict(n).refusals
                if why is None and refusals:
                    why = "; ".join(f"{b}: {r}" for b, r in list(refusals.items())[:2])
    return found, why


def quantization_warning(g: GraphRecord, backends: Mapping[str, Backend]) -> Optional[str]:
    """The warning the report and the log give for ``quantization_in_eager``, or None."""
    found, why = quantization_in_eager(g, backends)
    if not found:
        return None
    ops = ", ".join(f"{op} x{n}" for op, n in found.most_common(3))
    timed = _eager_timed_faster(g, backends)
    cause = (f"eager was measured faster on the first call ({timed})" if timed else
             f"no configured backend takes them{f' ({why})' if why else ''}")
    return (f"{sum(found.values())} quantize/dequantize nodes of this quantized model run in "
            f"eager ({ops}{', ...' if len(found) > 3 else ''}): {cause}, so the model's "
            "int8 compute is not what runs")


def _eager_timed_faster(g: GraphRecord, backends: Mapping[str, Backend]) -> str:
    """"E ms against P ms for <the fastest other candidate>" when ``g``'s policy timed
    its candidates and the one that runs ATen in place (eager whole) won; "" otherwise."""
    out = g.outcome
    eager = out.chosen.removeprefix(ONLY)
    if not (out.chosen.startswith(ONLY) and eager in backends and backends[eager].inline_aten):
        return ""
    times = {k: v for k, v in out.candidates_ms.items() if v is not None}
    others = {k: v for k, v in times.items() if k != out.chosen}
    if out.chosen not in times or not others:
        return ""
    best = min(others, key=others.get)
    return f"{times[out.chosen]:.2f} ms against {others[best]:.2f} ms for {best}"
