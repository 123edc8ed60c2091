"""`arbiter probe --grad`: a sample's training graphs, forward (every output it returns
compared, those saved for the backward included) and backward, through one backend."""
from __future__ import annotations

import operator

import pytest
import torch
import yaml

from arbiter.errors import ManifestError
from arbiter.manifest import load_manifest, parse_manifest
from arbiter.probe import ProbeResult, SampleResult, manifest_update, probe, write_manifest
from conftest import off_where

EB = "aten._embedding_bag.default"


def _returned(gm):
    return list(next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0])


def _embedding_bag_saved_zeros(self, gm, example_inputs):
    """Right bags; offset2bag, bag_size and max_indices all zeros in modes mean and max
    (what ONNX Runtime's export of _embedding_bag returned), when a graph returns them."""
    bad = [k for k, a in enumerate(_returned(gm)) if a.target is operator.getitem
           and a.args[0].target is torch.ops.aten._embedding_bag.default
           and (*a.args[0].args, 0, 0)[4] != 0 and a.args[1] > 0]  # mode: 0 is sum

    def fn(*args):
        out = list(gm(*args))
        for k in bad:
            out[k] = torch.zeros_like(out[k])
        return out
    return fn


def test_training_forward_compares_saved_outputs(make_backend, tmp_path):
    """The training forward of embedding_bag holds _embedding_bag (an inference trace holds
    _embedding_bag_forward_only) and returns outputs 1-3 for the backward: each is compared
    with eager. The OpInfo's first samples are mode sum; the probe runs samples of other
    modes too (arguments no earlier sample had), and finds the wrong ones."""
    cls = make_backend("bag", [EB], compile=_embedding_bag_saved_zeros)
    assert probe(cls(), ops=["nn.functional.embedding_bag"], dtypes=["float32"]).counts() \
        == {"passed": 0, "failed": 0, "skipped": 1}  # inference: the op is not there
    result = probe(cls(), ops=["nn.functional.embedding_bag"], dtypes=["float32"], grad=True)
    forward = [s for s in result.samples if s.graph == "forward" and s.status != "skipped"]
    assert len(forward) > 3 and all(s.status == "passed" and s.ops[0] == EB for s in forward)
    assert "saved output 1 of aten._embedding_bag.default" not in forward[0].reason
    assert any("saved output 3 of aten._embedding_bag.default differs from eager" in s.reason
               for s in forward)
    # the bags are right: the op is credited (with its indices' dtype); outputs 1-3 are not
    assert result.passed[EB] == result.trained[EB] == {"float32", "int64"}
    assert set(result.wrong_outputs(EB)) == {1, 2, 3}
    assert result.wrong_outputs(EB)[2]["float32"].startswith(
        "nn.functional.embedding_bag, forward graph: differs from eager: max abs error")
    # the rest hold ops not in its manifest: _embedding_bag_backward, arange
    assert all(s.stage == "manifest" for s in result.samples if s not in forward)
    out = tmp_path / "m.yaml"
    write_manifest(cls.manifest_path(), result, out=out)
    m = load_manifest(out, backend="bag")
    assert set(m.ops[EB].wrong_outputs) == {1, 2, 3}
    assert m.ops[EB].training_dtypes == m.ops[EB].probed_dtypes == ["float32", "int64"]
    assert [(k, d) for k, d, _ in m.entry(EB).wrong_outputs] == \
        [(k, {torch.float32}) for k in (1, 2, 3)]
    assert m.probe.training_samples_passed == len(forward) and m.probe.samples_passed == 0
    assert "of which 1 in training graphs" in m.verification()


def _bag_wrong(self, gm, example_inputs):
    """The bags themselves (output 0 of _embedding_bag) off by 1."""
    bad = [k for k, a in enumerate(_returned(gm)) if a.target is operator.getitem
           and a.args[1] == 0]

    def fn(*args):
        out = list(gm(*args))
        for k in bad:
            out[k] = out[k] + 1
        return out
    return fn


def test_a_wrong_returned_output_fails_the_training_forward(make_backend, monkeypatch):
    from arbiter.probe import training

    monkeypatch.setattr(training, "TRAINING_RUNS", 1)
    cls = make_backend("bag", [EB], compile=_bag_wrong)
    result = probe(cls(), ops=["nn.functional.embedding_bag"], dtypes=["float32"], grad=True)
    [fwd] = [s for s in result.samples if s.graph == "forward"]
    assert (fwd.status, fwd.stage, fwd.ops) == ("failed", "numbers", [EB])
    assert result.failed[EB]["float32"].startswith("forward graph, numbers: output 0")
    assert EB not in result.passed and not result.outputs_failed


def _add_one_to_output_1(self, gm, example_inputs):
    def fn(*args):
        out = list(gm(*args))
        out[1] = out[1] + 1
        return out
    return fn


