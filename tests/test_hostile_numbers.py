"""Numbers that differ from eager on non-finite inputs (issue 14, item 4).

OpenVINO computes exp(NaN) as inf and maximum(NaN, 0) as 0 (eager: NaN); under cpu_all
that went unnoticed. `arbiter probe` now feeds NaN, +-inf, -0.0 and huge values, and the
backends refuse (validators, option `exact_nonfinite: true`) the ops that lose or invent
a NaN, or take them and check each call's inputs (`exact_nonfinite: guard`, OpenVINO's
default): a call with NaN or inf in an input runs in eager.
"""
from __future__ import annotations

import math

import pytest
import torch

import arbiter
from arbiter.probe.opinfo import NONFINITE_KINDS, nonfinite_inputs, probe_sample

from conftest import trace

NAN = math.nan


def _parts(be):
    return [p for g in be.report(advice=False).graphs for p in g.partitions]


# -- the special inputs ------------------------------------------------------------------------
def test_nonfinite_inputs_hold_each_kind_and_are_deterministic():
    x, y, i = torch.randn(4, 6), torch.randn(4, 6), torch.arange(5)
    a = nonfinite_inputs([x, y, i])
    b = nonfinite_inputs([x, y, i])
    assert all(torch.equal(p, q) or (p.isnan() == q.isnan()).all() for p, q in zip(a, b))
    for t in a[:2]:
        assert t.isnan().any() and t.isposinf().any() and t.isneginf().any()
        assert ((t == 0) & t.signbit()).any()  # -0.0
        assert (t.abs() == torch.finfo(t.dtype).max / 4).any()
    assert torch.equal(a[2], i)  # integers untouched
    assert not torch.equal(a[0].isnan(), a[1].isnan())  # shifted: NaN meets a number
    assert torch.equal(x, x.clone()) and not x.isnan().any()  # inputs are copies
    only = nonfinite_inputs([x, y], ("nan",), first_only=True)
    assert only[0].isnan().any() and not only[1].isnan().any()
    assert nonfinite_inputs([i]) is None
    assert set(NONFINITE_KINDS) == {"nan", "inf", "zero", "huge"}


# -- the probe judges them ---------------------------------------------------------------------
class _NanDropper(arbiter.Backend):
    """Computes like eager, except that every NaN in the outputs becomes 0 (what
    OpenVINO's relu and maximum do)."""

    name = "nan_dropper"

    def compile(self, gm, example_inputs):
        def fn(*args):
            return [torch.nan_to_num(t, nan=0.0) if t.is_floating_point() else t
                    for t in gm(*args)]
        return fn


class _InfToHuge(arbiter.Backend):
    """Like eager, except that +-inf outputs become +-3e38."""

    name = "inf_to_huge"

    def compile(self, gm, example_inputs):
        def fn(*args):
            return [torch.nan_to_num(t, nan=NAN) if t.is_floating_point() else t
                    for t in gm(*args)]
        return fn


def test_probe_fails_a_backend_that_drops_nan():
    x = torch.randn(4, 4)
    gm = trace(lambda x: (torch.relu(x) * 2,), x)
    status, stage, reason, _ = probe_sample(_NanDropper(), gm, [x])
    assert (status, stage) == ("failed", "nonfinite") and "NaN inputs" in reason


def test_probe_reports_but_passes_differences_that_need_inf():
    x = torch.randn(4, 4)
    gm = trace(lambda x: (torch.exp(x),), x)
    status, stage, reason, _ = probe_sample(_InfToHuge(), gm, [x])
    assert status == "passed" and "not refused" in reason and "+-inf inputs" in reason


def test_probe_passes_eager_itself():
    x = torch.randn(4, 4)
    gm = trace(lambda x: (torch.maximum(x, torch.zeros_like(x)), torch.exp(x)), x)

    class Same(arbiter.Backend):
        name = "same"

        def compile(self, gm, example_inputs):
            return gm

    assert probe_sample(Same(), gm, [x])[:3] == ("passed", "", "")


def test_probe_openvino_relu_on_nan():
    """The real finding: OpenVINO's relu(NaN) is 0."""
    pytest.importorskip("openvino")
    be = arbiter.get_backend_class("openvino")()
    x = torch.randn(4, 4)
    gm = trace(lambda x: (torch.relu(x),), x)
    status, stage, reason, _ = probe_sample(be, gm, [x])
    assert (status, stage) == ("failed", "nonfinite") and "NaN" in reason


# -- OpenVINO: what eager says, and the report says why ------------------------------------------
@pytest.mark.parametrize("fn,op", [
    (lambda x: torch.exp(x) * 2.0 + 1.0, "aten.exp"),
    (lambda x: torch.maximum(x * 2.0, torch.zeros_like(x)) + 1.0, "aten.maximum"),
    (lambda x: torch.relu(x * 2.0) + 1.0, "aten.relu"),
    (lambda x: torch.clamp(x * 2.0, -1.0, 1.0) + 1.0, "aten.clamp"),
    (lambda x: torch.where(x * 2.0 > 0, x, 0.0) + 1.0, "aten.gt"),
], ids=["exp", "maximum", "relu", "clamp", "gt"])
def test_openvino_keeps_eagers_nan(fn, op, fresh_dynamo):
    """exp(NaN) was inf and maximum(NaN, 0) was 0 on OpenVINO, unnoticed. With
    `exact_nonfinite: true` the op is refused, and the report says why."""
    pytest.importorskip("openvino")
    x = torch.tensor([[NAN, 1.0, -2.0, math.inf], [0.5, -math.inf, -0.0, 3.0]])
    be = arbiter.Arbiter({"backends": [{"name": "openvino",
                                        "options": {"exact_nonfinite": True}}],
                          "min_block_size": 1})
    out = torch.compile(fn, backend=be)(x)
    torch.testing.assert_close(out, fn(x), equal_nan=True)
    text = str(be.report())
    assert op in text and "exact_nonfinite" in text
    assert any(p.backend == "openvino" for p in _parts(be))  # the rest still runs there


