"""The ONNX Runtime backend against eager, where ONNX Runtime's own optimizers go wrong."""
from __future__ import annotations

import pytest
import torch

from arbiter.backends.onnxruntime import OnnxRuntime, _unsound_optimizers

from conftest import trace

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _mv_t(a, g):
    return (torch.mv(a.t(), g),)


def _addmv_t(b, a, g):
    return (torch.addmv(b, a.t(), g),)


def _mm_t(a, b):
    return (a.t() @ b,)


@pytest.mark.parametrize("fn, shapes", [(_mv_t, [(5, 3), (5,)]), (_addmv_t, [(3,), (5, 3), (5,)])])
def test_transposed_matrix_times_vector(fn, shapes):
    """ONNX Runtime's MatmulTransposeFusion computes Transpose + MatMul with a 1-D operand
    wrongly (the gradient of mv, found by the OpInfo gradient sweep): off for such graphs."""
    torch.manual_seed(0)
    args = [torch.randn(s) for s in shapes]
    gm = trace(fn, *args)
    assert _unsound_optimizers(gm) == ("MatmulTransposeFusion",)
    got = OnnxRuntime().compile(gm, args)(*args)
    torch.testing.assert_close(got[0], fn(*args)[0], **TOL)


def test_the_fusion_stays_on_for_matrix_products():
    a, b = torch.randn(5, 3), torch.randn(5, 4)
    gm = trace(_mm_t, a, b)
    assert _unsound_optimizers(gm) == ()
    torch.testing.assert_close(OnnxRuntime().compile(gm, [a, b])(a, b)[0], _mm_t(a, b)[0], **TOL)


def _three_outputs(a, b):
    return (torch.tanh(a) @ b, (a * 2).sum(0), a[:0] * 3)  # the last has no elements


def test_direct_binding_matches_eager_and_the_public_calls():
    """OrtRunner binds and runs through ONNX Runtime's C++ objects (per_call_floor.py):
    the same results as eager and as the public IOBinding calls, on inputs the session
    was not built with (a transposed one among them), in fresh output buffers each call."""
    torch.manual_seed(0)
    a, b = torch.randn(5, 3), torch.randn(3, 4)
    runner = OnnxRuntime().compile(trace(_three_outputs, a, b), [a, b])
    assert runner._c is not None  # the direct path is the one under test
    for x, y in [(torch.randn(5, 3), torch.randn(3, 4)),
                 (torch.randn(3, 5).t(), torch.randn(4, 3).t())]:
        want = _three_outputs(x, y)
        got = runner(x, y)
        again = runner(x, y)
        for g, g2, w in zip(got, again, want):
            torch.testing.assert_close(g, w, **TOL)
            assert g.shape == w.shape and torch.equal(g, g2)
            assert g.numel() == 0 or g.data_ptr() != g2.data_ptr()
        public = runner._c
        runner._c = None  # the public IOBinding calls
        try:
            slow = runner(x, y)
        finally:
            runner._c = public
        for g, s in zip(got, slow):
            assert torch.equal(g, s)


def test_the_onnx_registry_is_built_once_and_each_export_gets_its_own_copy(monkeypatch):
    """torch.onnx.export rebuilds its ATen -> ONNX registry on every call (about 1 s);
    arbiter's exports build it once per process and hand each export a copy."""
    from torch.onnx._internal.exporter import _registration

    from arbiter.backends import _onnx_export as ortmod

    built = []
    real = _registration.ONNXRegistry.__dict__["from_torchlib"]

    def counting(cls, *a, **k):
        built.append(1)
        return real.__func__(cls, *a, **k)

    monkeypatch.setattr(_registration.ONNXRegistry, "from_torchlib", classmethod(counting))
    monkeypatch.setattr(ortmod, "_REGISTRIES", {})
    seen = []
    with ortmod._registry_once():
        for _ in range(3):
            seen.append(_registration.ONNXRegistry.from_torchlib())
    assert len(built) == 1
    assert seen[0] is not seen[1] and seen[0].functions is not seen[1].functions
    name = next(iter(seen[0].functions))
    seen[0].functions[name].append("changed")  # an exporter adding a translation
    assert seen[1].functions[name][-1] != "changed"
    with ortmod._registry_once():
        again = _registration.ONNXRegistry.from_torchlib()
    assert len(built) == 1 and again.functions[name][-1] != "changed"
    # outside the block, torch's own method again; exports still match eager
    assert _registration.ONNXRegistry.__dict__["from_torchlib"].__func__ is counting
    a, b = torch.randn(5, 3), torch.randn(5, 4)
    for _ in range(2):
        got = OnnxRuntime().compile(trace(_mm_t, a, b), [a, b])(a, b)[0]
        torch.testing.assert_close(got, _mm_t(a, b)[0], **TOL)


def test_overlapping_exports_leave_torch_its_own_registry_method():
    """Two exports overlapping in time (a compile left running past compile_timeout_s)
    each put the shared registry in place; whichever ends last, torch's own method is
    what stays."""
    from torch.onnx._internal.exporter import _registration

    from arbiter.backends import _onnx_export as ortmod

    own = _registration.ONNXRegistry.__dict__["from_torchlib"]
    first, second = ortmod._registry_once(), ortmod._registry_once()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    second.__exit__(None, None, None)
    assert _registration.ONNXRegistry.__dict__["from_torchlib"] is own
