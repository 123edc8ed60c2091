"""The config's `random:`: `eager` (default) keeps random ops in place, bit-equal to
eager's RNG stream; `backend` gives them to backends that draw their own (Inductor):
tested by keep rate, scaling and the backward's use of the forward's mask, not equality."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import arbiter
from arbiter.plan.capability import NO_RANDOM, RANDOM

P = 0.3


class Drop(torch.nn.Module):
    def forward(self, x):
        return F.dropout(torch.relu(x) + 1, P, training=True) * 3


def _placed(be, op="aten.native_dropout.default"):
    report = be.report(advice=False)
    fwd = [g for g in report.graphs if g.kind in ("forward", "inference")][0]
    return [p for p in fwd.partitions if op in p.ops], fwd


def test_random_backend_dropout_on_inductor_by_rate_and_scaling(fresh_dynamo):
    torch.manual_seed(0)
    x = torch.randn(512, 400, requires_grad=True)
    be = arbiter.Arbiter({"backends": ["onnxruntime", "inductor"], "min_block_size": 1,
                          "random": "backend", "verify": {"mode": "every"},
                          "against_eager": "off"})
    compiled = torch.compile(Drop(), backend=be)
    out = compiled(x)
    out.sum().backward()
    kept = out != 0
    rate = 1 - kept.float().mean().item()
    assert abs(rate - P) < 0.01  # 204,800 draws: 10 standard deviations
    want = (torch.relu(x) + 1) * 3 / (1 - P)
    torch.testing.assert_close(out[kept], want[kept].detach())
    # the backward reads the forward's own mask (saved by Inductor, used by ONNX Runtime)
    torch.testing.assert_close(x.grad, kept.float() * 3 / (1 - P) * (x > 0).float())
    again = compiled(x)
    changed = ((again != 0) != kept).float().mean().item()
    assert abs(changed - 2 * P * (1 - P)) < 0.02  # a fresh, independent mask per call
    parts, fwd = _placed(be)
    assert [p.backend for p in parts] == ["inductor"]
    assert parts[0].verify_checks == 0  # nothing to compare with eager's draw
    assert all(p.verify_checks > 0 for p in fwd.partitions if p not in parts)


def test_random_eager_default_is_bit_equal_to_eager(fresh_dynamo):
    x = torch.randn(64, 32)
    be = arbiter.Arbiter({"backends": ["onnxruntime", "inductor"], "min_block_size": 1})
    assert be.config.random == "eager"
    compiled = torch.compile(Drop(), backend=be)
    for seed in (0, 1):
        torch.manual_seed(seed)
        got = compiled(x)
        torch.manual_seed(seed)
        assert torch.equal(got, Drop()(x))
    # the dropout is split (arbiter.decompose.split_dropout): its mask drawn in eager,
    # the multiplications on ONNX Runtime (tests/test_dropout.py)
    parts, fwd = _placed(be, "arbiter.dropout_mask.default")
    assert [p.backend for p in parts] == ["eager"]
    op = next(o for o in fwd.ops if o.op == "arbiter.dropout_mask.default")
    assert op.refused["onnxruntime"] == RANDOM
    assert not any(o.op == "aten.native_dropout.default" for o in fwd.ops)
    assert [p.backend for p in fwd.partitions] == ["eager", "onnxruntime"]


def test_random_backend_without_a_drawing_backend_stays_eager(fresh_dynamo):
    """ONNX Runtime does not draw its own: the dropout stays in eager, and the report
    says why."""
    x = torch.randn(64, 32)
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "min_block_size": 1,
                          "random": "backend"})
    compiled = torch.compile(Drop(), backend=be)
    torch.manual_seed(3)
    got = compiled(x)
    torch.manual_seed(3)
    assert torch.equal(got, Drop()(x))
    parts, fwd = _placed(be)
    assert [p.backend for p in parts] == ["eager"]
    op = next(o for o in fwd.ops if o.op == "aten.native_dropout.default")
    assert op.refused["onnxruntime"] == NO_RANDOM


def test_random_must_be_eager_or_backend():
    with pytest.raises(arbiter.ConfigError, match="random"):
        arbiter.Arbiter({"backends": ["onnxruntime"], "random": "inductor"})
