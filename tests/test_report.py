"""The report model: per-op table, coverage, boundaries, advice, timing, fallbacks, schema."""
from __future__ import annotations

import json

import pytest
import torch

import arbiter
from arbiter.cli import examples
from arbiter.report import Report
from arbiter.report.html import render_html
from arbiter.report.choice import named
from arbiter.report.schema import SCHEMA_PATH, schema, schema_text
from arbiter.report.text import render

from conftest import trace

OPS = ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"]
#: encoder block with two ops only eager may run: 7 partitions at min_block_size 1
SPLIT = {"backends": ["onnxruntime", "inductor"], "min_block_size": 1,
         "exclude_ops": ["aten.gelu", "aten.bmm"]}


@pytest.fixture(scope="module")
def split_report() -> Report:
    torch._dynamo.reset()
    model, inputs = examples.encoder_block()
    with torch.no_grad():
        rep = arbiter.explain(model, *inputs, config=SPLIT)
    torch._dynamo.reset()
    return rep


def f(x):
    return torch.relu(x) * 2 + x


def _boom_compile(self, gm, example_inputs):
    raise RuntimeError("boom at compile")


def test_ops_coverage_and_placement(split_report):
    g = split_report.graphs[0]
    assert split_report.graph_breaks is not None and split_report.graph_breaks.breaks == 0
    ops = {o.op: o for o in g.ops}
    assert sum(o.nodes for o in g.ops) == g.nodes
    bmm = ops["aten.bmm.default"]
    assert bmm.nodes == 2 and bmm.planned == {"eager": 2} and not bmm.placed and bmm.able == ["eager"]
    assert bmm.refused["onnxruntime"] == "excluded by the config's exclude_ops"
    addmm = ops["aten.addmm.default"]
    assert addmm.able == ["onnxruntime", "inductor", "eager"]
    assert "float32" in addmm.conditions["onnxruntime"]
    # coverage: % of nodes each backend could run; eager (the fallback) runs all
    excluded = ops["aten.bmm.default"].nodes + ops["aten.gelu.default"].nodes
    assert g.coverage["eager"] == 100.0
    assert g.coverage["onnxruntime"] == round(100 * (g.nodes - excluded) / g.nodes, 1)
    # a dry run's placement is the plan, kept apart from what runs
    assert g.planned == {"eager": excluded, "onnxruntime": g.nodes - excluded} and not g.placement
    assert split_report.summary() == ("1 graph, 7 partitions; planned: onnxruntime 94%, "
                                      "eager 6%; fallbacks: 0; graph breaks: 0")


def test_boundaries_and_bytes(split_report):
    g = split_report.graphs[0]
    assert len(g.partitions) == 7
    produced = {}
    for p in g.partitions:
        for t in p.outputs:
            produced[t.name] = t
        for t in p.inputs:
            if t.source == "partition":  # every crossing value was produced earlier
                assert produced[t.name].bytes == t.bytes
        assert p.bytes_in == sum(t.bytes for t in p.inputs if t.source == "partition")
    bmm = [p for p in g.partitions if p.ops == {"aten.bmm.default": 1}][0]
    # bmm of [8,16,16] x [8,16,16] -> [8,16,16] float32
    assert [t.shape for t in bmm.inputs] == [[8, 16, 16], [8, 16, 16]]
    assert bmm.bytes_in == 2 * 8 * 16 * 16 * 4 and bmm.bytes_out == 8 * 16 * 16 * 4
    assert g.partitions[-1].outputs[-1].source == "graph output"
    # frozen weights are constants baked in; only the user's input crosses from outside
    sources = {t.source for p in g.partitions for t in p.inputs}
    assert {"constant", "graph input", "partition"} == sources
    assert all(t.shape == [2, 16, 64] for p in g.partitions for t in p.inputs
               if t.source == "graph input")
    assert sum(p.constant_bytes for p in g.partitions) > 0
    assert {n.partition for n in g.graph} == {p.id for p in g.partitions}
    assert len(g.graph) == g.nodes


def test_advice_is_computed_by_replanning(split_report):
    g_nodes = split_report.graphs[0]
    kinds = {a.kind for a in split_report.advice}
    assert kinds == {"min_block_size", "op_support"}
    mbs = next(a for a in split_report.advice if a.kind == "min_block_size")
    best = mbs.data["best"]
    assert mbs.data["partitions"][str(best)] < len(g_nodes.partitions)
    # check the claim independently: replan the same model with that min_block_size
    torch._dynamo.reset()
    model, inputs = examples.encoder_block()
    with torch.no_grad():
        again = arbiter.explain(model, *inputs, config={**SPLIT, "min_block_size": best},
                                breaks=False)
    torch._dynamo.reset()
    assert len(again.graphs[0].partitions) == mbs.data["partitions"][str(best)]
    ops = [a.data["op"] for a in split_report.advice if a.kind == "op_support"]
    assert ops[0] == "aten.bmm.default"  # two nodes, two boundaries each: the most gain
    top = split_report.advice[1]
    assert top.data["partitions_after"] < top.data["partitions_now"] == 7


