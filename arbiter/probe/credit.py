"""One traced graph of a sample probed: skipped or run, then credit and blame.

``probe_graph`` takes an ATen graph with its real inputs (an OpInfo sample's, or one of
its training graphs), decides whether the backend would ever get it (every op in the
manifest, none refused by a validator, none in-place or random; the nodes its manifest's
``decompositions:`` names decomposed as in a partition; no tensor of a dtype its entry
does not allow, unless the probe tries that dtype), skips it when every (op, dtype)
in it has passed already, runs it (arbiter/probe/judge.py) and records the outcome on
the ``ProbeResult``: the (op, dtype) pairs of the tensors each node read and wrote,
credited or blamed; each output of a tuple-returning op compared on its own, right or
wrong (``wrong_outputs``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx

from ..plan.capability import tensor_descs
from ..decompose import for_backend
from ..errors import describe
from ..manifest import DTYPES
from ..ops import op_name
from ..run.checks.verify import dtype_name
from .judge import probe_build, probe_unreturned, run_sample
from .result import SampleResult
from .sampling import graph_ops
from .settings import Case, Probe


def _pairs(nodes) -> set[tuple[str, str]]:
    """(op, dtype name) of every tensor each node reads or writes."""
    memo: dict = {}
    return {(op_name(n.target), dtype_name(d.dtype)) for n in nodes
            for d in tensor_descs(n, memo)}


def _untried(p: Probe, credit: set[tuple[str, str]]) -> list[str]:
    """"op in dtype" for each (op, dtype) whose dtype the op's entry does not allow and
    the probe does not try (complex64 in a float32 sample of ``view_as_real``): a graph
    holding one says nothing of the backend; the dtypes tried are run even where not
    allowed, since a pass adds them."""
    out = []
    for op, dt in sorted(credit):
        entry = p.manifest.entry(op)
        if entry is not None and dt not in p.result.dtypes \
                and (dt not in DTYPES or DTYPES[dt] not in entry.dtypes):
            out.append(f"{op} in {dt}")
    return out


@dataclass
class _Graph:
    """A graph the backend would get: its nodes, their op names, the (op, dtype) pairs
    to credit or blame, the ops decomposed for the backend."""

    nodes: list
    names: list[str]
    credit: set
    decomposed: list[str]


def _check(p: Probe, case: Case, gm: torch.fx.GraphModule, graph: str,
           force: bool) -> _Graph | SampleResult:
    """The graph as the backend would get it, or the skipped sample saying why not."""
    nodes, why = graph_ops(gm)
    if why is not None:
        return case.skipped("trace", why, graph=graph)
    names = sorted({op_name(n.target) for n in nodes})
    try:  # what the backend gets: the nodes it wants decomposed, decomposed
        dgm = for_backend(gm, p.backend)
    except Exception as exc:  # noqa: BLE001 - the planner would refuse such a node
        return case.skipped("decompose", describe(exc), names, graph)
    dnodes, why = graph_ops(dgm) if dgm is not gm else (nodes, None)
    if why is not None:
        return case.skipped("decompose", why, names, graph)
    decomposed = sorted(set(names) - {op_name(n.target) for n in dnodes})
    missing = p.missing([op_name(n.target) for n in dnodes])
    if missing:
        return case.skipped("manifest", f"not in the manifest: {', '.join(missing[:5])}"
                            + (f" (decomposing {', '.join(decomposed)})" if decomposed else ""),
                            names, graph)
    refused = p.refused(dnodes)
    if refused:
        return case.skipped("validator", refused, names, graph)
    credit = _pairs(nodes) | (_pairs(dnodes) if dgm is not gm else set())
    outside = _untried(p, credit)
    if outside:
        return case.skipped("dtype", f"{', '.join(outside[:3])}: neither allowed by the "
                            "manifest nor tried (arbiter never hands such a node to it)",
                            names, graph)
    if not force and all(dt in p.result.passed.get(op, ()) for op, dt in credit):
        return case.skipped("covered", "every (op, dtype) already passed", names, graph)
    return _Graph(nodes, names, credit, decomposed)


def probe_graph(p: Probe, case: Case, gm: torch.fx.GraphModule, inputs: list,
                graph: str = "", saved_from: Optional[int] = None,
                force: bool = False) -> list[SampleResult]:
    """Probe one traced graph (see the module docstring): its sample, and a failed one
    of the nodes that compute only what a training forward returns for its backward,
    when returning it is what failed (``judge.run_sample``). ``graph``: which training
    graph it is ("forward", "backward"; "" for an inference sample); ``saved_from``: a
    training forward's first output saved for its backward; ``force``: run it even when
    every (op, dtype) passed already (a sample chosen for its arguments)."""
    result = p.result
    g = _check(p, case, gm, graph, force)
    if isinstance(g, SampleResult):
        return [g]
    names, credit = g.names, g.credit
    if result.mode == "build":
        outcome = None
        status, stage, reason, err = probe_build(p.backend, gm, inputs)
    else:
        outcome = run_sample(p.backend, gm, inputs, p.tolerances, saved_from)
        status, stage, reason, err = outcome.as_tuple()
    out = []
    if outcome is not None and outcome.saved_only:  # judged without them: see run_sample
        only = set(outcome.saved_only)
        out.append(case.sample(sorted({op_name(n.target) for n in only}), "failed",
                               outcome.failure.stage, "returning what the backward reads: "
                               + outcome.failure.reason, graph=graph))
        result.record(out[-1], _pairs(only))
        kept = [n for n in g.nodes if n not in only]
        names, credit = sorted({op_name(n.target) for n in kept}), _pairs(kept)
    sample = case.sample(names, status, stage, reason, err, graph)
    result.record(sample, credit)
    for op in g.decomposed:
        if result.decomposed[op].get(case.dname) != "passed":
            result.decomposed[op][case.dname] = status
    if outcome is None or status != "passed":
        return [sample, *out]
    checked, wrong = probe_unreturned(p.backend, gm, inputs, p.tolerances)
    for found in outcome.right:
        _output(p, case, sample, found, None, "")
    for found, why in outcome.wrong.items():
        _output(p, case, sample, found, why, "saved")
    for found in checked:
        _output(p, case, sample, found, wrong.get(found), "unreturned")
    return [sample, *out]


def _output(p: Probe, case: Case, sample: SampleResult, out, why: Optional[str],
            kind: str) -> None:
    """Record output ``k`` of a tuple-returning node, compared on its own."""
    node, k = out
    op = op_name(node.target)
    if why is None:
        p.result.record_output(op, k, case.dname, None)
        return
    where = f"{case.label}, {sample.graph} graph" if sample.graph else case.label
    p.result.record_output(op, k, case.dname, f"{where}: {why}")
    what = why.split(":")[0]
    sample.reason += f"{'; ' if sample.reason else ''}{kind} output {k} of {op} {what}"
