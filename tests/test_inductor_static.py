"""backends/inductor.py: a static partition is compiled with static sizes.

Inductor's pieces compile inside a tracing context that carries the graph's shape env
(so Inductor's FX graph cache can key them). Inside such a context AOTAutograd made each
*real* example input a fake one with *symbolic* sizes, so static partitions were
compiled with size symbols wherever their guards left them free (a conv / adaptive pool
net's height and width): kernels that read their sizes at run time, slower than the
static ones Inductor alone compiles for the same graph. These tests look at the graph
Inductor's inner compiler receives.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import arbiter
from arbiter.shapes import free_symbols


class ConvPool(nn.Module):
    """Conv, ReLU, adaptive pool, linear: its height and width are free of guards."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return self.fc(nn.functional.adaptive_avg_pool2d(y, 1).flatten(1))


@pytest.fixture
def inner_inputs(monkeypatch):
    """The placeholder values of every graph Inductor's inner compiler got, per call of
    the backend's ``compile_fx``."""
    from torch._inductor import compile_fx as cfx

    seen: list = []
    real = cfx.compile_fx

    def inner(gm, example_inputs, **kw):
        seen.append([n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"])
        return cfx.compile_fx_inner(gm, example_inputs, **kw)

    def wrapped(gm, example_inputs, *args, **kw):
        kw.setdefault("inner_compile", inner)
        return real(gm, example_inputs, *args, **kw)

    monkeypatch.setattr(cfx, "compile_fx", wrapped)
    # a cache hit (Inductor's FX graph cache, AOTAutograd's) skips the inner compiler
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    with inductor_config.patch(fx_graph_cache=False), \
            functorch_config.patch(enable_autograd_cache=False):
        yield seen


def _symbols(vals: list) -> set:
    return {str(s) for s in free_symbols(vals)}


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_a_static_partition_is_compiled_with_static_sizes(fresh_dynamo, inner_inputs, grad):
    torch.manual_seed(0)
    model = ConvPool()
    x = torch.randn(2, 3, 12, 12)
    be = arbiter.Arbiter({"backends": ["inductor"], "against_eager": "off",
                          "min_block_size": 1})
    compiled = torch.compile(model, backend=be)
    with torch.set_grad_enabled(grad):
        got = compiled(x)
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    if grad:
        got.sum().backward()
    assert inner_inputs, "Inductor compiled nothing"
    for vals in inner_inputs:
        assert not _symbols(vals), (
            f"a static partition was compiled with size symbols {_symbols(vals)}: "
            f"{[tuple(v.shape) for v in vals if isinstance(v, torch.Tensor)]}")
    rep = be.report(advice=False)
    assert {p.backend for g in rep.graphs for p in g.partitions} == {"inductor"}


def test_a_symbolic_partition_keeps_its_symbols(fresh_dynamo, inner_inputs):
    """The other side: a graph Dynamo made symbolic is compiled once for every size."""
    torch.manual_seed(0)
    model = ConvPool().eval()
    be = arbiter.Arbiter({"backends": ["inductor"], "against_eager": "off",
                          "min_block_size": 1})
    compiled = torch.compile(model, backend=be, dynamic=True)
    with torch.no_grad():
        for size in (12, 20):
            x = torch.randn(2, 3, size, size)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert len(inner_inputs) == 1
    assert _symbols(inner_inputs[0])


def test_inputs_traced_under_two_fake_modes_still_compile():
    """A partition whose inputs' values come from two fake modes (seen in a process that
    had compiled other models first: one input's value from another Dynamo compile's
    mode) compiles on Inductor, its inputs given values of one mode, instead of failing
    over to eager on ``detect_fake_mode``'s assertion (fails without it)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from arbiter.registry import get_backend_class

    gm = torch.fx.symbolic_trace(lambda a, b: torch.relu(a) + b)
    modes = [FakeTensorMode(shape_env=ShapeEnv()), FakeTensorMode(shape_env=ShapeEnv())]
    real = [torch.randn(4, 8), torch.randn(4, 8)]
    for node, mode, t in zip([n for n in gm.graph.nodes if n.op == "placeholder"], modes,
                             real):
        node.meta["val"] = mode.from_tensor(t, static_shapes=True)
    aten = torch.fx.experimental.proxy_tensor.make_fx(gm)(*real)
    for node, mode, t in zip([n for n in aten.graph.nodes if n.op == "placeholder"], modes,
                             real):
        node.meta["val"] = mode.from_tensor(t, static_shapes=True)
    fn = get_backend_class("inductor")().compile(aten, real)
    out = fn(*real)
    torch.testing.assert_close(out[0] if isinstance(out, (list, tuple)) else out,
                               torch.relu(real[0]) + real[1])
