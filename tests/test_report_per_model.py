"""One report per compiled model (issue 15, item 3): ``arbiter.report_for(compiled)``,
``arbiter.reports()``, ``arbiter.last_report()``, and ``explain`` leaving other compiled
models alone."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import arbiter
from arbiter.run.owner import owner_of

EAGER = {"config": {"backends": ["eager"]}}


class Lin(nn.Module):
    def __init__(self, n: int = 8):
        super().__init__()
        self.fc = nn.Linear(8, n)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2


class Broken(nn.Module):
    """Two Dynamo graphs: a print breaks the graph."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.sigmoid(self.fc(x))
        print("graph break here")
        return y + 1


def fn(x):
    return torch.tanh(x) - 1


def _ops(rep) -> set[str]:
    return {o.op for g in rep.graphs for o in g.ops}


def test_two_models_two_reports(fresh_dynamo):
    x = torch.randn(2, 8)
    with torch.no_grad():
        a = torch.compile(Lin(), backend="arbiter", options=EAGER)
        b = torch.compile(Broken(), backend="arbiter", options=EAGER)
        torch.testing.assert_close(a(x), a._orig_mod(x))
        b(x)
    ra, rb = arbiter.report_for(a), arbiter.report_for(b)
    # the same settings share one Arbiter, yet each model has its own report
    assert arbiter.sessions.backend_of(a) is arbiter.sessions.backend_of(b)
    assert ra.model == "Lin" and [g.model for g in ra.graphs] == ["Lin"]
    assert rb.model == "Broken" and [g.model for g in rb.graphs] == ["Broken", "Broken"]
    assert "aten.relu.default" in _ops(ra) and "aten.sigmoid.default" not in _ops(ra)
    assert "aten.sigmoid.default" in _ops(rb) and "aten.relu.default" not in _ops(rb)
    # graph breaks come from the compile itself (no torch._dynamo.explain, no reset)
    assert ra.graph_breaks.breaks == 0 and ra.graph_breaks.graphs == 1
    assert rb.graph_breaks.breaks == 1
    assert "test_report_per_model.py" in rb.graph_breaks.reasons[0]
    # the model compiled last, and the process-wide view
    assert arbiter.last_report().model == "Broken"
    models = [r.model for r in arbiter.reports()]
    assert models[-2:] == ["Lin", "Broken"]
    # the Arbiter's own report is the process-wide view of its config, graphs labelled
    both = arbiter.sessions.backend_of(a).report()
    assert {g.model for g in both.graphs} >= {"Lin", "Broken"}


def test_instances_share_their_class_graphs(fresh_dynamo):
    """Dynamo reuses a compiled graph for another instance of the class: the second
    model's report shows the graph it runs."""
    x = torch.randn(2, 8)
    with torch.no_grad():
        first = torch.compile(Lin(), backend="arbiter", options=EAGER)
        first(x)
        second = torch.compile(Lin(), backend="arbiter", options=EAGER)
        second(x)
    r1, r2 = arbiter.report_for(first), arbiter.report_for(second)
    assert len(r2.graphs) == len(r1.graphs) == 1
    # the plain module (not compiled) names the same graphs
    assert len(arbiter.report_for(second._orig_mod).graphs) == 1


def test_functions_and_arbiter_instances(fresh_dynamo):
    be = arbiter.Arbiter({"backends": ["eager"]})
    x = torch.randn(2, 8)
    with torch.no_grad():
        f = torch.compile(fn, backend=be)
        m = torch.compile(Lin(), backend=be)
        torch.testing.assert_close(f(x), fn(x))
        m(x)
    assert arbiter.sessions.backend_of(f) is be
    rf = arbiter.report_for(f)
    assert rf.model.endswith("fn") and _ops(rf) >= {"aten.tanh.default"}
    assert "aten.relu.default" not in _ops(rf)
    assert [g.model for g in be.report(m).graphs] == ["Lin"]
    assert len(be.report().graphs) == 2
    assert owner_of(f) == owner_of(fn)


