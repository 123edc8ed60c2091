"""A graph that writes into its inputs (a KV cache and its position, as transformers'
StaticCache does) is run many times on its first call: timing candidates, timing against
eager, accepting lower precision, retrying a failed piece. Each of those runs starts
from the inputs as the user handed them, and the user's tensors are written exactly once
per call (arbiter/measure/rerun.py): without it the position ran past the cache's end
(IndexError) on the first generate() of every decoder with a static cache."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import arbiter
from arbiter.measure.rerun import Rerun, written_inputs

from conftest import tiny_llama

OPS = ["aten.t.default", "aten.addmm.default", "aten.view.default", "aten.sum.dim_IntList",
       "aten.mul.Tensor", "aten.add.Tensor", "aten.mm.default", "aten._unsafe_view.default"]
SLOTS = 6


class Cached(nn.Module):
    """A cache of SLOTS positions written at a position it advances in place: a seventh
    call raises in eager (index out of range), as a full StaticCache does."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 4)
        self.register_buffer("cache", torch.zeros(2, SLOTS, 4))
        self.register_buffer("pos", torch.zeros(1, dtype=torch.long))

    def forward(self, x):
        self.cache.index_copy_(1, self.pos, self.lin(x))
        self.pos.add_(1)
        return self.cache.sum(1) * 2


def _against_eager(be, calls: int = 3):
    """``calls`` calls of the compiled model beside eager: equal outputs, and the
    buffers equal after each call (written once per call)."""
    model, ref = Cached().eval(), Cached().eval()
    compiled = torch.compile(model, backend=be)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for step in range(calls):
            x = torch.randn(2, 1, 4, generator=gen)
            torch.testing.assert_close(compiled(x), ref(x))
            assert int(model.pos) == int(ref.pos) == step + 1
            torch.testing.assert_close(model.cache, ref.cache)
    return model


def test_written_inputs_found_through_the_graph():
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda a, b, c: (a.add_(1), c.view(-1).mul_(2), b + 1))(
        torch.zeros(2), torch.zeros(2), torch.zeros(2))
    assert written_inputs(gm) == (0, 2)
    gm = make_fx(lambda a, b: a + b)(torch.zeros(2), torch.zeros(2))
    assert written_inputs(gm) == () and not Rerun(gm).writes


def test_rerun_restores_only_its_private_copies():
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda a, b: (a.add_(1), b * 2))(torch.zeros(2), torch.zeros(2))
    user = [torch.zeros(2), torch.ones(2)]
    rerun = Rerun(gm)
    mine = rerun.begin(user)
    assert mine[0] is not user[0] and mine[1] is user[1]  # only the written input copied
    fn = rerun.build(lambda cand: (gm, {}))(None)[0]
    for _ in range(3):
        fn(*mine)
        assert torch.equal(mine[0], torch.ones(2))  # each run from the first state
    assert torch.equal(user[0], torch.zeros(2))  # the user's tensor untouched


@pytest.mark.parametrize("extra", [
    {"policy": "measure"},  # every candidate timed, interleaved rounds
    {"policy": "priority", "against_eager": "all"},  # the plan timed against eager
])
def test_timing_runs_leave_the_state_to_the_users_call(make_backend, fresh_dynamo, extra):
    make_backend("mutA", OPS)
    make_backend("mutB", OPS)
    cfg = {"backends": ["mutA", "mutB"], "min_block_size": 1, "cache": {"enabled": False},
           "verify": {"mode": "off"}, **extra}
    be = arbiter.Arbiter(cfg)
    _against_eager(be)
    (g,) = be.report(advice=False).graphs
    assert len(g.candidates_ms) >= 2, str(g)  # the graph was timed, many runs


@pytest.mark.parametrize("verify", [{"mode": "first"}, {"mode": "every", "every_n": 1}])
def test_checks_against_eager_leave_the_state_to_the_users_call(make_backend, fresh_dynamo,
                                                                verify):
    """A first-use check (and mode `every`'s, on each call here) runs eager beside the
    backend on the partition's inputs: the user's buffers are still written once. The
    backend offers `copy_` too; the writes into the user's buffers stay in eager after
    its partition (``ops.is_mutating``), which the checks never run twice."""
    make_backend("mutchk", OPS + ["aten.index_copy.default", "aten.copy_.default"])
    be = arbiter.Arbiter({"backends": ["mutchk"], "min_block_size": 1,
                          "cache": {"enabled": False}, "against_eager": "off",
                          "verify": verify})
    _against_eager(be)
    (g,) = be.report(advice=False).graphs
    mine = [p for p in g.partitions if p.backend == "mutchk"]
    assert not any("copy_" in n for p in mine for n in p.node_names), str(g)
    checks = sum(p.verify_checks for p in mine)
    assert checks >= (3 if verify["mode"] == "every" else 1), str(g)  # they ran


def test_precision_acceptance_runs_leave_the_state_to_the_users_call(make_backend,
                                                                     fresh_dynamo):
    from tests.test_precision import _lowering

    _lowering(make_backend, "mutlow", slow_f32_s=0.0)
    be = arbiter.Arbiter({"backends": ["mutlow"], "policy": "measure", "min_block_size": 1,
                          "cache": {"enabled": False}, "accuracy": {"atol": 5e-2}})
    _against_eager(be)
    (g,) = be.report(advice=False).graphs
    assert g.accuracy is not None and g.accuracy.errors, str(g)  # a variant was judged


def test_a_piece_failing_at_run_time_is_retried_without_writing_twice(make_backend,
                                                                      fresh_dynamo):
    def fails(self, gm, example_inputs):
        def run(*args):
            raise RuntimeError("backend broke at run time")
        return run

    make_backend("mutfail", OPS, compile=fails)
    be = arbiter.Arbiter({"backends": ["mutfail"], "min_block_size": 1,
                          "cache": {"enabled": False}, "against_eager": "off"})
    _against_eager(be)
    (g,) = be.report(advice=False).graphs
    assert any(p.fallbacks for p in g.partitions), str(g)


def test_static_cache_generate_gives_eagers_tokens(fresh_dynamo):
    """A 1-layer Llama's generate() with a static cache, every graph timed (policy
    measure): the decode graph writes its cache in place; eager's tokens, no
    IndexError."""
    model, ids, kw = tiny_llama(4, cache_implementation="static")
    with torch.no_grad():
        want = model.generate(ids, **kw)
        model.forward = torch.compile(model.forward, backend="arbiter", options={
            "backends": ["onnxruntime", "openvino"], "policy": "measure", "cache": {"enabled": False}})
        got = model.generate(ids, **kw)
    assert torch.equal(got, want)
    graphs = arbiter.report_for(model.forward).graphs
    assert graphs and all(g.candidates_ms for g in graphs)  # every graph was timed
