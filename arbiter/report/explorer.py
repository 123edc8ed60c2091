"""The plan for Google's Model Explorer (``pip install ai-edge-model-explorer``).

Writes what Model Explorer loads (JSON, its graph and node-data schemas:
``model_explorer.graph_builder``, ``model_explorer.node_data_builder``) from the
``Report`` alone (no torch, no model_explorer needed to write it): ``<stem>.json``, one
graph per ATen graph, each compute node labelled with its op in the namespace of its
module (so Model Explorer folds layers), and two node-data overlays,
``<stem>.backends.json`` (each node colored by the backend that runs it) and
``<stem>.fallbacks.json`` (the nodes of partitions that fell back). docs/report.md
("Model Explorer") says how to open them.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .html import backend_colors
from .model import GraphReport, Report

FALLBACK_MARK = "#d62728"


def _graph_id(r: Report, g: GraphReport, several: bool) -> str:
    base = f"graph {g.graph_id} ({g.kind}{', ' + g.model if g.model else ''})"
    return f"{r.label or r.config or 'report'}: {base}" if several else base


def _graph(r: Report, g: GraphReport, gid: str, colors: dict[str, str]) -> dict[str, Any]:
    parts = {p.id: p for p in g.partitions}
    nodes: list[dict[str, Any]] = []
    inputs: dict[str, None] = {}
    for n in g.graph:
        for i in n.inputs:
            if i.startswith("input:"):
                inputs.setdefault(i)
    for name in inputs:
        nodes.append({"id": name, "label": name.removeprefix("input:"), "namespace": "",
                      "attrs": [{"key": "kind", "value": "graph input"}]})
    for n in g.graph:
        p = parts[n.partition]
        b = p.runs_on
        attrs = [("op", n.op), ("backend", b + ("" if p.compiled else " (plan)")),
                 ("planned backend", p.planned_backend), ("partition", f"#{p.id}"),
                 ("module", n.module or "(top level)"),
                 ("shape", f"{n.dtype}[{'x'.join(map(str, n.shape))}]")]
        attrs += [(f"fallback {k}", f"{f.stage}: {f.from_backend} -> {f.to_backend}: "
                                    f"{f.reason}") for k, f in enumerate(p.fallbacks)]
        nodes.append({
            "id": n.name, "label": n.op.removeprefix("aten.").removesuffix(".default"),
            "namespace": n.module.replace(".", "/"),
            "attrs": [{"key": k, "value": str(v)} for k, v in attrs],
            "incomingEdges": [{"sourceNodeId": i, "sourceNodeOutputId": "0",
                               "targetNodeInputId": str(k)} for k, i in enumerate(n.inputs)],
            "outputsMetadata": [{"id": "0", "attrs": [
                {"key": "shape", "value": "x".join(map(str, n.shape))},
                {"key": "dtype", "value": n.dtype}]}],
            "style": {"backgroundColor": "", "borderColor": FALLBACK_MARK if p.fallbacks
                      else colors.get(b, ""), "hoveredBorderColor": ""},
        })
    return {"id": gid, "nodes": nodes}


def explorer_files(reports: Report | Sequence[Report], label: str = "torch-arbiter"
                   ) -> dict[str, dict]:
    """{"graphs": graph collection, "backends": node data, "fallbacks": node data}."""
    reports = [reports] if isinstance(reports, Report) else list(reports)
    colors = backend_colors(reports)
    several = len(reports) > 1
    graphs, by_backend, fallbacks = [], {}, {}
    for r in reports:
        order = [b.name for b in r.backends]
        for g in r.graphs:
            gid = _graph_id(r, g, several)
            graphs.append(_graph(r, g, gid, colors))
            parts = {p.id: p for p in g.partitions}
            res, fell = {}, {}
            for n in g.graph:
                p = parts[n.partition]
                b = p.runs_on
                res[n.name] = {"value": order.index(b) if b in order else len(order),
                               "bgColor": colors.get(b, "#9d9d9d")}
                fell[n.name] = {"value": 1, "bgColor": FALLBACK_MARK} if p.fallbacks \
                    else {"value": 0}
            by_backend[gid] = {"name": "backend", "results": res}
            fallbacks[gid] = {"name": "fell back", "results": fell}
    return {"graphs": {"label": label, "graphs": graphs, "graphSorting": "name_asc"},
            "backends": by_backend, "fallbacks": fallbacks}


def write_explorer(reports: Report | Sequence[Report], stem: str | Path) -> list[Path]:
    """Write ``<stem>.json``, ``<stem>.backends.json``, ``<stem>.fallbacks.json``."""
    stem = Path(stem)
    stem = stem.with_suffix("") if stem.suffix == ".json" else stem
    files = explorer_files(reports, label=stem.name)
    out = []
    for key, suffix in (("graphs", ".json"), ("backends", ".backends.json"),
                        ("fallbacks", ".fallbacks.json")):
        path = stem.parent / (stem.name + suffix)
        path.write_text(json.dumps(files[key]))
        out.append(path)
    return out