def test_training_graphs_belong_to_their_model(fresh_dynamo):
    """The backward graph compiles at the first backward, outside Dynamo: it still
    belongs to its model."""
    m = torch.compile(Lin(), backend="arbiter", options=EAGER)
    m(torch.randn(2, 8)).sum().backward()
    rep = arbiter.report_for(m)
    assert [g.kind for g in rep.graphs] == ["forward", "backward"]
    assert {g.model for g in rep.graphs} == {"Lin"}


def test_not_compiled_yet_says_so(fresh_dynamo):
    """Before the first call (torch.compile compiles then) a report that says so; None
    for a model compiled with another backend (issue 45: the README's
    `report_for(compiled).summary()` raised AttributeError on None)."""
    rep = arbiter.report_for(torch.compile(nn.Bilinear(2, 2, 2), backend="arbiter"))
    assert rep is not None and rep.not_called and not rep.graphs
    assert arbiter.report_for(torch.compile(nn.Bilinear(2, 2, 2), backend="eager")) is None


def test_explain_leaves_other_compiled_models_alone(fresh_dynamo):
    """Before: explain ran torch._dynamo.explain, which resets Dynamo, so a model compiled
    before recompiled on its next call and its graphs appeared twice."""
    x = torch.randn(2, 8)
    compiles = []

    def counting(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    with torch.no_grad():
        a = torch.compile(Lin(), backend="arbiter", options=EAGER)
        c = torch.compile(Lin(4), backend=counting)
        a(x), c(x)
        be = arbiter.sessions.backend_of(a)
        plan = arbiter.explain(Lin(), x)          # the same class, another config
        plan_b = arbiter.explain(Broken(), x)
        a(x), c(x)
        torch.testing.assert_close(a(x), a._orig_mod(x))
    assert len(compiles) == 1, "a model compiled before recompiled after explain"
    assert arbiter.sessions.backend_of(a) is be
    assert len(arbiter.report_for(a).graphs) == 1
    assert plan.dry_run and plan.graph_breaks.breaks == 0
    assert plan_b.graph_breaks.breaks == 1 and len(plan_b.graphs) == 2


def test_explain_without_breaks_has_none(fresh_dynamo):
    with torch.no_grad():
        rep = arbiter.explain(Lin(), torch.randn(2, 8), breaks=False)
    assert rep.graph_breaks is None


@pytest.mark.parametrize("kw", [{"mode": "max-autotune"}, {"options": {"policy": "cost"}}])
def test_settings_with_an_arbiter_instance_are_refused(fresh_dynamo, kw):
    be = arbiter.Arbiter({"backends": ["eager"]})
    with pytest.raises(Exception) as info:
        torch.compile(fn, backend=be, **kw)(torch.randn(3))
    assert "Arbiter instance" in str(info.value)


def test_a_trace_dynamo_restarts_is_not_counted_as_a_graph(fresh_dynamo):
    # With dynamic=True Dynamo restarts its analysis from inside the backend call
    # (TensorifyScalarRestartAnalysis: a scalar it makes a tensor) and hands the graph
    # over again; the report said "Dynamo: 2 graphs" for the one graph compiled.
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.ln = torch.nn.Linear(16, 16), torch.nn.LayerNorm(16)
            self.drop = torch.nn.Dropout(0.1)

        def forward(self, x):
            return self.drop(self.ln(self.lin(x)))

    calls = []
    original = arbiter.Arbiter.__call__

    def spy(self, gm, example, **kw):
        try:
            out = original(self, gm, example, **kw)
        except BaseException as exc:
            calls.append(type(exc).__name__)
            raise
        calls.append("returned")
        return out

    arbiter.Arbiter.__call__ = spy
    try:
        compiled = torch.compile(M().eval(), backend="arbiter",
                                 options={"backends": ["onnxruntime"]}, dynamic=True)
        with torch.no_grad():
            compiled(torch.randn(3, 16))
    finally:
        arbiter.Arbiter.__call__ = original
    rep = arbiter.report_for(compiled)
    assert calls[-1] == "returned" and len(rep.graphs) == 1
    assert rep.graph_breaks.graphs == 1 and "Dynamo: 1 graph," in str(rep), calls
