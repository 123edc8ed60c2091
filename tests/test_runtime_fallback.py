"""Fallback down the chain when a backend fails to compile or to run; dry runs."""
from __future__ import annotations

import torch

import arbiter
from arbiter.plan.partition import Plan

from conftest import trace

OPS = ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"]


def f(x):
    return torch.relu(x) * 2 + x


def _boom_compile(self, gm, example_inputs):
    raise RuntimeError("boom at compile")


def _run_failer(counter: list):
    def compile(self, gm, example_inputs):
        def fn(*args):
            counter.append(1)
            raise RuntimeError("boom at run")
        return fn
    return compile


def _only_partition(be):
    parts = [p for g in be.report().graphs for p in g.partitions]
    assert len(parts) == 1, str(be.report())
    return parts[0]


def test_compile_failure_falls_back_to_next_backend(make_backend, fresh_dynamo):
    make_backend("failing", OPS, compile=_boom_compile)
    good = make_backend("good", OPS)
    be = arbiter.Arbiter({"backends": ["failing", "good"], "min_block_size": 1})
    compiled = torch.compile(f, backend=be)
    x = torch.randn(4, 4)
    torch.testing.assert_close(compiled(x), f(x))
    p = _only_partition(be)
    assert p.planned_backend == "failing"
    assert p.backend == "good"
    assert p.chain == ["failing", "good", "eager"]
    assert len(p.fallbacks) == 1
    fb = p.fallbacks[0]
    assert (fb.from_backend, fb.to_backend, fb.stage) == ("failing", "good", "compile")
    assert "RuntimeError" in fb.reason and "boom at compile" in fb.reason
    assert len(good.compiled) == 1
    text = str(be.report())
    assert "fallback at compile: failing -> good" in text and "(planned failing)" in text
    # later calls use the backend that compiled; nothing is compiled again
    x2 = torch.randn(4, 4)
    torch.testing.assert_close(compiled(x2), f(x2))
    assert len(good.compiled) == 1 and len(_only_partition(be).fallbacks) == 1


def test_compile_failure_on_real_backend_chain(make_backend, fresh_dynamo):
    # the next backend is a real one: onnxruntime compiles what "failing" could not
    make_backend("failing", OPS, compile=_boom_compile)
    be = arbiter.Arbiter({"backends": ["failing", "onnxruntime"], "min_block_size": 1})
    x = torch.randn(4, 4)
    torch.testing.assert_close(torch.compile(f, backend=be)(x), f(x))
    p = _only_partition(be)
    assert p.backend == "onnxruntime"
    assert [(fb.from_backend, fb.to_backend, fb.stage) for fb in p.fallbacks] == [
        ("failing", "onnxruntime", "compile")]


def test_every_backend_fails_to_compile_ends_on_eager(make_backend, fresh_dynamo):
    make_backend("failing", OPS, compile=_boom_compile)
    make_backend("failing2", OPS, compile=_boom_compile)
    be = arbiter.Arbiter({"backends": ["failing", "failing2"], "min_block_size": 1})
    x = torch.randn(4, 4)
    torch.testing.assert_close(torch.compile(f, backend=be)(x), f(x))
    p = _only_partition(be)
    assert p.backend == "eager"
    assert [(fb.from_backend, fb.to_backend, fb.stage) for fb in p.fallbacks] == [
        ("failing", "failing2", "compile"), ("failing2", "eager", "compile")]


def test_run_failure_demotes_and_retries(make_backend, fresh_dynamo):
    calls: list = []
    make_backend("runfail", OPS, compile=_run_failer(calls))
    good = make_backend("good", OPS)
    be = arbiter.Arbiter({"backends": ["runfail", "good"], "min_block_size": 1})
    compiled = torch.compile(f, backend=be)
    x = torch.randn(4, 4)
    torch.testing.assert_close(compiled(x), f(x))  # the failed call is retried
    assert len(calls) == 1
    p = _only_partition(be)
    assert (p.planned_backend, p.backend) == ("runfail", "good")
    assert [(fb.from_backend, fb.to_backend, fb.stage) for fb in p.fallbacks] == [
        ("runfail", "good", "run")]
    assert "boom at run" in p.fallbacks[0].reason
    # the second call goes straight to the demoted backend
    x2 = torch.randn(4, 4)
    torch.testing.assert_close(compiled(x2), f(x2))
    assert len(calls) == 1
    assert len(good.compiled) == 1
    assert len(_only_partition(be).fallbacks) == 1


