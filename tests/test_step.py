"""A training graph's compiled plan against Dynamo's own graph in eager (arbiter/run/step.py):
chosen on the user's calls, each call run once, the choice in the report."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

import arbiter
from arbiter.report.text import render
from arbiter.run.step import COMPILED, DYNAMO, TRIAL_SAMPLES, WAIT_CALLS, StepChoice


def _record(kind: str, backend: str):
    part = SimpleNamespace(id=0, backend=backend)
    return SimpleNamespace(kind=kind, plan=SimpleNamespace(partitions=[part]),
                           running=lambda p: backend, step=None)


def _fn(x, w1, w2):
    return (x @ w1).relu() @ w2


class _Counted:
    """``_fn``, counting its calls, sleeping ``sleep_s`` in each forward."""

    def __init__(self, sleep_s: float = 0.0):
        self.calls = 0
        self.sleep_s = sleep_s

    def __call__(self, *args):
        self.calls += 1
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return _fn(*args)


def _steps(choice, n: int, w1, w2, seed: int = 0):
    """``n`` training calls of ``choice`` (forward, backward); each call's gradients."""
    torch.manual_seed(seed)
    grads = []
    for _ in range(n):
        x = torch.randn(4, 8)
        w1.grad = w2.grad = None
        choice(x, w1, w2).pow(2).sum().backward()
        grads.append((w1.grad.clone(), w2.grad.clone()))
    return grads


def _weights():
    torch.manual_seed(1)
    return torch.randn(8, 16, requires_grad=True), torch.randn(16, 4, requires_grad=True)


def _choice(compiled, gm, backend="onnxruntime", trial=True, backward=True):
    records = [_record("forward", backend)] + ([_record("backward", backend)] if backward
                                               else [])
    return StepChoice(compiled, gm, records, {"eager"}, trial=trial, label="test"), records


@pytest.mark.parametrize("slow", [COMPILED, DYNAMO])
def test_the_trial_picks_the_faster_route_running_each_call_once(slow):
    compiled = _Counted(0.03 if slow == COMPILED else 0.0)
    gm = _Counted(0.03 if slow == DYNAMO else 0.0)
    choice, records = _choice(compiled, gm)
    w1, w2 = _weights()
    n = 8 * TRIAL_SAMPLES
    grads = _steps(choice, n, w1, w2)
    rec = choice.record
    fast = DYNAMO if slow == COMPILED else COMPILED
    assert rec.route == fast, rec
    assert rec.samples == TRIAL_SAMPLES
    assert compiled.calls + gm.calls == n  # every call ran once, on one route
    assert gm.calls >= TRIAL_SAMPLES + 1 and compiled.calls >= TRIAL_SAMPLES + 1
    # a call's sample is its own forward and backward: 30 ms of sleep and little else
    # (the weights' backward hooks of earlier calls fire at every later backward: counted
    # once, a sample spanned the steps between)
    assert 30 <= rec.ms[slow] < 55, rec.ms
    assert rec.ms[fast] < 15, rec.ms
    assert all(r.step is rec for r in records)
    # the route chosen runs from then on, alone; every call's gradients are eager's
    before = (compiled.calls, gm.calls)
    _steps(choice, 3, w1, w2)
    after = (compiled.calls, gm.calls)
    assert after[fast == DYNAMO] - before[fast == DYNAMO] == 3
    assert after[fast == COMPILED] == before[fast == COMPILED]
    eager = _steps(_fn, n, *_weights())
    for (a1, a2), (b1, b2) in zip(grads, eager):
        torch.testing.assert_close(a1, b1)
        torch.testing.assert_close(a2, b2)
    # no hook is left on the weights once decided
    assert not choice._handles and not choice._spent


def test_a_plan_whole_in_eager_runs_dynamos_graph_untimed():
    compiled, gm = _Counted(), _Counted()
    choice, _ = _choice(compiled, gm, backend="eager")
    _steps(choice, 3, *_weights())
    assert (compiled.calls, gm.calls) == (1, 2)
    assert choice.record.route == DYNAMO and "whole in eager" in choice.record.reason


def test_no_backward_or_against_eager_off_keeps_the_compiled_plan():
    compiled, gm = _Counted(), _Counted()
    choice, _ = _choice(compiled, gm, backward=False)
    x, (w1, w2) = torch.randn(4, 8), _weights()
    for _ in range(WAIT_CALLS + 2):
        choice(x, w1, w2)
    assert gm.calls == 0 and choice.record.route == COMPILED
    assert "no backward" in choice.record.reason

    compiled, gm = _Counted(), _Counted()
    choice, _ = _choice(compiled, gm, trial=False)
    _steps(choice, 4, w1, w2)
    assert gm.calls == 0 and choice.record.route == COMPILED
    assert "against_eager off" in choice.record.reason


def test_a_step_planned_in_eager_runs_the_module_and_the_report_says_so():
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    be = arbiter.Arbiter({"backends": ["eager"], "cache": {"enabled": False}})
    compiled = torch.compile(model, backend=be)
    torch.manual_seed(0)
    xs = [torch.randn(4, 8) for _ in range(3)]
    got = []
    for x in xs:
        model.zero_grad()
        out = compiled(x)
        out.pow(2).sum().backward()
        got.append((out.grad_fn, [p.grad.clone() for p in model.parameters()]))
    # the first call ran AOTAutograd's graphs; the next ones the module's own ops
    assert "CompiledFunction" in type(got[0][0]).__name__
    assert "CompiledFunction" not in type(got[-1][0]).__name__
    for x, (_, grads) in zip(xs, got):
        model.zero_grad()
        model(x).pow(2).sum().backward()
        for a, p in zip(grads, model.parameters()):
            torch.testing.assert_close(a, p.grad)
    report = be.report(advice=False)
    kinds = {g.kind: g for g in report.graphs}
    assert kinds["forward"].step.route == kinds["backward"].step.route == DYNAMO
    assert "step: Dynamo's graph in eager" in " ".join(render(report).split())
    # inference graphs have no step
    with torch.no_grad():
        compiled(xs[0])
    assert be.report(advice=False).graphs[-1].step is None
    torch._dynamo.reset()


def test_the_trial_on_a_real_compiled_step_leaves_eagers_gradients_and_no_hooks(monkeypatch):
    """The trial through AOTAutograd's function and Dynamo's graph (the plan forced off
    the untimed path): every step's gradients are eager's, each route timed
    ``TRIAL_SAMPLES`` times, and no hook stays on the weights once decided."""
    import arbiter.run.step as step

    monkeypatch.setattr(step, "all_eager", lambda record, inline: False)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    ref.load_state_dict(model.state_dict())
    be = arbiter.Arbiter({"backends": ["eager"], "cache": {"enabled": False}})
    compiled = torch.compile(model, backend=be)
    torch.manual_seed(1)
    for _ in range(4 * TRIAL_SAMPLES + 6):
        x = torch.randn(4, 8)
        model.zero_grad()
        ref.zero_grad()
        compiled(x).pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
        for a, b in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(a.grad, b.grad)
    fw = next(g for g in be.report(advice=False).graphs if g.kind == "forward")
    assert fw.step.route in (COMPILED, DYNAMO), fw.step
    assert fw.step.samples == TRIAL_SAMPLES and set(fw.step.ms) == {COMPILED, DYNAMO}
    assert all(not p._backward_hooks for p in model.parameters())
    torch._dynamo.reset()
