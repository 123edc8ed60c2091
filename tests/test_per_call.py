"""The per-call path of a compiled graph (issue 18, item 5; bench/per_call_floor.py): a graph
that is one partition calls it directly (``run.split.Direct``) instead of through the
stitched GraphModule, with the same results and the same checks around it."""
from __future__ import annotations

import operator

import pytest
import torch
from torch import nn

import arbiter
from arbiter.run.split import Direct, direct

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).eval()


def _spied(config):
    """An Arbiter (``None``: the embedded default's backends, in priority order: policy
    calibrated would time a close call on the first call, which is not what these test)
    whose compiled graphs are kept in ``made``."""
    if config is None:
        config = {**arbiter.load_config("default").model_dump(mode="json",
                                                              exclude={"source"}),
                  "policy": "priority"}
    be = arbiter.Arbiter(config)
    made = []
    real = be.compiler.compile

    def spy(gm, kind, constants, **kw):
        fn = real(gm, kind, constants, **kw)
        made.append(fn)
        return fn

    be.compiler.compile = spy
    return be, made


def _next(be) -> str:
    """The backend after ONNX Runtime in ``be``'s chain (the default's: OpenVINO where
    it is installed)."""
    names = [n for n in be.planner.backends if n not in be.planner.unavailable]
    return names[names.index("onnxruntime") + 1]


def _inner(fn):
    state = getattr(fn, "_state", None)  # run.freeze.FrozenGraph
    return state[1] if state is not None else fn


def test_one_partition_is_called_directly_and_matches_eager(fresh_dynamo):
    model = _mlp()
    be, made = _spied(None)
    with torch.no_grad():
        compiled = torch.compile(model, backend=be)
        compiled(torch.randn(4, 16))
        assert len(made) == 1 and isinstance(_inner(made[0]), Direct)
        for _ in range(3):  # inputs it was not compiled with
            x = torch.randn(4, 16)
            torch.testing.assert_close(compiled(x), model(x), **TOL)
        # the weight guard still runs in front of it: new weights, new pieces, still direct
        with torch.no_grad():
            model[0].weight.mul_(-1.5)
        x = torch.randn(4, 16)
        torch.testing.assert_close(compiled(x), model(x), **TOL)
        assert [e.action for e in be.graphs[0].weight_events] == ["re-frozen"]
        assert isinstance(_inner(made[0]), Direct)
    rec = be.graphs[0]
    assert [r.backend for r in rec.records.values()] == ["onnxruntime"]


def test_a_demoted_piece_still_answers_through_the_direct_call(fresh_dynamo, monkeypatch):
    """Piece's own checks run inside the direct call: an ONNX Runtime run that fails
    falls back down the chain (Inductor) for that call and the ones after."""
    from arbiter.backends import onnxruntime as ortmod

    model = _mlp()
    be, made = _spied(None)
    with torch.no_grad():
        compiled = torch.compile(model, backend=be)
        compiled(torch.randn(4, 16))
        assert isinstance(_inner(made[0]), Direct)

        def broken(self, *args):
            raise RuntimeError("injected run failure")

        monkeypatch.setattr(ortmod.OrtRunner, "__call__", broken)
        x = torch.randn(4, 16)
        torch.testing.assert_close(compiled(x), model(x), **TOL)
    (rec,) = be.graphs[0].records.values()
    assert rec.backend == _next(be) and rec.fallbacks[0].stage == "run"  # the chain's next


def test_graphs_with_inline_ops_keep_the_stitched_module(fresh_dynamo):
    be, made = _spied({"backends": ["onnxruntime"], "exclude_ops": ["aten.tanh"],
                       "min_block_size": 1})

    def f(x):
        return torch.tanh(x * 2) + 1

    x = torch.randn(3, 5)
    with torch.no_grad():
        got = torch.compile(f, backend=be)(x)
    torch.testing.assert_close(got, f(x))
    assert isinstance(made[0], torch.fx.GraphModule)