def test_fallback_is_reported_never_claimed(make_backend, fresh_dynamo):
    make_backend("failing", OPS, compile=_boom_compile)
    be = arbiter.Arbiter({"backends": ["failing", "onnxruntime"], "min_block_size": 1})
    x = torch.randn(4, 4)
    torch.testing.assert_close(torch.compile(f, backend=be)(x), f(x))
    rep = be.report()
    (p,) = rep.graphs[0].partitions
    assert (p.planned_backend, p.backend) == ("failing", "onnxruntime")
    assert p.fallbacks[0].stage == "compile" and "boom at compile" in p.fallbacks[0].reason
    assert rep.graphs[0].placement == {"onnxruntime": p.nodes}  # what ran, not the plan
    assert all(set(o.placed) == {"onnxruntime"} for o in rep.graphs[0].ops)
    assert "failing" not in rep.summary() and "fallbacks: 1" in rep.summary()
    text = render(rep)
    assert "fallback at compile: failing -> onnxruntime (partition 0): " in text
    assert "boom at compile" in text and "(planned failing)" in text
    # the reason's location prints as data, not markup (long lines wrap at 100 columns)
    assert "[at test_report.py:" in " ".join(text.split())
    page = render_html(rep)
    assert 'data-backend="onnxruntime"' in page and 'data-backend="failing"' not in page
    assert "fell-back" in page and "boom at compile" in page
    back = json.loads(rep.model_dump_json())
    assert back["graphs"][0]["partitions"][0]["backend"] == "onnxruntime"


def test_timing_counts_piece_calls(fresh_dynamo):
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "min_block_size": 1})
    compiled = torch.compile(f, backend=be)
    x = torch.randn(4, 4)
    compiled(x)  # compile; not timed
    be.set_timing(True)
    for _ in range(5):
        compiled(x)
    be.set_timing(False)
    compiled(x)  # not counted
    (p,) = be.report().graphs[0].partitions
    assert p.calls == 5 and p.run_s > 0 and not p.inline


def test_versions_config_and_round_trip(split_report):
    r = split_report
    assert {"python", "torch", "arbiter", "onnxruntime", "inductor", "eager"} <= set(r.versions)
    assert r.versions["torch"] == torch.__version__
    assert r.config_dump["min_block_size"] == 1
    assert r.config_dump["exclude_ops"] == ["aten.gelu", "aten.bmm"]
    assert Report.model_validate_json(r.model_dump_json()) == r


def test_published_schema_is_in_sync_and_validates(split_report):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (test extra) missing")
    assert SCHEMA_PATH.read_text() == schema_text(), \
        "docs/report.schema.json is stale: run python -m arbiter.report.schema --write"
    jsonschema.validate(json.loads(split_report.model_dump_json()), schema())
    jsonschema.validate([json.loads(split_report.model_dump_json())] * 2, schema())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"graphs": "not a list"}, schema())


def test_text_fits_100_columns(split_report):
    text = render([split_report, split_report])
    assert text.splitlines()[0].startswith(" side by side") or "side by side" in text
    assert max(len(line) for line in text.splitlines()) <= 100
    one = render(split_report).splitlines()
    assert one[0].startswith("[dry run] 1 graph, 7 partitions")
    assert "[at " not in one[0]


def test_partition_api_report_of_plain_graph():
    # the per-op records come from the plan alone: any ATen graph works
    from arbiter.report.from_record import op_reports
    from arbiter.registry import get_backend_class

    gm = trace(f, torch.randn(4, 4))
    plan = arbiter.partition(gm, {"backends": ["onnxruntime"], "min_block_size": 1})
    backends = {n: get_backend_class(n)() for n in ("onnxruntime", "eager")}
    ops = op_reports(plan, backends)
    planned = {"onnxruntime": 1}  # nothing ran: the plan, kept apart from what ran
    assert all(not o.placed for o in ops)
    assert [(o.op, o.nodes, o.planned) for o in ops] == [
        ("aten.add.Tensor", 1, planned), ("aten.mul.Tensor", 1, planned),
        ("aten.relu.default", 1, planned)]


def test_policy_decision_and_resources_are_rendered(fresh_dynamo):
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "policy": "cost", "min_block_size": 1})
    x = torch.randn(4, 4)
    torch.compile(f, backend=be)(x)
    rep = be.report()
    g = rep.graphs[0]
    assert g.policy == "cost" and g.chosen in g.estimates_ms
    text = render(rep)
    line = f"policy cost: {named(g.chosen)}"  # the choice in words (report/choice.py)
    assert line in text and "was estimated fastest: ~" in text
    assert rep.resources and "resources in force:" in text
    page = render_html(rep)
    assert line in page and "resources: " in page


def test_coverage_names_every_backend_when_one_runs_the_graph_alone(fresh_dynamo,
                                                                   monkeypatch):
    # Before: a graph placed on one backend alone (a policy's "only <backend>") had its
    # coverage and op table read from that candidate's plan, which knows that backend
    # alone: "onnxruntime 0.0%" and "able: openvino, eager" for ops ONNX Runtime runs.
    from arbiter.plan import policy

    monkeypatch.setattr(policy, "choose_by_cost", lambda cands: next(
        c for c in cands if c.label == "only openvino"))
    model, (x,) = examples.mlp()
    be = arbiter.Arbiter({"backends": ["onnxruntime", "openvino"], "policy": "cost",
                          "against_eager": "off", "min_block_size": 1})
    with torch.no_grad():
        torch.compile(model.eval(), backend=be)(x)
    g = be.report().graphs[0]
    assert g.chosen == "only openvino" and g.placement == {"openvino": g.nodes}
    assert g.coverage == {"onnxruntime": 100.0, "openvino": 100.0, "eager": 100.0}
    assert all(o.able == ["onnxruntime", "openvino", "eager"] for o in g.ops), g.ops
