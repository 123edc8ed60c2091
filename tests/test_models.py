"""End to end on the built-in example models: outputs and gradients equal eager's, with
at least two real backends running partitions and no fallbacks.

Each model is compiled once per module (compiles are the expensive part); the tests read
the shared results.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import arbiter
from arbiter.cli import examples

#: ONNX Runtime first, Inductor for what it refuses, small partitions allowed. ONNX
#: Runtime now takes every op of these models (backward ops through their
#: decompositions), so two backward ops are pinned to Inductor: both backends get work and
#: their partitions are stitched with gradients crossing.
CONFIG = {"backends": ["onnxruntime", "inductor"], "min_block_size": 1,
          "pin": {"aten.gelu_backward": "inductor", "aten.threshold_backward": "inductor"},
          # the placement and stitching are under test here, not the timing against eager
          "against_eager": "off"}
MODELS = ["mlp", "encoder_block", "small_cnn"]
TOL = {"rtol": 1e-4, "atol": 1e-5}


@dataclass
class Run:
    model: torch.nn.Module
    ref: torch.nn.Module
    out: torch.Tensor
    ref_out: torch.Tensor
    x_grad: torch.Tensor
    ref_x_grad: torch.Tensor
    out2: torch.Tensor
    ref_out2: torch.Tensor
    report: Any


@pytest.fixture(scope="module", params=MODELS)
def trained(request):
    """One forward/backward, an SGD step, and a second forward, compiled and eager."""
    torch._dynamo.reset()
    model, (x,) = getattr(examples, request.param)()
    ref = copy.deepcopy(model)
    be = arbiter.Arbiter(CONFIG)
    compiled = torch.compile(model, backend=be)

    xc = x.clone().requires_grad_()
    xr = x.clone().requires_grad_()
    out = compiled(xc)
    ref_out = ref(xr)
    # a loss that is not just a sum, so the incoming gradient is not all ones
    (out.square().mean() + out.sin().sum()).backward()
    (ref_out.square().mean() + ref_out.sin().sum()).backward()

    # weights of training graphs are graph inputs: an optimizer step must be seen
    for m in (model, ref):
        with torch.no_grad():
            for p in m.parameters():
                p -= 0.1 * p.grad
    x2 = torch.randn_like(x)
    out2 = compiled(x2)
    ref_out2 = ref(x2)
    yield Run(model, ref, out.detach(), ref_out.detach(), xc.grad, xr.grad,
              out2.detach(), ref_out2.detach(), be.report())
    torch._dynamo.reset()


def test_forward_matches_eager(trained):
    torch.testing.assert_close(trained.out, trained.ref_out, **TOL)


def test_input_grad_matches_eager(trained):
    assert trained.x_grad is not None
    torch.testing.assert_close(trained.x_grad, trained.ref_x_grad, **TOL)


def test_param_grads_match_eager(trained):
    params = dict(trained.model.named_parameters())
    ref_params = dict(trained.ref.named_parameters())
    assert params.keys() == ref_params.keys()
    for name, p in params.items():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, ref_params[name].grad, **TOL, msg=name)


def test_second_step_sees_updated_weights(trained):
    torch.testing.assert_close(trained.out2, trained.ref_out2, **TOL)


def test_buffers_match_eager(trained):
    # batch norm's running statistics are updated in place by the compiled graph
    bufs = dict(trained.model.named_buffers())
    ref_bufs = dict(trained.ref.named_buffers())
    for name, b in bufs.items():
        torch.testing.assert_close(b, ref_bufs[name], **TOL, msg=name)


def test_two_backends_ran_partitions(trained):
    rep = trained.report
    kinds = [g.kind for g in rep.graphs]
    assert "forward" in kinds and "backward" in kinds
    used = {p.backend for g in rep.graphs for p in g.partitions}
    assert {"onnxruntime", "inductor"} <= used, str(rep)
    # every partition has been compiled (or runs inline) by now
    assert all(p.compiled and p.backend for g in rep.graphs for p in g.partitions)


def test_no_fallbacks(trained):
    rep = trained.report
    falls = [(p.id, f) for g in rep.graphs for p in g.partitions for f in p.fallbacks]
    assert falls == [], str(rep)
    for g in rep.graphs:
        for p in g.partitions:
            assert p.backend == p.planned_backend
    assert "fallbacks: 0" in rep.summary()


def test_report_counts_are_consistent(trained):
    for g in trained.report.graphs:
        assert g.nodes == sum(p.nodes for p in g.partitions) > 0
        assert g.constants == 0  # training graphs keep weights as inputs
        for p in g.partitions:
            assert sum(p.ops.values()) == p.nodes == len(p.node_names)
            assert p.chain[0] == p.planned_backend and p.chain[-1] == "eager"


# -- inference with frozen weights -------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_inference_frozen_weights(name):
    torch._dynamo.reset()
    model, (x,) = getattr(examples, name)()
    model.eval()
    be = arbiter.Arbiter({"backends": ["onnxruntime", "inductor"]})
    compiled = torch.compile(model, backend=be)
    with torch.no_grad():
        out = compiled(x)
        want = model(x)
        x2 = torch.randn_like(x)
        out2 = compiled(x2)
        want2 = model(x2)
    torch.testing.assert_close(out, want, **TOL)
    torch.testing.assert_close(out2, want2, **TOL)
    rep = be.report()
    assert [g.kind for g in rep.graphs] == ["inference"]
    g = rep.graphs[0]
    n_params = len(list(model.parameters()))
    # every parameter (and, for the CNN, the running statistics) is a constant
    assert n_params <= g.constants <= n_params + len(list(model.buffers()))
    assert any(p.backend == "onnxruntime" for p in g.partitions)
    assert all(not p.fallbacks for p in g.partitions), str(rep)
    torch._dynamo.reset()


def test_inference_without_freezing_keeps_weights_as_inputs():
    torch._dynamo.reset()
    model, (x,) = examples.mlp()
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "freeze_weights": False})
    compiled = torch.compile(model, backend=be)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **TOL)
        # not frozen: an in-place weight change is seen without recompiling
        model.fc3.bias.add_(1.0)
        torch.testing.assert_close(compiled(x), model(x), **TOL)
    rep = be.report()
    assert rep.graphs[0].kind == "inference" and rep.graphs[0].constants == 0
    assert len(rep.graphs) == 1
    torch._dynamo.reset()
