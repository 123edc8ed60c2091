"""Input-independent nodes of an inference graph folded into constants (arbiter/run/fold.py):
masks and position ids stay off the partitioner, outputs stay the caller's own."""
from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import arbiter
from arbiter.run.fold import fold_constants


def _ops(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _masked(x):
    n = x.shape[-1]
    idx = torch.arange(n)
    causal = (idx[None, :] <= idx[:, None]).to(x.dtype)  # made of no input
    return (x * causal + idx.to(x.dtype),)


def test_a_mask_made_of_no_input_becomes_a_constant():
    x = torch.randn(2, 5, 5)
    gm = make_fx(_masked)(x)
    assert torch.ops.aten.arange.default in _ops(gm)
    folded = fold_constants(gm)
    assert folded >= 3
    assert torch.ops.aten.arange.default not in _ops(gm)
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    assert set(_ops(gm)) <= {torch.ops.aten.mul.Tensor, torch.ops.aten.add.Tensor}
    torch.testing.assert_close(gm(x)[0], _masked(x)[0])
    y = torch.randn(2, 5, 5)  # other inputs, same constants
    torch.testing.assert_close(gm(y)[0], _masked(y)[0])


def test_what_the_graph_returns_is_never_a_folded_constant():
    def f(x):
        idx = torch.arange(4.0)
        return (idx.view(2, 2), x + idx, idx * 2)

    x = torch.randn(4)
    gm = make_fx(f)(x)
    fold_constants(gm)
    a, _, c = gm(x)
    a.add_(100.0)  # the caller's tensors: a later call must not see it
    c.add_(100.0)
    again = gm(x)
    torch.testing.assert_close(again[0], torch.arange(4.0).view(2, 2))
    torch.testing.assert_close(again[2], torch.arange(4.0) * 2)
    torch.testing.assert_close(again[1], x + torch.arange(4.0))


def test_random_and_input_dependent_nodes_stay():
    def f(x):
        noise = torch.rand(3)
        return (x + noise, x.sum() + torch.ones(3))

    x = torch.randn(3)
    gm = make_fx(f)(x)
    fold_constants(gm)
    assert torch.ops.aten.rand.default in _ops(gm)
    assert torch.ops.aten.sum.default in _ops(gm)


def test_nothing_to_fold_leaves_the_graph_alone():
    gm = make_fx(lambda x: (x * 2,))(torch.randn(3))
    before = str(gm.graph)
    assert fold_constants(gm) == 0 and str(gm.graph) == before


def test_a_compiled_model_runs_its_mask_inside_the_backend(make_backend, fresh_dynamo):
    # a backend that cannot take arange or comparisons: before folding, the mask's nodes
    # cut the graph into eager and backend partitions; now one partition
    make_backend("nomask", ["aten.mul.Tensor", "aten.add.Tensor"])

    class M(torch.nn.Module):
        def forward(self, x):
            return _masked(x)[0]

    be = arbiter.Arbiter({"backends": ["nomask"], "min_block_size": 1,
                          "against_eager": "off"})
    x = torch.randn(2, 5, 5)
    with torch.no_grad():
        out = torch.compile(M(), backend=be)(x)
    torch.testing.assert_close(out, _masked(x)[0])
    parts = [p for g in be.graphs for p in g.plan.partitions]
    assert [p.backend for p in parts] == ["nomask"], parts


def test_a_failing_fold_leaves_the_graph_as_it_was(monkeypatch):
    from arbiter.run import fold

    def boom(gm, free):
        raise RuntimeError("no memory for it")

    monkeypatch.setattr(fold, "_evaluate", boom)
    x = torch.randn(2, 5, 5)
    gm = make_fx(_masked)(x)
    before = str(gm.graph)
    assert fold.fold_constants(gm) == 0 and str(gm.graph) == before
    torch.testing.assert_close(gm(x)[0], _masked(x)[0])


def test_a_node_reading_an_unfolded_view_is_not_folded_and_the_rest_is(caplog):
    # Before: the view was unfolded (the graph returns it) but the node reading it stayed
    # folded, so computing the folded values failed ("KeyError: unsqueeze", Llama's rotary
    # set-up at a batch-2 recompile) and nothing at all was folded.
    aten = torch.ops.aten
    root = torch.nn.Module()
    root.register_buffer("c", torch.arange(4.0))
    g = torch.fx.Graph()
    x = g.placeholder("x")
    c = g.get_attr("c")
    view = g.call_function(aten.unsqueeze.default, (c, 0))
    reads_view = g.call_function(aten.mul.Tensor, (view, 2.0))
    other = g.call_function(aten.mul.Tensor, (c, 3.0))  # foldable on its own
    out = g.call_function(aten.add.Tensor, (g.call_function(aten.add.Tensor, (x, reads_view)),
                                            other))
    g.output((out, view))
    gm = torch.fx.GraphModule(root, g)
    real = {"x": torch.randn(2, 4)}
    for n in g.nodes:  # traced values, as AOTAutograd leaves them
        if n.op == "placeholder":
            n.meta["val"] = real[n.name]
        elif n.op == "get_attr":
            n.meta["val"] = root.c
        elif n.op == "call_function":
            n.meta["val"] = n.target(*[a.meta["val"] if isinstance(a, torch.fx.Node) else a
                                       for a in n.args])
    want = gm(real["x"])
    with caplog.at_level("WARNING", logger="arbiter.run.fold"):
        assert fold_constants(gm) == 1  # `other`; the view and what reads it stay
    assert not caplog.records
    got = gm(real["x"])
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
