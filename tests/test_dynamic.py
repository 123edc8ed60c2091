"""dynamic=True: symbolic shapes stay with backends whose manifests allow them."""
from __future__ import annotations

import copy

import pytest
import torch

import arbiter
from arbiter.cli import examples
from arbiter.capability import tensor_descs

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _symbolic(node) -> bool:
    return any(d.symbolic for d in tensor_descs(node))


@pytest.fixture(scope="module")
def dynamic_run():
    torch._dynamo.reset()
    model, _ = examples.mlp()
    ref = copy.deepcopy(model)
    be = arbiter.Arbiter({"backends": ["onnxruntime", "inductor"], "min_block_size": 1})
    compiled = torch.compile(model, backend=be, dynamic=True)
    results = []
    for batch in (8, 5):
        x = torch.randn(batch, 32, requires_grad=True)
        xr = x.detach().clone().requires_grad_()
        out = compiled(x)
        out.square().sum().backward()
        want = ref(xr)
        want.square().sum().backward()
        results.append((out.detach(), want.detach(), x.grad, xr.grad))
    with torch.no_grad():
        x = torch.randn(3, 32)
        results.append((compiled(x), ref(x), None, None))
    yield be, results, model, ref
    torch._dynamo.reset()


def test_outputs_and_grads_match_for_each_batch_size(dynamic_run):
    _, results, model, ref = dynamic_run
    for out, want, g, gr in results:
        torch.testing.assert_close(out, want, **TOL)
        if g is not None:
            torch.testing.assert_close(g, gr, **TOL)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL)


def test_one_graph_serves_both_batch_sizes(dynamic_run):
    be, *_ = dynamic_run
    kinds = [g.kind for g in be.report().graphs]
    # forward+backward once for batches 8 and 5, one inference graph under no_grad
    assert kinds.count("forward") == 1 and kinds.count("backward") == 1
    assert kinds.count("inference") == 1


def test_symbolic_nodes_stay_off_static_backends(dynamic_run):
    be, *_ = dynamic_run
    symbolic_nodes = 0
    for plan in [g.plan for g in be.graphs]:
        for part in plan.partitions:
            for node in part.nodes:
                if node.op == "call_function" and _symbolic(node) and \
                        isinstance(node.target, torch._ops.OpOverload):
                    symbolic_nodes += 1
                    assert part.backend == "eager", (node.name, part.backend)
    assert symbolic_nodes > 0  # the test saw symbolic shapes at all


def test_refusals_mention_symbolic(dynamic_run):
    be, *_ = dynamic_run
    rep = be.report()
    for g in rep.graphs:
        refused = {(r.op, r.backend) for r in g.refusals if "symbolic" in r.reason}
        assert ("aten.addmm.default", "onnxruntime") in refused or \
            ("aten.mm.default", "onnxruntime") in refused, str(rep)
        assert any(b == "inductor" for _, b in refused)
    assert all(not p.fallbacks for g in rep.graphs for p in g.partitions), str(rep)


def test_dynamic_backend_takes_symbolic_nodes(make_backend, fresh_dynamo):
    # a backend whose manifest says dynamic: true is given the symbolic nodes
    make_backend("dyn", ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"],
                 dynamic=True)
    be = arbiter.Arbiter({"backends": ["dyn", "onnxruntime"], "min_block_size": 1})

    def f(x):
        return torch.relu(x) * 2 + x

    compiled = torch.compile(f, backend=be, dynamic=True)
    for n in (4, 7):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x), f(x))
    rep = be.report()
    assert [p.backend for g in rep.graphs for p in g.partitions] == ["dyn"], str(rep)
    assert len(arbiter.get_backend_class("dyn").compiled) == 1


def test_dynamic_backend_gets_symbolic_nodes_in_plan(make_backend):
    make_backend("dyn", ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"],
                 dynamic=True)
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        return torch.relu(x) * 2 + x

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(4, 3))
    cfg = {"backends": ["onnxruntime", "dyn"], "min_block_size": 1}
    plan = arbiter.partition(gm, cfg)
    assert plan.as_lists() == [("dyn", ["relu", "mul", "add"])]
    relu = next(n for n in gm.graph.nodes if n.name == "relu")
    assert "symbolic" in plan.support[relu].refusals["onnxruntime"]