def test_saved_outputs_judged_one_by_one(make_backend):
    """A training forward's saved output of a tuple-returning op that is wrong is that
    op's finding (the sample passes); a wrong saved value of a one-output op fails it."""
    from arbiter.probe.judge import run_sample
    from conftest import trace

    x = torch.randn(4, 3)
    backend = make_backend("off", [], compile=_add_one_to_output_1)()

    def var_mean(x):
        v, m = torch.var_mean(x, 1)
        return v * 2, m

    def sin(x):
        y = torch.sin(x)
        return y * 2, y

    gm = trace(var_mean, x)
    got = run_sample(backend, gm, [x], saved_from=1)
    assert got.status == "passed" and not got.right
    [(node, k)] = got.wrong
    assert (node.target, k) == (torch.ops.aten.var_mean.correction, 1)
    assert got.wrong[(node, k)].startswith("differs from eager: max abs error 1")
    assert run_sample(backend, gm, [x]).stage == "numbers"  # returned to the user: fails
    got = run_sample(backend, trace(sin, x), [x], saved_from=1)
    assert (got.status, got.stage) == ("failed", "numbers")
    assert got.reason.startswith("saved output 1 (sin):")


LN = "aten.native_layer_norm.default"


def _refuses_returned_statistics(self, gm, example_inputs):
    """A backend that cannot return layer norm's mean and rstd (OpenVINO's conversion of
    a returned tuple output failed so), and computes the rest right."""
    if any(a.target is operator.getitem and a.args[1] > 0
           and a.args[0].target is torch.ops.aten.native_layer_norm.default
           for a in _returned(gm)):
        raise RuntimeError("could not convert the partition: getitem")
    return gm


def _refuses_returned_detach(self, gm, example_inputs):
    """A backend that cannot return a value with its detach (OpenVINO's conversion of
    exp's training forward, which saves detach(exp), failed so)."""
    if any(a.target is torch.ops.aten.detach.default for a in _returned(gm)):
        raise RuntimeError("could not convert the partition: is_number(name)")
    return gm


def test_a_forward_failing_on_what_it_returns_for_the_backward(make_backend, monkeypatch):
    """A training forward that fails only because of what it returns for its backward
    runs again without it: the ops pass (an inference partition of them works), the saved
    outputs of a tuple-returning op become `wrong_outputs` (refused where used: in
    training), and the nodes computing only saved values are blamed."""
    from arbiter.probe import training

    monkeypatch.setattr(training, "TRAINING_RUNS", 1)
    cls = make_backend("ln", [LN], compile=_refuses_returned_statistics)
    result = probe(cls(), ops=["nn.functional.layer_norm"], dtypes=["float32"], grad=True)
    [forward] = [s for s in result.samples if s.graph == "forward"]
    assert forward.status == "passed" and "saved output 1 of " + LN in forward.reason
    assert set(result.wrong_outputs(LN)) == {1, 2} and "float32" in result.passed[LN]
    assert "fails when returned for the backward: compile: RuntimeError: could not " \
        "convert the partition: getitem" in result.wrong_outputs(LN)[1]["float32"]
    assert not result.failed_dtypes

    ops = ["aten.exp.default", "aten.detach.default", "aten.mul.Tensor"]
    cls = make_backend("exp", ops, compile=_refuses_returned_detach)
    result = probe(cls(), ops=["exp"], dtypes=["float32"], grad=True)
    forward, blamed, backward = result.samples
    assert (forward.graph, forward.status, forward.ops) == ("forward", "passed",
                                                            ["aten.exp.default"])
    assert (blamed.graph, blamed.status, blamed.ops) == ("forward", "failed",
                                                         ["aten.detach.default"])
    assert blamed.reason.startswith("returning what the backward reads: RuntimeError")
    assert result.passed["aten.exp.default"] == {"float32"}
    assert "float32" in result.failed["aten.detach.default"]
    assert backward.status == "passed"


def test_a_forward_failing_on_tuple_outputs_the_user_sees(make_backend, monkeypatch):
    """The native_layer_norm OpInfo returns mean and rstd to the user: a backend that
    cannot return them fails that forward; run again returning output 0 only, it passes,
    and outputs 1-2 become `wrong_outputs` ("fails when returned"), the dtype kept (the
    first OpenVINO run dropped float32 of batch norm for the same reason)."""
    from arbiter.probe import training

    monkeypatch.setattr(training, "TRAINING_RUNS", 1)
    cls = make_backend("ln2", [LN], compile=_refuses_returned_statistics)
    result = probe(cls(), ops=["native_layer_norm"], dtypes=["float32"], grad=True)
    forward = [s for s in result.samples if s.graph == "forward"]
    assert forward and all(s.status == "passed" for s in forward)
    assert set(result.wrong_outputs(LN)) == {1, 2} and "float32" in result.passed[LN]
    why = result.wrong_outputs(LN)[1]["float32"]
    assert "fails when returned: compile: RuntimeError: could not convert" in why
    assert not result.failed_dtypes


