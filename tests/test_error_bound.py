"""The float64 judgement's rounding bound (arbiter/run/checks/error_bound.py, reference.py).

A difference from eager that float32 arithmetic explains (an output's scale and the
length of the reductions computing it) passes; one it does not explain is refused, however
small eager's own error happens to be. docs/verify.md.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from arbiter.run.checks.error_bound import arithmetic_rms, node_length, reduction_lengths
from arbiter.run.checks.reference import judge_against_float64
from arbiter.run.checks.verify import compare


def _lengths(fn, *shapes):
    gm = make_fx(fn, tracing_mode="fake")(*[torch.randn(s) for s in shapes])
    return gm, reduction_lengths(gm)


def test_a_node_s_reduction_length_is_read_off_the_graph():
    def f(x, w, lw):
        y = torch.nn.functional.conv2d(x, w, padding=1)            # 3 * 3 * 3 = 27 terms
        y = torch.nn.functional.batch_norm(y, None, None, training=True)  # 2 * 8 * 8 = 128
        z = torch.relu(y).mean((2, 3)) @ lw                         # 64, then 16
        return z, torch.softmax(z, -1), y[:, 0]

    gm, lengths = _lengths(f, (2, 3, 8, 8), (16, 3, 3, 3), (16, 10))
    by_op = {n.target.__name__.split(".")[0]: node_length(n) for n in gm.graph.nodes
             if n.op == "call_function" and hasattr(n.target, "__name__")}
    assert by_op["convolution"] == 27 and by_op["native_batch_norm"] == 128
    assert by_op["mean"] == 64 and by_op["mm"] == 16 and by_op["_softmax"] == 10
    assert by_op["select"] == 1 and by_op["getitem"] == 0  # picks and unpacking sum nothing
    # along the chain: conv 27, batch norm 128 (+1 for its elementwise part), relu 1,
    # mean 64, mm 16; softmax 10 more; the selected batch-norm output stops before relu
    z, soft, picked = lengths
    assert z == 27 + 128 + 1 + 64 + 16 and soft == z + 10 and picked == 27 + 128 + 1


def test_the_bound_grows_with_eps_the_scale_and_the_root_of_the_length():
    one = arithmetic_rms(torch.float32, 100, 1.0)
    assert one == pytest.approx(4 * torch.finfo(torch.float32).eps * 10)
    assert arithmetic_rms(torch.float32, 400, 3.0) == pytest.approx(one * 2 * 3)
    assert arithmetic_rms(torch.float16, 100, 1.0) / one == pytest.approx(
        torch.finfo(torch.float16).eps / torch.finfo(torch.float32).eps)
    assert arithmetic_rms(torch.float32, None, 1.0) == 0.0


def _row_sums(x):
    return (x.sum(1),)


def _sequential(x, chunks: int):
    """The row sums computed in float32 in another order than eager's: the columns in
    ``chunks`` blocks added one after the other (eager's sum is a cascade, far more
    accurate than a float32 sum needs to be)."""
    acc = torch.zeros(x.shape[0], x.shape[1] // chunks)
    for part in x.view(x.shape[0], chunks, -1).unbind(1):
        acc = acc + part
    return acc.sum(1)


def test_a_sum_in_another_float32_order_passes_and_a_wrong_one_does_not():
    torch.manual_seed(0)
    x = torch.randn(512, 8192) * 10
    gm = make_fx(_row_sums, tracing_mode="fake")(x)
    (expected,) = gm(x)
    exact = x.double().sum(1)
    eager_rms = float((expected.double() - exact).pow(2).mean().sqrt())
    got = _sequential(x, 4096)
    got_rms = float((got.double() - exact).pow(2).mean().sqrt())
    # eager's cascade is accurate to a few ulps; the sequential order is an ordinary
    # float32 sum, several times eager's error: 2x eager's RMS (the rule before) refused it
    assert got_rms > 4 * eager_rms
    assert not compare([expected], [got]).ok  # beyond float32's elementwise tolerance
    cmp = judge_against_float64(gm, [x], [expected], [got])
    assert cmp.ok and "within rounding error" in cmp.detail, cmp.detail
    # an error float32 does not explain: 1% off
    wrong = judge_against_float64(gm, [x], [expected], [got * 1.01])
    assert not wrong.ok and "rounding explains RMS" in wrong.detail and "K=8192" in wrong.detail
    # and one a hundred times what it explains, though a fraction of the output's size
    bound = arithmetic_rms(torch.float32, 8192, float(exact.pow(2).mean().sqrt()))
    noise = torch.randn(x.shape[0]) * 100 * bound
    assert not judge_against_float64(gm, [x], [expected], [expected + noise]).ok
    assert math.isfinite(bound)


def _on_onnxruntime(fn, *args):
    """``fn``'s ATen graph (make_fx) compiled whole by ONNX Runtime, its manifest's
    refusals aside: (graph, eager's outputs, ONNX Runtime's)."""
    from arbiter.decompose import for_backend
    from arbiter.registry import get_backend_class

    gm = make_fx(fn)(*args)
    backend = get_backend_class("onnxruntime")()
    run = backend.compile(for_backend(gm, backend), list(args))
    return gm, list(gm(*args)), list(run(*args))


def _scatter_mean(base, src, index):
    return (torch.sin(base.scatter_reduce(1, index, src, "mean", include_self=False)),)


def _bag_max(w, indices):
    return torch.ops.aten._embedding_bag.default(w, indices, torch.arange(0, 12, 3), False, 2)


@pytest.mark.parametrize("case", ["scatter_reduce_mean", "embedding_bag_max"])
def test_what_onnx_runtime_got_wrong_is_still_refused(case):
    """Past catches (tests/test_corpus.py, tests/test_embedding_bag.py; the manifest refuses
    them up front since): the first-use check's judgement still refuses them, whatever
    rounding the bound allows."""
    pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    if case == "scatter_reduce_mean":
        index = torch.tensor([[0, 2, 2, 4], [1, 1, 0, 3], [4, 4, 4, 0]])
        args = (torch.randn(3, 5), torch.randn(3, 4), index)
        gm, expected, got = _on_onnxruntime(_scatter_mean, *args)
    else:
        args = (torch.randn(50, 8), torch.tensor([3, 49, 7, 7, 0, 49, 12, 2, 49, 5, 18, 3]))
        gm, expected, got = _on_onnxruntime(_bag_max, *args)
    cmp = judge_against_float64(gm, list(args), expected, got)
    assert not cmp.ok, f"{case}: ONNX Runtime now computes it like eager: {cmp.detail}"
    if case == "scatter_reduce_mean":  # a float output: judged against float64, refused
        assert "rounding explains" in cmp.detail, cmp.detail
