"""Pins and excludes (issue 15, item 4): a pin wins over min_block_size, or the report
says why it could not; a pin or exclude naming an op that never occurs after lowering
is a warning naming the ops that do; the README's example config does what it says."""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

import arbiter
from arbiter.cli import examples
from arbiter.plan.partition import partition_graph
from arbiter.plan.rules import unmatched_message
from conftest import TWO, check_plan_invariants, run_in_plan_order, trace

ROOT = Path(__file__).resolve().parent.parent


def _on(rep, op: str) -> set[str]:
    """Backends that run (or are planned to run) the nodes of ``op``."""
    out = set()
    for g in rep.graphs:
        parts = {p.id: p for p in g.partitions}
        for n in g.graph:
            if n.op.startswith(op):
                p = parts[n.partition]
                out.add(p.backend if p.compiled else p.planned_backend)
    return out


def test_pin_wins_over_min_block_size_and_runs_right(fresh_dynamo):
    """Before: with min_block_size 2 a pin of layer norm to Inductor ran 0 nodes and the
    report said nothing (a lone pinned node is a partition of 1)."""
    m, inputs = examples.encoder_block()
    m.eval()
    cfg = {**TWO, "min_block_size": 3, "pin": {"aten.native_layer_norm": "inductor"}}
    be = arbiter.Arbiter(cfg)
    with torch.no_grad():
        want = m(*inputs)
        got = torch.compile(m, backend=be)(*inputs)
        x2 = torch.randn_like(inputs[0])     # inputs it was not compiled on
        torch.testing.assert_close(torch.compile(m, backend=be)(x2), m(x2),
                                   rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    rep = be.report()
    assert _on(rep, "aten.native_layer_norm") == {"inductor"}
    rule = rep.graphs[0].rules[0]
    assert (rule.kind, rule.nodes, rule.applied, rule.why_not) == ("pin", 2, 2, {})
    small = [p for p in rep.graphs[0].partitions if p.backend == "inductor"]
    assert small and all(p.nodes < 3 for p in small)  # kept although below min_block_size
    assert rep.warnings == []


def test_pinned_nodes_alone_in_small_runs_end_the_rounds():
    """Every small run holds only pinned nodes: the rounds stop (no endless loop), and
    unpinned small runs are still demoted."""
    def f(x):
        a = torch.relu(x)
        b = torch.sigmoid(a)      # pinned, alone between relu and tanh
        c = torch.tanh(b)
        return torch.exp(c)

    gm = trace(f, torch.randn(4))
    be = arbiter.Arbiter({**TWO, "min_block_size": 8, "pin": {"aten.sigmoid": "inductor"}},
                         dry_run=True)
    plan = partition_graph(gm, be.planner.table, 8)
    check_plan_invariants(plan, gm)
    assert [(p.backend, [n.target.__name__.split(".")[0] for n in p.nodes])
            for p in plan.partitions] == [("eager", ["relu"]), ("inductor", ["sigmoid"]),
                                          ("eager", ["tanh", "exp"])]
    x = torch.randn(4)
    out = run_in_plan_order(plan, gm, x)
    torch.testing.assert_close(out[0] if isinstance(out, (list, tuple)) else out, f(x))


def test_pin_the_backend_refuses_is_reported_with_why(make_backend, fresh_dynamo):
    make_backend("small", ["aten.relu.default", "aten.add.Tensor"])
    cfg = {"backends": ["small"], "min_block_size": 1, "pin": {"aten.mul.Tensor": "small"}}

    def f(x):
        return torch.relu(x) * 2 + 1

    be = arbiter.Arbiter(cfg, dry_run=True)
    torch.compile(f, backend=be)(torch.randn(3))
    rep = be.report()
    rule = rep.graphs[0].rules[0]
    assert (rule.nodes, rule.applied) == (1, 0)
    (why, n), = rule.why_not.items()
    assert n == 1 and why.startswith("small refused: aten.mul.Tensor is not in the small manifest")
    assert any(w.startswith("pin aten.mul.Tensor -> small: 0 of 1 node(s)") and "refused" in w
               for w in rep.warnings)
    assert "warning: pin aten.mul.Tensor -> small" in str(rep)


def test_rules_naming_no_lowered_op_warn_once_with_the_ops_there(fresh_dynamo):
    """Before: the README pinned aten.softmax.int (lowered: aten._softmax.default) and
    excluded aten.gelu while decomposing it; neither applied, silently."""
    m, inputs = examples.encoder_block()
    m.eval()
    cfg = {**TWO, "pin": {"aten.softmax.int": "inductor"}, "exclude_ops": ["aten.gelu"],
           "decompositions": ["aten.gelu"]}
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        be = arbiter.Arbiter(cfg, dry_run=True)
        compiled = torch.compile(m, backend=be)
        compiled(*inputs)
        compiled(inputs[0][:1])   # a recompile: no second warning
    ours = [w for w in caught if "arbiter:" in str(w.message)]
    assert len(ours) == 2, [str(w.message) for w in caught]
    pin, excl = (str(w.message) for w in ours)
    assert "pin aten.softmax.int -> inductor applies to no node" in pin
    assert "did you mean aten._softmax?" in pin and "aten.native_layer_norm" in pin
    assert "exclude_ops aten.gelu" in excl and "decomposed before partitioning" in excl
    # pointing at the user's line, not at arbiter's or Dynamo's
    assert all(Path(w.filename).name == "test_pins.py" for w in ours)
    rep = be.report()
    assert len(rep.warnings) == 2 and "did you mean aten._softmax?" in rep.warnings[0]


def test_unmatched_message_lists_the_ops_there():
    msg = unmatched_message("pin", "aten.softmax.int", "inductor",
                            ["aten._softmax.default", "aten.addmm.default"])
    assert msg.endswith("did you mean aten._softmax? Ops there: aten._softmax, aten.addmm")


class _Readme(nn.Module):
    """Softmax, GELU and SiLU: what the README's example config names."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        h = torch.softmax(self.a(x), dim=-1)
        return nn.functional.silu(self.b(nn.functional.gelu(h))) + x


def _readme_config() -> dict:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Config\n\n```yaml\n(.*?)```", text, re.S).group(1)
    return yaml.safe_load(block)


@pytest.mark.parametrize("accuracy", [False, True])
def test_readme_example_config_does_what_it_says(accuracy, fresh_dynamo):
    """The README's config as printed. Its commented `accuracy` line, uncommented, lets a
    faster lower-precision variant run when within the tolerance (which one wins is
    timed): with it the outputs are held to that tolerance; without it, to float32's."""
    cfg = _readme_config()
    assert cfg["pin"] and cfg["exclude_ops"] and cfg["decompositions"]
    assert "accuracy" not in cfg  # opt-in, a comment there: pasted, it lowers nothing
    tol = dict(rtol=1e-4, atol=1e-5)
    if accuracy:  # the commented line, uncommented
        cfg["accuracy"] = {"atol": 1.0e-2}
        tol = dict(rtol=0.0, atol=1.0e-2)
    m = _Readme().eval()
    x = torch.randn(4, 16)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        be = arbiter.Arbiter(cfg)
        got = torch.compile(m, backend=be)(x)
        x2 = torch.randn(4, 16)
        got2 = torch.compile(m, backend=be)(x2)
    torch.testing.assert_close(got, m(x), **tol)
    torch.testing.assert_close(got2, m(x2), **tol)
    if accuracy:  # the rules below are about the plan, whichever precision won
        return
    assert not [w for w in caught if "arbiter:" in str(w.message)]
    rep = be.report()
    assert rep.warnings == []
    (pin_op, backend), = cfg["pin"].items()
    assert _on(rep, pin_op) == {backend}                       # the pin holds
    for op in cfg["exclude_ops"]:
        assert _on(rep, op) == {"eager"}                       # excluded: eager runs it
    for op in cfg["decompositions"]:
        assert _on(rep, op) == set()                           # decomposed away
    rules = {(r.kind, r.op): r for r in rep.graphs[0].rules}
    assert all(r.nodes and r.applied == r.nodes for r in rules.values())


@pytest.mark.parametrize("op", ["aten.softmax.int", "aten.softmax"])
def test_readme_old_pin_would_have_warned(op, fresh_dynamo):
    """The check above can fail: the README's old pin names no lowered op."""
    cfg = {**_readme_config(), "pin": {op: "inductor"}}
    with torch.no_grad(), pytest.warns(UserWarning, match="did you mean aten._softmax"):
        torch.compile(_Readme().eval(), backend=arbiter.Arbiter(cfg, dry_run=True))(
            torch.randn(2, 16))


def _rule_warnings(cfg: dict, backward: bool) -> list[warnings.WarningMessage]:
    """Warnings of a forward with gradients on (a training graph), with or without the
    backward call."""
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(m, backend=arbiter.Arbiter({**TWO, **cfg}, dry_run=True))(
            torch.randn(2, 8))
        if backward:
            out.sum().backward()
    return [w for w in caught if "arbiter:" in str(w.message)]


@pytest.mark.parametrize("backward", [False, True])
def test_a_rule_naming_no_op_warns_without_a_backward_too(backward, fresh_dynamo):
    """Before: with gradients on and no backward call the forward graph waited for its
    backward graph, which never compiled: no warning."""
    ours = _rule_warnings({"pin": {"aten.softmax": "inductor"}}, backward)
    assert len(ours) == 1, [str(w.message) for w in ours]  # once, with or without backward
    msg = str(ours[0].message)
    assert "pin aten.softmax -> inductor applies to no node" in msg
    assert "(forward) and its backward" in msg  # judged at the forward, its backward seen
    assert "aten.threshold_backward" in msg     # the ops listed include the backward's
    assert Path(ours[0].filename).name == "test_pins.py"


@pytest.mark.parametrize("backward", [False, True])
def test_a_rule_naming_a_backward_op_does_not_warn(backward, fresh_dynamo):
    """The forward has no threshold_backward; its backward graph (made by AOTAutograd
    with the forward, compiled at the first backward) does: no warning either way."""
    assert _rule_warnings({"pin": {"aten.threshold_backward": "inductor"},
                           "exclude_ops": ["aten.threshold_backward"]}, backward) == []
