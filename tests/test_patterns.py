"""Patterns claimed whole (a manifest's ``patterns:``): matching, claims, partitions.

Tiny ATen graphs; a test backend ``kern`` claims patterns of the pattern library and no
single op, so a matched pattern can only run on it whole, or op by op elsewhere.
"""
from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

import arbiter
from arbiter.errors import ManifestError
from arbiter.plan.patterns import PatternTable, find_matches, trace_pattern
from arbiter.plan.support import FixedSupport, Preferred

from conftest import check_plan_invariants, run_in_plan_order, trace, write_manifest


def _aot(fn, *args):
    """``fn`` as arbiter's lowering gives it (AOTAutograd, inference: functional ops)."""
    from torch._functorch.aot_autograd import aot_function, make_boxed_func

    got = []

    def capture(gm, _):
        got.append(gm)
        return make_boxed_func(gm.forward)

    with torch.no_grad():
        aot_function(fn, fw_compiler=capture, inference_compiler=capture)(*args)
    return got[-1]


@pytest.fixture
def kern(registry, tmp_path):
    """kern(patterns yaml, ops=[]) -> a registered backend `kern` claiming those patterns."""

    def make(patterns: str, ops=(), name="kern"):
        extra = "patterns:\n" + textwrap.indent(textwrap.dedent(patterns), "  ")
        path = write_manifest(tmp_path, name, list(ops), extra=extra)
        cls = type(f"Kern_{name}", (arbiter.Backend,), {
            "name": name, "manifest_path": classmethod(lambda cls: path),
            "compile": lambda self, gm, ex: gm})
        arbiter.register_backend(cls)
        return cls

    return make


def plan_of(gm, config):
    plan = arbiter.partition(gm, config)
    check_plan_invariants(plan, gm)
    return plan


ORT = {"backends": ["kern", "onnxruntime"], "min_block_size": 1}


def relu_gelu_tanh(x, b):
    return torch.tanh(F.gelu(torch.relu(x) + b))


def masked_softmax_late_mask(x, mask):
    s = x * 0.125
    m = torch.relu(mask)  # computed by another backend between the pattern's nodes
    return torch.softmax(s + m, -1)


# distinct tensors: make_fx gives one placeholder to a tensor passed twice
X, M = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
B, W = torch.randn(8), torch.randn(8)


def test_claimed_pattern_is_one_partition_on_the_claimer(kern):
    kern("bias_gelu: {}\n")
    gm = trace(relu_gelu_tanh, X, B)
    plan = plan_of(gm, ORT)
    assert plan.as_lists() == [("onnxruntime", ["relu"]), ("kern", ["add", "gelu"]),
                               ("onnxruntime", ["tanh"])]
    (g,) = plan.patterns
    assert (g.pattern, [n.name for n in g.nodes], g.claimed_by) == \
        ("bias_gelu", ["add", "gelu"], ("kern",))
    assert g.support.candidates == ("kern", "onnxruntime", "eager")
    torch.testing.assert_close(run_in_plan_order(plan, gm, X, B), gm(X, B))


def test_without_the_claim_the_ops_go_one_by_one(kern):
    kern("bias_gelu: {}\n", name="other")  # a backend not in the config
    gm = trace(relu_gelu_tanh, X, B)
    plan = arbiter.partition(gm, {"backends": ["onnxruntime"], "min_block_size": 1})
    assert plan.as_lists() == [("onnxruntime", ["relu", "add", "gelu", "tanh"])]
    assert plan.patterns == []


def test_a_match_is_never_split_by_the_scheduler(kern):
    # mul is ready first; the mask's relu (onnxruntime) comes between mul and add in graph
    # order. Without the match as one unit, the scheduler emits kern[mul],
    # onnxruntime[relu], kern[add, _softmax]: the pattern in two partitions.
    kern("scale_mask_softmax: {}\n")
    gm = trace(masked_softmax_late_mask, X, M)
    assert [n.name for n in gm.graph.nodes if n.op == "call_function"] == \
        ["mul", "relu", "add", "_softmax"]
    plan = plan_of(gm, ORT)
    assert plan.as_lists() == [("onnxruntime", ["relu"]), ("kern", ["mul", "add", "_softmax"])]


def test_dtype_the_pattern_does_not_allow_is_refused_with_the_reason(kern):
    kern("bias_gelu: {dtypes: [float16]}\n")
    gm = trace(relu_gelu_tanh, X, B)
    plan = plan_of(gm, ORT)
    assert plan.as_lists() == [("onnxruntime", ["relu", "add", "gelu", "tanh"])]
    (g,) = plan.patterns
    assert g.claimed_by == ()
    assert g.support.refusals["kern"] == \
        "pattern bias_gelu: dtype float32 not supported (pattern allows float16)"


