"""Config `against_eager`: a policy that does not measure has its plan timed against
eager ATen on a graph's first call; eager runs the graph only when faster by more than
the margin, and the report says so (arbiter/plan/policy.py, arbiter/measure/)."""
from __future__ import annotations

import copy
import time

import pytest
import torch
from torch import nn

import arbiter
from arbiter.errors import ConfigError
from arbiter.plan.partition import Plan
from arbiter.measure.graph import MeasuredGraph
from arbiter.plan.policy import EAGER_MARGIN, ONLY, PRIORITY, Candidate
from arbiter.report.choice import ms

OPS = ["aten.addmm.default", "aten.mm.default", "aten.t.default", "aten.relu.default",
       "aten.threshold_backward.default", "aten.sum.dim_IntList", "aten.view.default",
       "aten.mul.Tensor", "aten.add.Tensor"]
SLEEP_S = 0.003  # per call of the slow backend's partition: 10-100x the graph's eager time


def _slow(self, gm, example_inputs):
    def run(*args):
        time.sleep(SLEEP_S)
        return gm(*args)
    return run


def _wrong_dtype(self, gm, example_inputs):
    return lambda *args: [o.double() if isinstance(o, torch.Tensor) else o
                          for o in gm(*args)]


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _train(model: nn.Module, be, steps: int = 2):
    """Steps of forward + backward through ``be`` beside eager; asserts equal results."""
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend=be)
    for step in range(steps):
        x = torch.randn(4, 8) + step
        out = compiled(x)
        out.pow(2).sum().backward()
        want = ref(x)
        want.pow(2).sum().backward()
        torch.testing.assert_close(out, want)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad)


def test_a_slower_plan_gives_way_to_eager_and_the_report_says_why(make_backend,
                                                                   fresh_dynamo):
    make_backend("slow", OPS, compile=_slow)
    be = arbiter.Arbiter({"backends": ["slow"], "min_block_size": 1})
    _train(_mlp(), be)
    rep = be.report(advice=False)
    assert {g.kind for g in rep.graphs} == {"forward", "backward"}
    for g in rep.graphs:
        assert g.against_eager and g.chosen == ONLY + "eager", str(rep)
        assert {p.backend for p in g.partitions} == {"eager"}
        plan_ms, eager_ms = g.candidates_ms[PRIORITY], g.candidates_ms[ONLY + "eager"]
        assert plan_ms > SLEEP_S * 1e3 > eager_ms
    text = str(rep)
    assert f"timed against eager: eager was measured faster than the plan: " \
           f"{ms(eager_ms)} ms" in text


def test_off_runs_the_plan_untimed(make_backend, fresh_dynamo):
    make_backend("slow", OPS, compile=_slow)
    be = arbiter.Arbiter({"backends": ["slow"], "min_block_size": 1, "against_eager": "off"})
    _train(_mlp(), be)
    for g in be.report(advice=False).graphs:
        assert not g.against_eager and not g.candidates_ms and not g.chosen
        assert "slow" in {p.backend for p in g.partitions}


@pytest.mark.parametrize("setting,timed", [("training", False), ("all", True)])
def test_inference_graphs_are_timed_only_under_all(make_backend, fresh_dynamo, setting,
                                                   timed):
    make_backend("slow", OPS, compile=_slow)
    be = arbiter.Arbiter({"backends": ["slow"], "min_block_size": 1,
                          "against_eager": setting})
    model = _mlp()
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=be)(x), model(x))
    (g,) = be.report(advice=False).graphs
    assert g.kind == "inference" and g.against_eager is timed
    assert {p.backend for p in g.partitions} == ({"eager"} if timed else {"slow"})


def test_a_plan_that_fell_back_while_timed_still_shows_it(make_backend, fresh_dynamo):
    """The plan's backend fails on its first run (wrong dtype): whichever placement is
    installed, the failure is in the report (a partition's fallbacks, or the timed
    placement that was not chosen)."""
    make_backend("liar", OPS, compile=_wrong_dtype)
    be = arbiter.Arbiter({"backends": ["liar"], "min_block_size": 1})
    _train(_mlp(), be)
    for g in be.report(advice=False).graphs:
        shown = [f.from_backend for p in g.partitions for f in p.fallbacks] + \
            [line for lines in g.candidate_fallbacks.values() for line in lines]
        assert any("liar" in s for s in shown), g.kind


def _graph_with(first_ms: float, other_ms: float) -> tuple[MeasuredGraph, list[Candidate]]:
    plan = Plan(torch.fx.GraphModule({}, torch.fx.Graph()), [], {})
    cands = [Candidate(PRIORITY, plan, 1.0, measured_ms=first_ms),
             Candidate(ONLY + "eager", plan, 1.0, measured_ms=other_ms)]
    g = MeasuredGraph.__new__(MeasuredGraph)
    g.candidates, g._margin = cands, EAGER_MARGIN
    return g, cands


@pytest.mark.parametrize("other_ms,kept", [(9.9, 0), (9.75, 0), (9.6, 1), (5.0, 1),
                                           (11.0, 0)])
def test_the_margin_keeps_the_plan_within_noise(other_ms, kept):
    g, cands = _graph_with(10.0, other_ms)
    best = min(cands, key=lambda c: c.measured_ms)
    assert g._held(best) is cands[kept]


def test_a_bad_setting_names_the_key_and_the_choices():
    with pytest.raises(ConfigError) as err:
        arbiter.Arbiter({"backends": ["onnxruntime"], "against_eager": "always"})
    msg = str(err.value)
    assert "against_eager" in msg and "training" in msg
