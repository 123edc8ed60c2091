"""Accuracy checks (config `verify`) and output metadata checks (arbiter/run/checks/verify.py)."""
from __future__ import annotations

import math

import pytest
import torch

import arbiter
from arbiter.run.checks.verify import OutputSpec, check_meta, compare, output_specs, tolerance

from conftest import trace

OPS = ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"]


def f(x):
    return torch.relu(x) * 2 + x


def _parts(be):
    return [p for g in be.report().graphs for p in g.partitions]


# -- compare and check_meta ---------------------------------------------------------------
def test_compare_per_dtype_tolerances():
    a = torch.ones(8)
    assert compare([a], [a + 5e-6]).ok  # float32 atol 1e-5
    bad = compare([a], [a + 1e-3])
    assert not bad.ok and math.isclose(bad.max_error, 1e-3, rel_tol=1e-3)
    assert "float32" in bad.detail and "1e-05" in bad.detail
    h = torch.ones(8, dtype=torch.float16)
    assert compare([h], [h + 0.005]).ok  # float16 is looser
    i = torch.arange(8)
    assert compare([i], [i.clone()]).ok
    r = compare([i], [i + 1])
    assert not r.ok and r.max_error == 1.0
    assert not compare([torch.tensor([True])], [torch.tensor([False])]).ok


def test_compare_nan_inf_and_overrides():
    e = torch.tensor([float("nan"), float("inf"), 1.0])
    assert compare([e], [e.clone()]).ok
    assert not compare([e], [torch.tensor([0.0, float("inf"), 1.0])]).ok  # nan vs number
    assert not compare([e], [torch.tensor([float("nan"), -float("inf"), 1.0])]).ok
    a = torch.ones(4)
    assert compare([a], [a + 1e-3], {"float32": (0.0, 1e-2)}).ok
    assert tolerance(torch.int64) == (0.0, 0.0)


def test_compare_shape_dtype_count():
    a = torch.ones(2, 2)
    assert not compare([a], [a, a]).ok
    assert "expected float32(2, 2)" in compare([a], [a.double()]).detail
    assert not compare([a], [a[:1]]).ok
    assert compare([torch.empty(0, 3)], [torch.empty(0, 3)]).ok  # zero-size


def test_check_meta():
    gm = trace(lambda x: (x.sum(0), x.int()), torch.randn(3, 4))
    specs = output_specs(gm)
    assert specs == [OutputSpec((4,), 1, torch.float32, "cpu"),
                     OutputSpec((3, 4), 2, torch.int32, "cpu")]
    good = [torch.zeros(4), torch.zeros(3, 4, dtype=torch.int32)]
    assert check_meta(good, specs) is None
    assert "traced graph has 2" in check_meta(good[:1], specs)
    assert "shape (3,)" in check_meta([torch.zeros(3), good[1]], specs)
    assert "dtype float64" in check_meta([torch.zeros(4, dtype=torch.float64), good[1]], specs)
    assert "meta" in check_meta([torch.zeros(4, device="meta"), good[1]], specs)
    assert "NoneType" in check_meta(None, specs)


# -- verify in the runtime ----------------------------------------------------------------
def _off_by(delta: float, after: int = 0):
    """A backend whose outputs are off by ``delta`` from call number ``after`` on (a
    call with the very tensors of the call before, as verify's second call on a checked
    call, does not count)."""
    def compile(self, gm, example_inputs):
        calls = [0]
        last: list = []

        def fn(*args):
            if not (last and last[0] is args[0]):
                calls[0] += 1
                last[:] = [args[0]]
            out = list(gm(*args))
            if calls[0] > after:
                out[0] = out[0] + delta
            return out
        return fn
    return compile


def test_verify_first_records_checks_and_error(make_backend, fresh_dynamo):
    make_backend("close", OPS, compile=_off_by(2e-6))
    be = arbiter.Arbiter({"backends": ["close"], "min_block_size": 1,
                          "verify": {"mode": "first"}})
    compiled = torch.compile(f, backend=be)
    for _ in range(3):
        x = torch.randn(4, 4)
        torch.testing.assert_close(compiled(x), f(x))
    (p,) = _parts(be)
    assert p.backend == "close" and not p.fallbacks
    assert p.verify_checks == 1  # `first`: only the first call
    assert 1e-6 < p.verify_max_error < 1e-5


def test_verify_every_n_catches_a_late_fault(make_backend, fresh_dynamo):
    # right for the first 4 calls, wrong from the 5th; every_n 3 checks calls 1, 4, 7
    make_backend("drifts", OPS, compile=_off_by(1.0, after=4))
    good = make_backend("good", OPS)
    be = arbiter.Arbiter({"backends": ["drifts", "good"], "min_block_size": 1,
                          "verify": {"mode": "every", "every_n": 3}})
    compiled = torch.compile(f, backend=be)
    outs = []
    for _ in range(8):
        x = torch.randn(4, 4)
        outs.append(torch.allclose(compiled(x), f(x)))
    # calls 5 and 6 were wrong and unchecked; call 7 was checked, caught, and returned
    # eager's result; call 8 ran on the next backend
    assert outs == [True] * 4 + [False, False] + [True, True]
    (p,) = _parts(be)
    assert p.backend == "good"
    (fb,) = p.fallbacks
    assert (fb.from_backend, fb.to_backend, fb.stage) == ("drifts", "good", "verify")
    assert "max abs error 1" in fb.reason
    assert p.verify_checks == 4  # calls 1, 4, 7 on drifts; call 8 is good's first
    assert p.verify_max_error == pytest.approx(1.0)
    assert len(good.compiled) == 1


def test_verify_tolerance_override_from_config(make_backend, fresh_dynamo):
    make_backend("loose", OPS, compile=_off_by(1e-3))
    x = torch.randn(4, 4)
    strict = arbiter.Arbiter({"backends": ["loose"], "min_block_size": 1,
                              "verify": {"mode": "first"}})
    torch.testing.assert_close(torch.compile(f, backend=strict)(x), f(x))
    assert _parts(strict)[0].backend == "eager"
    torch._dynamo.reset()
    lenient = arbiter.Arbiter({"backends": ["loose"], "min_block_size": 1, "verify": {
        "mode": "first", "tolerances": {"float32": {"rtol": 0, "atol": 1e-2}}}})
    torch.compile(f, backend=lenient)(x)
    (p,) = _parts(lenient)
    assert p.backend == "loose" and p.verify_checks == 1 and not p.fallbacks


def test_verify_tolerance_config_errors():
    with pytest.raises(arbiter.ConfigError, match="unknown dtype 'float31'.*did you mean 'float32'"):
        arbiter.load_config({"backends": ["eager"], "verify": {
            "tolerances": {"float31": {"rtol": 0, "atol": 0}}}})
    with pytest.raises(arbiter.ConfigError, match="verify.tolerances.float32.rtol"):
        arbiter.load_config({"backends": ["eager"], "verify": {
            "tolerances": {"float32": {"rtol": -1, "atol": 0}}}})
    with pytest.raises(arbiter.ConfigError, match="mode"):
        arbiter.load_config({"backends": ["eager"], "verify": {"mode": "sometimes"}})


def test_verify_on_real_backend(fresh_dynamo):
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "min_block_size": 1,
                          "verify": {"mode": "every", "every_n": 1}})
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    with torch.no_grad():
        compiled = torch.compile(model, backend=be)
        for _ in range(2):
            torch.testing.assert_close(compiled(x), model(x))
    (p,) = _parts(be)
    assert p.backend == "onnxruntime" and not p.fallbacks
    assert p.verify_checks == 2 and p.verify_max_error < 1e-5
