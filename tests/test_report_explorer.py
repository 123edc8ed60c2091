"""The plan for Google's Model Explorer (issue 15, item 2): graphs and node-data overlays
that Model Explorer's own Python API loads (its dataclasses, read with dacite as
Model Explorer does), nodes colored by backend, fallbacks marked."""
from __future__ import annotations

import json

import pytest
import torch

import arbiter
from arbiter.cli import examples
from arbiter.report.explorer import FALLBACK_MARK, write_explorer

me = pytest.importorskip("model_explorer", reason="ai-edge-model-explorer not installed "
                         "(pip install 'torch-arbiter[test]')")
dacite = pytest.importorskip("dacite", reason="dacite (a model_explorer dependency) missing")
from model_explorer.graph_builder import Graph, GraphCollection  # noqa: E402
from model_explorer.node_data_builder import GraphNodeData  # noqa: E402

OPS = ["aten.relu.default", "aten.t.default", "aten.addmm.default", "aten.view.default",
       "aten.native_layer_norm.default", "aten.gelu.default"]


def _boom(self, gm, example_inputs):
    raise RuntimeError("boom at compile")


def test_export_loads_with_model_explorer_and_colors_by_backend(make_backend, fresh_dynamo,
                                                                tmp_path):
    make_backend("failing", OPS, compile=_boom)
    m, inputs = examples.encoder_block()
    m.eval()
    be = arbiter.Arbiter({"backends": ["failing", "onnxruntime"], "min_block_size": 1})
    with torch.no_grad():
        torch.compile(m, backend=be)(*inputs)
    rep = be.report()
    paths = write_explorer(rep, tmp_path / "plan")
    assert [p.name for p in paths] == ["plan.json", "plan.backends.json", "plan.fallbacks.json"]

    strict = dacite.Config(strict=True)
    raw = json.loads(paths[0].read_text())
    collection = dacite.from_dict(GraphCollection, raw, config=strict)
    (graph,) = collection.graphs
    assert isinstance(graph, Graph)
    g = rep.graphs[0]
    ids = {n.id for n in graph.nodes}
    assert {n.name for n in g.graph} <= ids
    # edges are the graph's data flow
    node = {n.id: n for n in graph.nodes}
    for n in g.graph:
        assert [e.sourceNodeId for e in node[n.name].incomingEdges] == n.inputs
        assert all(e.sourceNodeId in ids for e in node[n.name].incomingEdges)
    # namespaces are module paths: Model Explorer folds them into layers
    assert {node[n.name].namespace for n in g.graph if n.module} >= {"ln1", "qkv", "proj"}

    backends = json.loads(paths[1].read_text())
    fell = json.loads(paths[2].read_text())
    data = dacite.from_dict(GraphNodeData, backends[graph.id], config=strict)
    marks = dacite.from_dict(GraphNodeData, fell[graph.id], config=strict)
    parts = {p.id: p for p in g.partitions}
    colors = {"onnxruntime": "#4e79a7", "eager": "#9d9d9d"}
    for n in g.graph:
        p = parts[n.partition]
        runs = p.backend
        assert runs != "failing"  # what ran, never the backend that failed
        assert data.results[n.name].bgColor == colors[runs]
        assert marks.results[n.name].value == (1 if p.fallbacks else 0)
        if p.fallbacks:
            assert marks.results[n.name].bgColor == FALLBACK_MARK
    assert any(r.value == 1 for r in marks.results.values())  # the failing backend fell back

    # Model Explorer's own config takes the files (what `model-explorer` and
    # visualize_from_config read)
    cfg = me.config().add_model_from_path(str(paths[0]))
    for p in paths[1:]:
        cfg.add_node_data_from_path(str(p))
    assert "plan.backends.json" in cfg.to_url_param_value()


def test_cli_writes_the_explorer_files(tmp_path):
    from arbiter.cli import main

    assert main(["report", "mlp", "--dry-run", "--quiet", "--explorer",
                 str(tmp_path / "mlp")]) == 0
    raw = json.loads((tmp_path / "mlp.json").read_text())
    assert dacite.from_dict(GraphCollection, raw).graphs[0].nodes
