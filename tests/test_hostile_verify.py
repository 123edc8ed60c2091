"""`verify` against backends that write into their inputs or reuse their output buffers
(issue 14, item 4). The reference is computed from inputs captured before the backend
ran; a verified call checks that the inputs were not written and that a second call does
not hand back the first call's buffers.
"""
from __future__ import annotations

import pytest
import torch

import arbiter

OPS = ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"]


def g(x):
    # relu * 2 + x on the backend; sin (excluded) and sub (not in OPS) in eager, which
    # reads x again after the backend ran
    return torch.sin(torch.relu(x) * 2 + x) - x


def _config(name, **extra):
    return {"backends": [name], "min_block_size": 1, "exclude_ops": ["aten.sin"],
            "verify": {"mode": "first"}, **extra}


def _piece(be):
    parts = [p for gr in be.report().graphs for p in gr.partitions if p.planned_backend != "eager"]
    assert len(parts) == 1, parts
    return parts[0]


def test_backend_writing_into_its_input_after_computing(make_backend, fresh_dynamo):
    """Right result, then scribbles on its input. Before: verify re-ran eager on the
    scribbled input, replaced the right answer with a wrong one (error 2.74) and blamed
    the backend for the numbers; the eager node reading x after it saw garbage too."""

    def compile(self, gm, example_inputs):
        def fn(*args):
            out = gm(*args)
            args[0].mul_(-3.0)
            return out
        return fn

    make_backend("scribbler", OPS, compile=compile)
    be = arbiter.Arbiter(_config("scribbler"))
    x = torch.randn(4, 4)
    keep = x.clone()
    out = torch.compile(g, backend=be)(x)
    torch.testing.assert_close(out, g(keep))
    assert torch.equal(x, keep), "the user's input was left written"
    p = _piece(be)
    assert p.backend == "eager"
    (fb,) = p.fallbacks
    assert fb.stage == "verify" and "wrote into its input" in fb.reason


def test_backend_writing_into_its_input_before_computing(make_backend, fresh_dynamo):
    """Scribbles first, then computes from the scribbled input. Before: verify compared
    two results of the same wrong input and passed; the user's tensor stayed changed."""

    def compile(self, gm, example_inputs):
        def fn(*args):
            args[0].add_(1.0)
            return gm(*args)
        return fn

    make_backend("early", OPS, compile=compile)
    be = arbiter.Arbiter(_config("early"))
    x = torch.randn(4, 4)
    keep = x.clone()
    out = torch.compile(g, backend=be)(x)
    torch.testing.assert_close(out, g(keep))
    assert torch.equal(x, keep)
    (fb,) = _piece(be).fallbacks
    assert "wrote into its input 0" in fb.reason


def test_backend_reusing_its_output_buffer(make_backend, fresh_dynamo):
    """Returns the same buffer every call: a result the user holds changes at the next
    call. Before: unnoticed by verify."""

    def compile(self, gm, example_inputs):
        bufs = []

        def fn(*args):
            res = gm(*args)
            if not bufs:
                bufs.extend(torch.empty_like(t) for t in res)
            for b, t in zip(bufs, res):
                b.copy_(t)
            return list(bufs)
        return fn

    make_backend("reuser", OPS, compile=compile)
    be = arbiter.Arbiter(dict(_config("reuser"), exclude_ops=[]))
    fn = torch.compile(lambda x: torch.relu(x) * 2 + x, backend=be)
    x1, x2 = torch.randn(4, 4), torch.randn(4, 4)
    out1 = fn(x1)
    held = out1.clone()
    out2 = fn(x2)
    assert torch.equal(out1, held), "the first result changed under the user"
    torch.testing.assert_close(out2, torch.relu(x2) * 2 + x2)
    p = _piece(be)
    (fb,) = p.fallbacks
    assert fb.stage == "verify" and "same output buffer" in fb.reason


def test_reuse_not_checked_without_verify(make_backend, fresh_dynamo):
    """Without verify nothing is checked: the limit is documented, and this says so."""

    def compile(self, gm, example_inputs):
        def fn(*args):
            args[0].add_(1.0)
            return gm(*args)
        return fn

    make_backend("early2", OPS, compile=compile)
    be = arbiter.Arbiter(dict(_config("early2"), verify={"mode": "off"}))
    x = torch.randn(4, 4)
    keep = x.clone()
    torch.compile(g, backend=be)(x)
    assert not torch.equal(x, keep)
    assert not _piece(be).fallbacks


@pytest.mark.parametrize("special", [float("nan"), float("inf"), -0.0])
def test_non_finite_inputs_are_not_taken_for_writes(special, fresh_dynamo):
    """NaN != NaN: the input check compares bits, so a NaN input a correct backend left
    alone is not reported as written (ONNX Runtime, real)."""
    pytest.importorskip("onnxruntime")
    be = arbiter.Arbiter(dict(_config("onnxruntime"), exclude_ops=["aten.sin", "aten.sub"]))
    x = torch.randn(4, 4)
    x[0, 0] = special
    out = torch.compile(g, backend=be)(x)
    torch.testing.assert_close(out, g(x), equal_nan=True)
    p = _piece(be)
    assert p.backend == "onnxruntime" and not p.fallbacks and p.verify_checks == 1


def test_verify_every_checks_writes_on_every_verified_call(make_backend, fresh_dynamo):
    calls = [0]

    def compile(self, gm, example_inputs):
        def fn(*args):
            calls[0] += 1
            if calls[0] > 6:  # starts scribbling late
                args[0].zero_()
            return gm(*args)
        return fn

    make_backend("late", OPS, compile=compile)
    be = arbiter.Arbiter(dict(_config("late"), verify={"mode": "every", "every_n": 2}))
    fn = torch.compile(g, backend=be)
    for _ in range(8):
        x = torch.randn(4, 4)
        keep = x.clone()
        out = fn(x)
    # the last verified call caught it; the call that caught it returned the right answer
    p = _piece(be)
    assert p.backend == "eager" and "wrote into its input" in p.fallbacks[0].reason
    torch.testing.assert_close(out, g(keep))