#: A backend whose tanh_backward is off by 0.1 (its forward ops are right).
_tanh_backward_wrong = off_where(torch.ops.aten.tanh_backward.default)


def test_grad_probe_runs_both_graphs_and_catches_a_wrong_backward(make_backend):
    """--grad: the sample's forward graph (tanh, its output saved) and its backward graph
    (tanh_backward on the saved output) go through the backend; a wrong backward is a
    failed sample, the forward passes."""
    cls = make_backend("bwd", ["aten.tanh_backward.default", "aten.detach.default",
                               "aten.tanh.default"], compile=_tanh_backward_wrong)
    fwd = probe(cls(), ops=["tanh"], dtypes=["float32"])
    assert fwd.counts()["passed"] == 1  # the inference graph holds no tanh_backward
    result = probe(cls(), ops=["tanh"], dtypes=["float32"], grad=True)
    assert "(training graphs: forward and backward)" in result.summary()
    assert "[forward: 1 passed, 0 failed, 0 skipped; backward: 0 passed, 1 failed" \
        in result.summary()
    forward, backward = result.samples
    assert (forward.graph, forward.status, backward.graph, backward.status) == \
        ("forward", "passed", "backward", "failed")
    assert "aten.tanh.default" in forward.ops and "aten.tanh_backward.default" in backward.ops
    assert "aten.tanh_backward.default" not in result.passed
    assert "float32" in result.trained["aten.tanh.default"]


def test_grad_probe_decomposes_for_the_backend(capsys):
    """ONNX Runtime's manifest decomposes tanh_backward: the --grad probe runs the
    decomposition through it and says so."""
    from arbiter.cli import main

    assert main(["probe", "onnxruntime", "--ops", "tanh", "--dtypes", "float32",
                 "--grad"]) == 0
    out = capsys.readouterr().out
    assert "onnxruntime (training graphs: forward and backward): 1/1 OpInfos" in out
    assert "decomposed for it: 1 ops passed (aten.tanh_backward.default)" in out


def test_training_counts_and_dtypes_are_recorded_apart():
    """A --grad probe's counts go to `training_*`, an inference probe's stay where they
    were; `training_dtypes` adds up like `probed_dtypes`."""
    mul, add = "aten.mul.Tensor", "aten.add.Tensor"
    r = ProbeResult("x", "x 1.0", str(torch.__version__), ["float16"], grad=True)
    r.opinfos_done = r.opinfos_total = 1
    for op in (mul, add):
        sample = SampleResult("mul", "float16", [op], "passed", graph="forward")
        r.samples.append(sample)
        r.record(sample, {(op, "float16")})
    prev = {"torch": str(torch.__version__), "backend_version": "x 1.0", "opinfos": "5/5",
            "dtypes_tried": ["float32"], "samples_passed": 4, "samples_failed": 1,
            "samples_skipped": 0, "training_opinfos": "2/2", "training_samples_passed": 3}
    doc = {"backend": "x", "defaults": {"dtypes": ["float32", "float16"]},
           "ops": {mul: {"verified": "probed", "probed_dtypes": ["float32"],
                         "training_dtypes": ["float32"]}, add: {}}, "probe": prev}
    new = manifest_update(doc, r)
    assert new["ops"][mul]["training_dtypes"] == ["float32", "float16"]
    assert new["ops"][add] == {"verified": "probed", "probed_dtypes": ["float16"],
                               "training_dtypes": ["float16"]}
    p = new["probe"]
    assert (p["opinfos"], p["samples_passed"], p["samples_failed"]) == ("5/5", 4, 1)
    assert (p["training_opinfos"], p["training_samples_passed"]) == ("2/2 + 1/1", 5)
    inference = ProbeResult("x", "x 1.0", str(torch.__version__), ["float32"])
    inference.record(SampleResult("add", "float32", [add], "passed"), {(add, "float32")})
    again = manifest_update(new, inference)
    assert again["ops"][add]["training_dtypes"] == ["float16"]  # kept, not widened
    assert again["probe"]["training_samples_passed"] == 5
    assert again["probe"]["opinfos"] == "5/5 + 0/0"
    assert yaml.safe_load(yaml.safe_dump(again)) == again


def test_training_dtypes_must_have_been_probed():
    with pytest.raises(ManifestError, match=r"training_dtypes: float16 passed in a training "
                                            r"graph but not in `probed_dtypes` \(float32\)"):
        parse_manifest("backend: x\nops:\n  aten.add.Tensor: {dtypes: [float32, float16], "
                       "probed_dtypes: [float32], training_dtypes: [float16]}\n")
