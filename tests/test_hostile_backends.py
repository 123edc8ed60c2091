"""Stuck and racing backends (issue 14, item 5).

* `compile_timeout_s`: a backend whose compile never returns (it waits on an event that
  is only set when the test ends: no test here depends on how long anything takes)
  blocks the first call no longer than the timeout; the partition falls back and the
  report says why.
* Eight threads making the first call at once under `cpu_all`.
"""
from __future__ import annotations

import logging
import threading

import pytest
import torch

import arbiter

from conftest import TWO

OPS = ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"]


def f(x):
    return torch.relu(x) * 2 + x


@pytest.fixture
def release():
    """An event the hanging compiles wait on; set when the test ends, so their threads
    finish."""
    ev = threading.Event()
    yield ev
    ev.set()


def _parts(be):
    return [p for g in be.report().graphs for p in g.partitions]


def test_hanging_compile_times_out_and_falls_back(make_backend, fresh_dynamo, release, caplog):
    """Before: no timeout anywhere; a compile hanging 120 s blocked the first call
    121 s, holding Dynamo's compile lock."""
    entered = threading.Event()

    def compile(self, gm, example_inputs):
        entered.set()
        release.wait()  # hangs until the test is over
        return gm

    make_backend("stuck", OPS, compile=compile)
    good = make_backend("good", OPS)
    be = arbiter.Arbiter({"backends": ["stuck", "good"], "min_block_size": 1,
                          "compile_timeout_s": 0.5})
    x = torch.randn(4, 4)
    with caplog.at_level(logging.WARNING):
        out = torch.compile(f, backend=be)(x)
    torch.testing.assert_close(out, f(x))
    assert entered.is_set()
    (p,) = _parts(be)
    assert p.backend == "good"
    (fb,) = p.fallbacks
    assert (fb.from_backend, fb.to_backend, fb.stage) == ("stuck", "good", "compile")
    assert "CompileTimeout" in fb.reason and "compile_timeout_s" in fb.reason
    assert len(good.compiled) == 1
    # later calls do not wait again
    torch.testing.assert_close(torch.compile(f, backend=be)(x + 1), f(x + 1))


def test_compile_error_in_the_helper_thread_is_reported_as_itself(make_backend, fresh_dynamo):
    def compile(self, gm, example_inputs):
        raise ValueError("injected: cannot compile")

    make_backend("broken", OPS, compile=compile)
    be = arbiter.Arbiter({"backends": ["broken"], "min_block_size": 1,
                          "compile_timeout_s": 60})
    x = torch.randn(4, 4)
    torch.testing.assert_close(torch.compile(f, backend=be)(x), f(x))
    (fb,) = _parts(be)[0].fallbacks
    assert fb.reason.startswith("ValueError: injected: cannot compile")


def test_compile_timeout_keeps_grad_mode_and_context(make_backend, fresh_dynamo):
    """The helper thread sees the caller's grad mode (a backend may trace differently
    without it) and the caller's context (the cache's record of entries used)."""
    seen = {}

    def compile(self, gm, example_inputs):
        seen["grad"] = torch.is_grad_enabled()
        seen["thread"] = threading.current_thread().name
        return gm

    make_backend("probe_mode", OPS, compile=compile)
    be = arbiter.Arbiter({"backends": ["probe_mode"], "min_block_size": 1,
                          "compile_timeout_s": 60})
    x = torch.randn(4, 4)
    with torch.no_grad():
        torch.compile(f, backend=be)(x)
    assert seen == {"grad": False, "thread": "arbiter-compile-probe_mode"}


def test_compile_timeout_with_real_backends_and_training(fresh_dynamo):
    """Real compiles (ONNX Runtime, Inductor) through the helper thread, forward and
    backward, match eager."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    ref.load_state_dict(model.state_dict())
    be = arbiter.Arbiter(dict(TWO, compile_timeout_s=600))
    x = torch.randn(5, 8)
    out = torch.compile(model, backend=be)(x)
    out.sum().backward()
    expected = ref(x)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    parts = _parts(be)
    assert not any(p.fallbacks for p in parts), str(be.report())
    assert {p.backend for p in parts} & {"onnxruntime", "inductor"}


def test_compile_timeout_config_validation():
    with pytest.raises(arbiter.ConfigError, match="compile_timeout_s"):
        arbiter.load_config({"backends": ["eager"], "compile_timeout_s": 0})
    with pytest.raises(arbiter.ConfigError, match="compile_timeout_s"):
        arbiter.load_config({"backends": ["eager"], "compile_timeout_s": True})