@pytest.mark.parametrize("fn, why", [
    (lambda x, m: torch.softmax(x * 0.125 + m, 0), "softmax not over the last dim"),
    (lambda x, m: torch.softmax(x * m + m, -1), "the scale is not a number"),
    (lambda x, m: torch.softmax(torch.add(x * 0.5, m, alpha=2), -1), "add with alpha=2"),
])
def test_the_library_checks_the_literals_it_matched_as_wildcards(kern, fn, why):
    kern("scale_mask_softmax: {}\n")
    gm = trace(fn, X, M)
    plan = plan_of(gm, ORT)
    (g,) = plan.patterns
    assert g.claimed_by == ()
    assert why in g.support.refusals["kern"]
    assert all(b == "onnxruntime" for b, _ in plan.as_lists())


def test_a_check_that_raises_refuses_the_match_instead_of_failing_the_plan(kern,
                                                                          monkeypatch):
    from dataclasses import replace

    from arbiter.plan import pattern_library as lib
    from arbiter.plan import patterns as P

    def broken(m):
        raise IndexError("no such node")
    monkeypatch.setitem(lib.PATTERNS, "scale_mask_softmax",
                        replace(lib.PATTERNS["scale_mask_softmax"], check=broken))
    P._compiled.cache_clear()  # the traced patterns keep their check
    try:
        kern("scale_mask_softmax: {}\n")
        plan = plan_of(trace(lambda x, m: torch.softmax(x * 0.125 + m, -1), X, M), ORT)
    finally:
        P._compiled.cache_clear()
    (g,) = plan.patterns
    assert g.claimed_by == ()
    assert "its check failed on this match (IndexError: no such node)" in \
        g.support.refusals["kern"]
    assert all(b == "onnxruntime" for b, _ in plan.as_lists())


def test_exclude_and_pin_of_a_member_op_win_over_the_claim(kern):
    kern("bias_gelu: {}\n")
    gm = trace(relu_gelu_tanh, X, B)
    plan = plan_of(gm, {**ORT, "exclude_ops": ["aten.gelu"]})
    assert plan.as_lists() == [("onnxruntime", ["relu", "add"]), ("eager", ["gelu"]),
                               ("onnxruntime", ["tanh"])]
    assert "excluded" in plan.patterns[0].support.refusals["kern"]
    plan = plan_of(gm, {**ORT, "pin": {"aten.add.Tensor": "onnxruntime"}})
    assert plan.as_lists() == [("onnxruntime", ["relu", "add", "gelu", "tanh"])]
    assert "pinned" in plan.patterns[0].support.refusals["kern"]


def test_min_block_size_takes_the_claimer_from_the_whole_match(kern):
    kern("bias_gelu: {}\n")
    gm = trace(lambda x, b: torch.tanh(torch.sigmoid(torch.relu(F.gelu(x + b)))), X, B)
    assert plan_of(gm, ORT).as_lists() == [("kern", ["add", "gelu"]),
                                           ("onnxruntime", ["relu", "sigmoid", "tanh"])]
    plan = plan_of(gm, {**ORT, "min_block_size": 3})
    # the 2-node match is too small for kern: all of it goes to the next able backend
    assert plan.as_lists() == [("onnxruntime", ["add", "gelu", "relu", "sigmoid", "tanh"])]


def test_an_unavailable_claimer_costs_nothing(kern):
    cls = kern("bias_gelu: {}\n")
    cls.available = lambda self: (False, "switched off by the test")
    be = arbiter.Arbiter(ORT, dry_run=True)
    assert not isinstance(be.planner.table, PatternTable)
    gm = trace(relu_gelu_tanh, X, B)
    assert be.plan(gm).patterns == []


def test_larger_match_wins_an_overlap(kern):
    # add_layer_norm (add, native_layer_norm, getitem) and bias_gelu (add, gelu) could
    # both claim the add of `x + r` only if they overlapped: here they do not, and each
    # becomes its own unit.
    kern("add_layer_norm: {}\nbias_gelu: {}\n")

    def f(x, r, w, b):
        s = x + r
        return F.gelu(F.layer_norm(s, (8,), w, b) + b), s

    gm = trace(f, X, M, W, B)
    plan = plan_of(gm, ORT)
    assert [(g.pattern, [n.name for n in g.nodes]) for g in plan.patterns] == [
        ("add_layer_norm", ["add", "native_layer_norm", "getitem"]),
        ("bias_gelu", ["add_1", "gelu"])]
    assert plan.as_lists() == [("kern", ["add", "native_layer_norm", "getitem", "getitem_1",
                                         "getitem_2", "add_1", "gelu"])]


