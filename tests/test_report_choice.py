"""A graph's policy choice said in words (arbiter/report/choice.py), the same in the text
report and on the HTML page: which placement ran and why, candidates named in words, what
was not measured said so (never a dash)."""
from __future__ import annotations

import pytest

from arbiter.report import BackendStatus, GraphReport, PartitionReport, Report
from arbiter.report.choice import choice_line, named
from arbiter.report.html import render_html
from arbiter.report.text import plain


def _graph(**kw) -> GraphReport:
    part = PartitionReport(id=0, planned_backend="onnxruntime", compiled=True,
                           backend="onnxruntime", nodes=3, ops={"aten.addmm.default": 3},
                           node_names=[], chain=["onnxruntime", "eager"])
    return GraphReport(graph_id=0, kind="forward", nodes=3, partitions=[part], **kw)


def _both(g: GraphReport) -> tuple[str, str]:
    rep = Report(backends=[BackendStatus(name="onnxruntime", available=True),
                           BackendStatus(name="eager", available=True)], graphs=[g])
    return plain(rep), render_html(rep)


def test_candidates_are_named_in_words():
    assert named("priority") == "the config-order plan"
    assert named("only onnxruntime") == "onnxruntime alone"
    assert named("priority with openvino:bf16") == "the config-order plan with openvino:bf16"


def test_eager_measured_faster_says_so_with_both_times():
    """Before: "policy priority, timed against eager: chose only eager; measured:
    priority 1.460 ms, only eager 0.980 ms"."""
    g = _graph(policy="priority", against_eager=True, chosen="only eager",
               candidates_ms={"priority": 1.46, "only eager": 0.98})
    line = choice_line(g)
    assert line == ("policy priority, timed against eager: eager was measured faster than "
                    "the plan: 0.98 ms against 1.46 ms")
    text, page = _both(g)
    assert line in text and line in page  # one sentence, both renderings
    assert "chose only eager" not in text + page


def test_plan_kept_when_eager_is_not_faster_by_the_margin():
    g = _graph(policy="priority", against_eager=True, chosen="priority",
               candidates_ms={"priority": 1.0, "only eager": 0.99})
    assert choice_line(g).endswith("the plan kept: eager was measured at 0.99 ms against "
                                   "its 1.00 ms, not faster by more than 3%")
    g.candidates_ms = {"priority": 1.0, "only eager": 3.25}
    assert choice_line(g).endswith("the plan was measured faster than eager: 1.00 ms "
                                   "against 3.25 ms")


def test_what_was_not_measured_is_said_never_a_dash():
    """Before: "measured: priority -, only openvino -, only onnxruntime 0.417 ms"."""
    g = _graph(policy="measure", chosen="only onnxruntime", candidates_ms={
        "priority": None, "only onnxruntime": 0.4171, "only openvino": None,
        "only eager": 0.9}, candidates_spread_ms={"only onnxruntime": [0.41, 0.43]},
        measure_rounds=3, measure_confident=True)
    line = choice_line(g)
    assert line == ("policy measure: onnxruntime alone was measured fastest: 0.42 ms "
                    "[0.41-0.43] against 0.90 ms for eager alone; not measured: the "
                    "config-order plan, openvino alone; 3 interleaved rounds, winner apart "
                    "from the rest")
    assert " -" not in line


def test_equal_plans_are_one_candidate():
    g = _graph(policy="cost", chosen="priority",
               estimates_ms={"priority": 0.1552, "only onnxruntime": 0.1552,
                             "only eager": 0.7079})
    assert choice_line(g) == (
        "policy cost: the config-order plan (the same as onnxruntime alone) was estimated "
        "fastest: ~0.16 ms against ~0.71 ms for eager alone")


@pytest.mark.parametrize("policy,words", [
    ("calibrated", "was predicted fastest from this machine's calibration: ~0.16 ms"),
    ("cost", "was estimated fastest: ~0.16 ms")])
def test_a_choice_by_estimate_says_how_it_was_estimated(policy, words):
    g = _graph(policy=policy, chosen="only onnxruntime",
               estimates_ms={"priority": 0.21, "only onnxruntime": 0.16})
    assert f"policy {policy}: onnxruntime alone {words} against ~0.21 ms for the " \
           "config-order plan" == choice_line(g)


def test_measure_before_its_first_call():
    g = _graph(policy="measure", candidates_ms={"priority": None, "only eager": None},
               estimates_ms={"priority": 0.2, "only eager": 0.5})
    assert choice_line(g) == (
        "policy measure: the config-order plan runs until the first call times 2 "
        "candidates (estimated: the config-order plan ~0.2 ms, eager alone ~0.5 ms)")


def test_no_choice_no_line():
    assert choice_line(_graph()) == ""


def test_a_timed_candidate_that_fell_back_is_named_in_words():
    g = _graph(policy="measure", chosen="only eager",
               candidates_ms={"only eager": 0.5, "only openvino": 0.9},
               candidate_fallbacks={"only openvino": [
                   "partition 0: openvino -> eager (compile: RuntimeError: boom)"]})
    line = ("not chosen, fell back while timed: openvino alone: partition 0: openvino -> "
            "eager (compile: RuntimeError: boom)")
    text, page = _both(g)
    assert line in text and line.replace(">", "&gt;") in page


def test_the_summary_counts_a_step_on_dynamos_graph_as_eager():
    """Before: "ran: onnxruntime 100%" for a training step that runs Dynamo's graph in
    eager (run/step.py), whose partitions no longer run."""
    from arbiter.report.model import StepReport
    from arbiter.report.from_record import kind_reports

    def report(route: str) -> Report:
        g = _graph(step=StepReport(route=route, reason="timed"))
        return Report(backends=[BackendStatus(name="onnxruntime", available=True)], graphs=[g],
                      kinds=kind_reports([g], {"eager"}))

    on_dynamo = report("dynamo eager")
    assert "ran: eager 100%" in on_dynamo.summary()
    assert "on Dynamo's graph: 1" in on_dynamo.summary()
    assert [(b.backend, b.eager) for b in on_dynamo.kinds[0].backends] == [("eager", True)]
    compiled = report("compiled")
    assert "ran: onnxruntime 100%" in compiled.summary()
    assert "Dynamo" not in compiled.summary()
    assert [b.backend for b in compiled.kinds[0].backends] == ["onnxruntime"]
    assert "step timed: 1" in report("trial").summary()


def test_the_summary_counts_candidates_that_fell_back_while_timed():
    """Before: "fallbacks: 0" while OpenVINO's candidate had failed its check when timed
    and the graph ran in eager."""
    g = _graph(policy="calibrated", chosen="only eager",
               candidate_fallbacks={"only openvino": [
                   "partition 0: openvino -> eager (verify: differs from eager)"]})
    rep = Report(backends=[BackendStatus(name="onnxruntime", available=True)], graphs=[g])
    assert "fallbacks: 0 (+1 while timed)" in rep.summary()
    assert Report(graphs=[_graph()]).summary().endswith("fallbacks: 0")