def test_run_failure_in_training_graphs(make_backend, fresh_dynamo):
    calls: list = []
    make_backend("runfail", OPS + ["aten.threshold_backward.default"],
                 compile=_run_failer(calls))
    be = arbiter.Arbiter({"backends": ["runfail"], "min_block_size": 1,
                          "against_eager": "off"})
    compiled = torch.compile(f, backend=be)
    x = torch.randn(4, 4, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    compiled(x).sin().sum().backward()
    f(xr).sin().sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    rep = be.report()
    stages = {(g.kind, fb.stage, fb.to_backend)
              for g in rep.graphs for p in g.partitions for fb in p.fallbacks}
    assert ("forward", "run", "eager") in stages, str(rep)
    assert all(p.backend == "eager" for g in rep.graphs for p in g.partitions)


def test_exclude_keeps_failing_backend_out(make_backend, fresh_dynamo):
    failing = make_backend("failing", OPS, compile=_boom_compile)
    be = arbiter.Arbiter({"backends": ["failing"], "min_block_size": 1,
                          "exclude_ops": ["aten.relu", "aten.add", "aten.mul"]})
    x = torch.randn(4, 4)
    torch.testing.assert_close(torch.compile(f, backend=be)(x), f(x))
    assert failing.compiled == []
    assert all(not p.fallbacks for g in be.report().graphs for p in g.partitions)


# -- dry runs: explain and partition -------------------------------------------------------
def test_explain_reports_planned_partitions_without_compiling(make_backend, fresh_dynamo):
    failing = make_backend("failing", OPS, compile=_boom_compile)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    x = torch.randn(2, 4)
    rep = arbiter.explain(model, x, config={"backends": ["failing", "onnxruntime"],
                                            "min_block_size": 1})
    assert isinstance(rep, arbiter.Report)
    assert rep.dry_run is True
    assert [g.kind for g in rep.graphs] == ["forward", "backward"]
    planned = {p.planned_backend for g in rep.graphs for p in g.partitions}
    assert "failing" in planned and "onnxruntime" in planned
    for g in rep.graphs:
        assert g.nodes > 0 and g.partitions
        for p in g.partitions:
            assert not p.fallbacks
            assert not p.compiled and p.backend is None
    assert failing.compiled == []  # nothing was compiled
    assert all(p.grad is None for p in model.parameters())  # .grad left alone
    assert str(rep).startswith("[dry run]")


def test_explain_default_config_on_example():
    from arbiter.cli import examples

    torch._dynamo.reset()
    model, inputs = examples.mlp()
    with torch.no_grad():
        rep = arbiter.explain(model, *inputs)
    assert [g.kind for g in rep.graphs] == ["inference"]
    g = rep.graphs[0]
    assert [p.planned_backend for p in g.partitions] == ["onnxruntime"]
    assert g.constants > 0
    assert {"aten.addmm.default", "aten.gelu.default", "aten.relu.default"} <= set(
        g.partitions[0].ops)
    torch._dynamo.reset()


def test_partition_api_returns_plan():
    gm = trace(f, torch.randn(4, 4))
    plan = arbiter.partition(gm, {"backends": ["onnxruntime"], "min_block_size": 1})
    assert isinstance(plan, Plan)
    assert plan.as_lists() == [("onnxruntime", ["relu", "mul", "add"])]
    assert plan.fallback == "eager"
    plan_default = arbiter.partition(gm)  # default config: min_block_size 3
    assert plan_default.as_lists() == [("onnxruntime", ["relu", "mul", "add"])]
    assert arbiter.partition(gm, {"backends": ["onnxruntime"]}).as_lists() == \
        plan_default.as_lists()