@pytest.mark.parametrize("fn,op", [
    (lambda x: torch.exp(x) * 2.0 + 1.0, "aten.exp"),
    (lambda x: torch.relu(x * 2.0) + 1.0, "aten.relu"),
    (lambda x: torch.where(x * 2.0 > 0, x, 0.0) + 1.0, "aten.gt"),
], ids=["exp", "relu", "gt"])
def test_openvino_guard_runs_nonfinite_calls_in_eager(fn, op, fresh_dynamo):
    """The default `exact_nonfinite: guard`: the whole function runs on OpenVINO; a call
    whose input holds NaN or inf runs in eager (eager's answer), and the report counts it;
    finite calls stay on OpenVINO."""
    pytest.importorskip("openvino")
    be = arbiter.Arbiter({"backends": ["openvino"], "min_block_size": 1})
    compiled = torch.compile(fn, backend=be)
    finite = torch.randn(2, 4)
    for _ in range(3):  # past the first calls' checks: the steady state (Piece's short path)
        torch.testing.assert_close(compiled(finite), fn(finite))
    (piece,) = list(be._pieces)
    assert piece._fast is not None and piece._fast[2]  # the short path, inputs guarded
    bad = torch.tensor([[NAN, 1.0, -2.0, math.inf], [0.5, -math.inf, -0.0, 3.0]])
    torch.testing.assert_close(compiled(bad), fn(bad), equal_nan=True)
    torch.testing.assert_close(compiled(finite * 3), fn(finite * 3))
    parts = _parts(be)
    assert [p.backend for p in parts] == ["openvino"]
    assert op in " ".join(parts[0].nonfinite_guard) and parts[0].nonfinite_eager_calls == 1
    assert "NaN/inf" in str(be.report())


def test_openvino_guard_off_loses_the_nan(fresh_dynamo):
    """What the guard prevents, shown with it off: OpenVINO's relu(NaN) is 0."""
    pytest.importorskip("openvino")
    fn = lambda x: torch.relu(x * 2.0) + 1.0  # noqa: E731
    be = arbiter.Arbiter({"backends": [{"name": "openvino",
                                        "options": {"exact_nonfinite": False}}],
                          "min_block_size": 1})
    compiled = torch.compile(fn, backend=be)
    compiled(torch.tensor([0.5, 1.0]))  # the first call, checked against eager: finite
    out = compiled(torch.tensor([NAN, 1.0]))
    assert not torch.isnan(out[0])  # eager: NaN
    assert not _parts(be)[0].nonfinite_guard


def test_all_finite_check():
    from arbiter.run.checks.calls import all_finite

    big = torch.full((8,), 3e38)  # finite, but its sum overflows: checked element-wise
    assert all_finite([big, torch.arange(3), (torch.ones(2),)])
    assert not all_finite([torch.ones(2), [torch.tensor([1.0, NAN])]])
    assert not all_finite([torch.tensor([-math.inf, 1.0]).half()])
    assert all_finite([torch.empty(0), 3.0, None])


def test_openvino_exact_nonfinite_off_runs_them_there(fresh_dynamo):
    pytest.importorskip("openvino")
    fn = lambda x: torch.relu(x * 2.0) + 1.0  # noqa: E731
    be = arbiter.Arbiter({"backends": [{"name": "openvino",
                                        "options": {"exact_nonfinite": False}}],
                          "min_block_size": 1})
    x = torch.randn(4, 4)
    torch.testing.assert_close(torch.compile(fn, backend=be)(x), fn(x))
    assert [p.backend for p in _parts(be)] == ["openvino"]


def test_validators_refuse_only_floating_inputs():
    pytest.importorskip("openvino")
    cls = arbiter.get_backend_class("openvino")
    be = cls(cls.Options(exact_nonfinite=True))
    gm = trace(lambda a, b: (torch.maximum(a, b), torch.maximum(a.float(), b.float())),
               torch.arange(4), torch.arange(4))
    maxes = [n for n in gm.graph.nodes if n.op == "call_function"
             and "maximum" in str(n.target)]
    check = be.validators["aten.maximum"]
    assert check(maxes[0]) is None and "maximum(NaN, 0) is 0" in check(maxes[1])


def test_onnxruntime_sign_of_nan(fresh_dynamo):
    """ONNX Runtime's sign(NaN) is NaN; eager's is 0."""
    pytest.importorskip("onnxruntime")
    fn = lambda x: torch.sign(x * 2.0) + 1.0  # noqa: E731
    x = torch.tensor([NAN, 1.0, -2.0, 0.0])
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "min_block_size": 1})
    torch.testing.assert_close(torch.compile(fn, backend=be)(x), fn(x), equal_nan=True)
    assert "sign(NaN)" in str(be.report())