def test_rms_norm_matches_the_lowered_graph_in_float32_and_float16(kern):
    kern("rms_norm: {dtypes: [float32, float16]}\n")
    for dtype in (torch.float32, torch.float16):
        x, w = torch.randn(2, 3, 8, dtype=dtype), torch.randn(8, dtype=dtype)
        gm = _aot(lambda x, w: torch.relu(F.rms_norm(x, (8,), w, 1e-5)), x, w)
        plan = plan_of(gm, ORT)
        (g,) = plan.patterns
        assert g.claimed_by == ("kern",), g.support.refusals
        names = [n.name for n in g.nodes]
        assert plan.as_lists() == [("kern", names), ("onnxruntime", ["relu"])]
        # float16 is cast to float32 and back, as eager does: the casts are in the match
        assert ("_to_copy" in names) == (dtype == torch.float16)


def test_a_function_pattern_matches_its_literals_exactly(kern):
    kern('double_relu: {function: "test_patterns:double_relu", inputs: [[4, 8]]}\n')

    gm = trace(lambda x: torch.sigmoid(double_relu(x)) + double_relu(x * 3) * 2 - 1, X)
    plan = plan_of(gm, ORT)
    assert [[n.name for n in g.nodes] for g in plan.patterns] == [["relu", "mul"],
                                                                  ["relu_1", "mul_2"]]
    gm = trace(lambda x: torch.relu(x) * 3, X)  # another literal: no match
    assert plan_of(gm, ORT).patterns == []


def double_relu(x):
    return torch.relu(x) * 2


def test_manifest_pattern_errors_name_the_file_and_key(kern):
    kern("no_such_pattern: {}\n")
    with pytest.raises(ManifestError, match=r"kern.yaml: patterns.no_such_pattern: pattern "
                       r"'no_such_pattern' is not in the pattern library"):
        arbiter.Arbiter(ORT, dry_run=True)
    with pytest.raises(ManifestError, match=r"patterns.p.inputs: a pattern given by "
                       r"`function` needs `inputs`"):
        arbiter.manifest.parse_manifest("backend: k\npatterns:\n  p: {function: 'a.b:c'}\n")
    with pytest.raises(ManifestError, match=r"is not `module.path:function`"):
        arbiter.manifest.parse_manifest("backend: k\npatterns:\n  p: {function: 'a b'}\n")


def test_fixed_support_and_preferred_keep_the_units(kern):
    kern("scale_mask_softmax: {}\n")
    gm = trace(masked_softmax_late_mask, X, M)
    be = arbiter.Arbiter(ORT, dry_run=True)
    base = be.plan(gm)
    replay = be.planner.plan(gm, FixedSupport(base.support, "eager", base.patterns))
    assert replay.as_lists() == base.as_lists()
    steer = Preferred(FixedSupport(base.support, "eager", base.patterns),
                      lambda n: "onnxruntime" if n.name == "add" else None)
    assert be.planner.plan(gm, steer).as_lists() == [
        ("onnxruntime", ["relu", "mul", "add", "_softmax"])]


def test_the_report_shows_each_match_and_who_took_it(kern):
    kern("bias_gelu: {}\n")

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.b = torch.nn.Parameter(torch.randn(8))

        def forward(self, x):
            return torch.tanh(F.gelu(torch.relu(x) + self.b))

    with torch.no_grad():
        report = arbiter.explain(M().eval(), X, config=ORT, breaks=False)
    (m,) = report.graphs[0].patterns
    assert (m.pattern, m.claimed_by, m.backend, m.whole, m.compiled) == \
        ("bias_gelu", ["kern"], "kern", True, False)
    assert "pattern bias_gelu [add, gelu]: kern (whole, #1, planned); claimed by kern" \
        in str(report)


def test_find_matches_ignores_unread_getitems_of_a_matched_op():
    from arbiter.plan.pattern_library import PATTERNS
    from arbiter.plan.patterns import CompiledPattern

    lib = PATTERNS["add_layer_norm"]
    gm_pat = trace_pattern(lib.fn, lib.shapes, torch.float32)
    cp = CompiledPattern("add_layer_norm", (gm_pat,), True, lib.check)
    # make_fx leaves getitem_1/getitem_2 (mean, rstd) unread; AOT's graphs have none
    gm = trace(lambda x, r, w, b: F.layer_norm(x + r, (8,), w, b), X, M, W, B)
    (m,) = find_matches(gm.graph, [cp])
    assert [n.name for n in m.nodes] == ["add", "native_layer_norm", "getitem"]
    assert lib.check(m) is None and lib.params(m) == {"eps": 1e-05}