def _graph(outputs: str) -> torch.fx.GraphModule:
    """placeholders a, b; one call of ``fn`` on (b, a); outputs as named."""
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")

    def fn(p, q):
        return [p - q, p * q]

    call = g.call_function(fn, (b, a))
    items = [g.call_function(operator.getitem, (call, k)) for k in range(2)]
    pick = {"whole": (items[0], items[1]), "mixed": (items[1], a, items[1]),
            "first": (items[0],)}[outputs]
    g.output(pick)
    return torch.fx.GraphModule(nn.Module(), g)


@pytest.mark.parametrize("outputs", ["whole", "mixed", "first"])
def test_direct_returns_what_the_graph_module_returns(outputs):
    gm = _graph(outputs)
    fast = direct(gm)
    assert isinstance(fast, Direct)
    a, b = torch.randn(3), torch.randn(3)
    want = gm(a, b)
    got = fast(a, b)
    assert isinstance(got, tuple) and len(got) == len(want)
    for w, v in zip(want, got):
        assert torch.equal(w, v)
    if outputs == "mixed":
        assert got[1] is a  # an input returned as it is


def test_direct_refuses_graphs_with_more_than_the_call():
    g = torch.fx.Graph()
    a = g.placeholder("a")

    def fn(p):
        return [p + 1]

    call = g.call_function(fn, (a,))
    item = g.call_function(operator.getitem, (call, 0))
    g.output((g.call_function(torch.ops.aten.tanh.default, (item,)),))
    assert direct(torch.fx.GraphModule(nn.Module(), g)) is None


@pytest.mark.parametrize("fault", ["raises", "wrong shape"])
def test_the_steady_state_path_still_checks_and_demotes(fresh_dynamo, monkeypatch, fault):
    """After its first calls a piece takes a short path (run.piece.Piece._fast): the
    backend's call and the output check. A backend that fails there, by raising or by
    returning the wrong shape, is demoted as before and the call answers correctly."""
    from arbiter.backends import onnxruntime as ortmod
    from arbiter.run.piece import Piece

    model = _mlp()
    be, made = _spied(None)
    with torch.no_grad():
        compiled = torch.compile(model, backend=be)
        for _ in range(4):
            compiled(torch.randn(4, 16))
        pieces = [n.target for n in _inner(made[0]).graph.nodes
                  if n.op == "call_function" and isinstance(n.target, Piece)]
        assert len(pieces) == 1 and pieces[0]._fast is not None
        real = ortmod.OrtRunner.__call__

        def broken(self, *args):
            if fault == "raises":
                raise RuntimeError("injected run failure")
            return [o[:1] for o in real(self, *args)]

        monkeypatch.setattr(ortmod.OrtRunner, "__call__", broken)
        for _ in range(2):
            x = torch.randn(4, 16)
            torch.testing.assert_close(compiled(x), model(x), **TOL)
    (rec,) = be.graphs[0].records.values()
    assert rec.backend == _next(be) and len(rec.fallbacks) == 1
    assert rec.fallbacks[0].stage == "run"
    assert ("wrong output" in rec.fallbacks[0].reason) == (fault == "wrong shape")
    assert pieces[0]._fast is None or pieces[0]._fast[0] == 1


def test_a_piece_checked_once_then_takes_the_short_path(fresh_dynamo):
    """Verify mode `first` (what `unverified` becomes for a backend holding unverified
    ops) checks one call; the calls after it take the short path, as under `off` (they
    never did: every later call went through the full path)."""
    model = _mlp()
    be, made = _spied({"backends": ["onnxruntime"], "verify": {"mode": "first"}})
    with torch.no_grad():
        compiled = torch.compile(model, backend=be)
        for _ in range(4):
            x = torch.randn(4, 16)
            torch.testing.assert_close(compiled(x), model(x), **TOL)
    (piece,) = list(be._pieces)
    assert piece._fast is not None and piece._fast[0] == 0
    (rec,) = be.graphs[0].records.values()
    assert rec.verify_checks == 1 and rec.backend == "onnxruntime" and not rec.fallbacks
