"""`arbiter probe`: OpInfo samples through one backend alone vs eager; manifest updates."""
from __future__ import annotations

import operator

import pytest
import torch
import yaml

import arbiter
from arbiter.errors import ManifestError
from arbiter.manifest import Manifest, load_manifest, parse_manifest
from arbiter.probe import manifest_update, probe, write_manifest
from conftest import off_where

OPS = ["aten.add.Tensor", "aten.mul.Tensor", "aten.sin.default", "aten.cos.default"]


#: A backend that computes every op right except sin (off by 0.1).
_sin_wrong = off_where(torch.ops.aten.sin.default)


def test_probe_credits_passes_and_blames_single_op_failures(make_backend):
    cls = make_backend("fake", OPS, compile=_sin_wrong)
    result = probe(cls(), ops=["add", "mul", "sin", "cos"], dtypes=["float32", "int64"])
    assert result.opinfos_done == result.opinfos_total >= 4
    assert result.passed["aten.add.Tensor"] >= {"float32", "int64"}
    assert "float32" in result.passed["aten.cos.default"]
    assert "aten.sin.default" not in result.passed
    assert "numbers" in result.failed["aten.sin.default"]["float32"]
    failed = [s for s in result.samples if s.status == "failed"]
    assert failed and all(s.ops == ["aten.sin.default"] for s in failed)
    assert "max abs error" in failed[0].reason


def test_probe_skips_ops_missing_from_manifest(make_backend):
    cls = make_backend("narrow", ["aten.add.Tensor"])
    result = probe(cls(), ops=["mul"], dtypes=["float32"])
    assert result.counts()["passed"] == 0
    assert all(s.status == "skipped" and s.stage == "manifest" for s in result.samples)


def test_manifest_update_and_write(make_backend, tmp_path):
    cls = make_backend("fake", OPS, compile=_sin_wrong)
    result = probe(cls(), ops=["add", "sin"], dtypes=["float32"])
    src = cls.manifest_path()
    out = tmp_path / "probed.yaml"
    text = write_manifest(src, result, out=out)
    m = load_manifest(out, backend="fake")
    assert m.ops["aten.add.Tensor"].verified == "probed"
    assert m.ops["aten.add.Tensor"].probed_dtypes == ["float32"]
    # int64 and bool (the manifest's defaults) were not tried: still allowed, as declared
    assert m.entry("aten.add.Tensor").dtypes == {torch.float32, torch.int64, torch.bool}
    # sin failed alone in float32, the only dtype tried: float32 goes, int64 and bool
    # (untried) stay; the op is removed only when no dtype it allowed is left
    assert m.ops["aten.sin.default"].dtypes == ["int64", "bool"]
    assert "float32" in m.probe.dtypes_dropped["aten.sin.default"]
    assert "aten.sin.default" not in m.probe.failed
    assert m.ops["aten.cos.default"].verified is None  # not probed: stays declared
    assert m.entry("aten.cos.default").verified == "declared"
    assert m.probe.torch == torch.__version__ and m.probe.samples_passed >= 1
    assert src.read_text() != text  # --out leaves the source alone


def test_manifest_update_keeps_notes_and_other_keys():
    from arbiter.probe import ProbeResult

    r = ProbeResult("x", "x 1.0", torch.__version__, ["float32"])
    r.passed["aten.add.Tensor"] = {"int64", "float32"}
    doc = {"backend": "x", "format": 1, "decompositions": ["aten.gelu"],
           "ops": {"aten.add.Tensor": {"note": "kept"}, "aten.relu.default": {}}}
    new = manifest_update(doc, r)
    # no `defaults:`: the manifest's default dtypes are [float32]; int64 passed, so it is added
    assert new["ops"]["aten.add.Tensor"] == {"note": "kept", "dtypes": ["float32", "int64"],
                                              "verified": "probed",
                                              "probed_dtypes": ["float32", "int64"]}
    assert new["ops"]["aten.relu.default"] == {}
    assert new["decompositions"] == ["aten.gelu"]


def test_probe_cli_on_real_backend(tmp_path, capsys):
    from arbiter.cli import main

    out = tmp_path / "ort.yaml"
    js = tmp_path / "ort.json"
    assert main(["probe", "onnxruntime", "--ops", "aten.mul", "--dtypes", "float32",
                 "--write", "--out", str(out), "--json", str(js)]) == 0
    captured = capsys.readouterr()
    assert "[probe onnxruntime] 1/1 OpInfos" in captured.err  # progress on stderr
    assert "1 passed" in captured.out
    doc = yaml.safe_load(out.read_text())
    assert doc["ops"]["aten.mul.Tensor"]["verified"] == "probed"
    assert doc["probe"]["backend_version"].startswith("onnxruntime")
    mul = load_manifest(out, backend="onnxruntime").ops["aten.mul.Tensor"]
    assert "float32" in mul.probed_dtypes  # with what the shipped manifest's probe passed
    assert "int32" in mul.dtypes and "int32" not in mul.probed_dtypes  # declared: kept


@pytest.mark.slow
def test_probe_finds_a_real_ort_failure():
    """ONNX Runtime has no int64 Gemm: the probe must see addmm fail in int64."""
    backend = arbiter.get_backend_class("onnxruntime")()
    result = probe(backend, ops=["addmm"], dtypes=["float32", "int64"])
    assert "float32" in result.passed["aten.addmm.default"]
    assert "int64" in result.failed["aten.addmm.default"]


def test_second_probe_adds_to_the_record():
    from arbiter.probe import ProbeResult, SampleResult

    r = ProbeResult("x", "x 1.0", str(torch.__version__), ["int64"])
    r.samples.append(SampleResult("mul", "int64", ["aten.mul.Tensor"], "passed"))
    r.opinfos_done = r.opinfos_total = 1
    r.passed["aten.mul.Tensor"] = {"int64"}
    prev = {"torch": str(torch.__version__), "backend_version": "x 1.0", "opinfos": "5/5",
            "dtypes_tried": ["float32"], "samples_passed": 4, "samples_failed": 1,
            "samples_skipped": 0, "failed": {"aten.sin.default": "float32: numbers"}}
    new = manifest_update({"backend": "x", "ops": {"aten.mul.Tensor": {}}, "probe": prev}, r)
    assert new["probe"]["samples_passed"] == 5 and new["probe"]["opinfos"] == "5/5 + 1/1"
    assert new["probe"]["dtypes_tried"] == ["float32", "int64"]
    assert "aten.sin.default" in new["probe"]["failed"]


def test_a_probe_of_every_opinfo_replaces_the_records_counts():
    """Running the whole probe again on the same versions counts its samples once: the
    record's totals were twice the samples when a second full run added to the first."""
    from arbiter.probe import ProbeResult, SampleResult

    r = ProbeResult("x", "x 1.0", str(torch.__version__), ["float32"], every_opinfo=True)
    r.samples += [SampleResult("mul", "float32", ["aten.mul.Tensor"], "passed"),
                  SampleResult("sin", "float32", ["aten.sin.default"], "failed")]
    r.opinfos_done = r.opinfos_total = 2
    r.passed["aten.mul.Tensor"] = {"float32"}
    prev = {"torch": str(torch.__version__), "backend_version": "x 1.0", "opinfos": "2/2",
            "dtypes_tried": ["float32"], "samples_passed": 1, "samples_failed": 1,
            "samples_skipped": 0, "training_opinfos": "3/3", "training_samples_passed": 7}
    new = manifest_update({"backend": "x", "ops": {"aten.mul.Tensor": {}}, "probe": prev}, r)
    p = new["probe"]
    assert (p["opinfos"], p["samples_passed"], p["samples_failed"]) == ("2/2", 1, 1)
    assert (p["training_opinfos"], p["training_samples_passed"]) == ("3/3", 7)  # kept


# -- the rule: declared dtypes minus those tried and never passed --------------------------
def _sample(opinfo, dtype, ops, status):
    from arbiter.probe import SampleResult

    return SampleResult(opinfo, dtype, ops, status, "" if status == "passed" else "run",
                        "" if status == "passed" else "boom")


def _hand_built():
    """mul: float32 passed, int64 failed alone, bool failed with add in one graph
    (a decomposed OpInfo); add: nothing passed; float16 never tried by anything."""
    from arbiter.probe import ProbeResult

    r = ProbeResult("x", "x 1.0", str(torch.__version__), ["float32", "int64", "bool"])
    mul, add = "aten.mul.Tensor", "aten.add.Tensor"
    r.record(_sample("mul", "float32", [mul], "passed"), {(mul, "float32")})
    r.record(_sample("mul", "int64", [mul], "failed"), {(mul, "int64")})
    r.record(_sample("addcmul", "bool", [add, mul], "failed"), {(mul, "bool"), (add, "bool")})
    return r


DOC = {"backend": "x", "format": 1,
       "defaults": {"dtypes": ["float32", "float16", "int64", "bool"]},
       "ops": {"aten.mul.Tensor": {}, "aten.add": {"note": "packet"}, "aten.cos.default": {}}}


def test_probe_drops_only_dtypes_tried_and_never_passed():
    r = _hand_built()
    assert r.dropped("aten.mul.Tensor") == {"int64": "run: boom", "bool": "run: boom"}
    assert "aten.add.Tensor" not in r.failed  # a graph of two ops blames neither whole
    new = manifest_update(DOC, r)
    ops = new["ops"]
    # passed float32 kept; float16 untried kept; int64 (alone) and bool (multi-op) dropped
    assert ops["aten.mul.Tensor"] == {"dtypes": ["float32", "float16"], "verified": "probed",
                                      "probed_dtypes": ["float32"]}
    # add: tried only in bool, in a failed graph of two ops: bool dropped, op kept, declared
    assert ops["aten.add.Tensor"] == {"note": "packet", "dtypes": ["float32", "float16", "int64"]}
    assert ops["aten.add"] == {"note": "packet"}  # the packet entry itself is left alone
    assert ops["aten.cos.default"] == {}  # not tried: as declared
    assert new["probe"]["dtypes_dropped"]["aten.mul.Tensor"] == {"int64": "run: boom",
                                                                 "bool": "run: boom"}
    m = Manifest.model_validate(new)
    assert m.entry("aten.mul.Tensor").probed_dtypes == {torch.float32}
    assert m.entry("aten.add.Tensor").verified == "declared"


def test_a_dtype_passed_once_stays_and_earlier_passes_count():
    """A dtype that failed in one sample but passed in another stays; so does a dtype an
    earlier probe passed (probed_dtypes), when a later --ops run sees it fail."""
    r = _hand_built()
    r.record(_sample("mul", "int64", ["aten.mul.Tensor"], "passed"), {("aten.mul.Tensor", "int64")})
    doc = {**DOC, "ops": {**DOC["ops"], "aten.mul.Tensor": {"dtypes": ["float32", "bool"],
                                                            "verified": "probed",
                                                            "probed_dtypes": ["bool"]}}}
    ops = manifest_update(doc, r)["ops"]
    assert ops["aten.mul.Tensor"]["dtypes"] == ["float32", "int64", "bool"]
    assert ops["aten.mul.Tensor"]["probed_dtypes"] == ["float32", "int64", "bool"]


def test_an_op_that_passed_earlier_is_not_removed_by_a_later_run():
    """A later --ops run where every sample of the op alone fails: the op passed before
    (probed_dtypes), so it stays; the dtypes that failed now and never passed go."""
    from arbiter.probe import ProbeResult

    r = ProbeResult("x", "x 1.0", str(torch.__version__), ["float32", "int64"])
    for dt in ("float32", "int64"):
        r.record(_sample("new_zeros", dt, ["aten.new_zeros.default"], "failed"),
                 {("aten.new_zeros.default", dt)})
    doc = {"backend": "x", "defaults": {"dtypes": ["float32", "int64", "bool"]},
           "ops": {"aten.new_zeros.default": {"dtypes": ["float32", "int64", "bool"],
                                              "verified": "probed",
                                              "probed_dtypes": ["float32"]},
                   "aten.new_ones.default": {},
                   "aten.new_full.default": {"dtypes": ["float32", "int64"]}}}
    r.record(_sample("new_ones", "float32", ["aten.new_ones.default"], "failed"),
             {("aten.new_ones.default", "float32")})
    for dt in ("float32", "int64"):
        r.record(_sample("new_full", dt, ["aten.new_full.default"], "failed"),
                 {("aten.new_full.default", dt)})
    new = manifest_update(doc, r)
    assert new["ops"]["aten.new_zeros.default"]["dtypes"] == ["float32", "bool"]
    # never passed, failed alone in float32 only: loses float32, keeps the untried dtypes
    assert new["ops"]["aten.new_ones.default"]["dtypes"] == ["int64", "bool"]
    # failed alone in every dtype it allowed: removed, with the reason
    assert "aten.new_full.default" not in new["ops"]
    assert list(new["probe"]["failed"]) == ["aten.new_full.default"]


def test_every_declared_dtype_failing_allows_none():
    """`dtypes: []` means none (not the defaults) once the probe dropped them all."""
    from arbiter.probe import ProbeResult

    r = ProbeResult("x", "x 1.0", str(torch.__version__), ["float32"])
    add, mul = "aten.add.Tensor", "aten.mul.Tensor"
    r.record(_sample("addcmul", "float32", [add, mul], "failed"), {(add, "float32"), (mul, "float32")})
    doc = {"backend": "x", "ops": {add: {}, mul: {}}}  # defaults: [float32]
    m = Manifest.model_validate(manifest_update(doc, r))
    assert m.ops[add].dtypes == [] and m.entry(add).dtypes == frozenset()


def test_two_writes_are_idempotent_and_additive(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(DOC, sort_keys=False))
    write_manifest(path, _hand_built())
    once = yaml.safe_load(path.read_text())
    write_manifest(path, _hand_built())
    twice = yaml.safe_load(path.read_text())
    assert twice["ops"] == once["ops"]
    assert twice["probe"]["dtypes_dropped"] == once["probe"]["dtypes_dropped"]
    assert twice["probe"]["opinfos"] == "0/0 + 0/0"  # the record of runs adds up

    from arbiter.probe import ProbeResult

    later = ProbeResult("x", "x 1.0", str(torch.__version__), ["float16"])
    later.record(_sample("cos", "float16", ["aten.cos.default"], "passed"),
                 {("aten.cos.default", "float16")})
    write_manifest(path, later)
    third = yaml.safe_load(path.read_text())
    assert third["ops"]["aten.mul.Tensor"] == once["ops"]["aten.mul.Tensor"]  # kept
    assert third["ops"]["aten.cos.default"]["probed_dtypes"] == ["float16"]
    assert third["probe"]["dtypes_tried"] == ["float32", "float16", "int64", "bool"]


@pytest.mark.parametrize("entry, message", [
    ("{probed_dtypes: [flaot32]}", "unknown dtype 'flaot32'"),
    ("{dtypes: [float32], probed_dtypes: [int64]}", "int64 passed the probe but the entry "
                                                    "does not allow it (dtypes: float32)"),
    ("{probed_dtypes: [bool]}", "(dtypes: float32)"),  # the defaults
])
def test_probed_dtypes_validated(entry, message):
    text = f"backend: x\nformat: 1\nops:\n  aten.mul.Tensor: {entry}\n"
    with pytest.raises(ManifestError) as info:
        parse_manifest(text, "x.yaml")
    assert message in str(info.value)
    assert "x.yaml:4: ops['aten.mul.Tensor'].probed_dtypes" in str(info.value)


# -- outputs a sample does not return (saved for backward) -------------------------------------
NLL_OPS = ["aten._log_softmax.default", "aten.nll_loss_forward.default"]


def _total_weight_wrong(self, gm, example_inputs):
    """Right loss, total_weight always 1 (what torchlib's nll_loss_forward did), when a
    graph returns it."""
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    bad = [k for k, a in enumerate(out_node.args[0]) if a.target is operator.getitem
           and a.args[0].target is torch.ops.aten.nll_loss_forward.default and a.args[1] == 1]

    def fn(*args):
        out = list(gm(*args))
        for k in bad:
            out[k] = torch.full_like(out[k], 1.0)
        return out
    return fn


def test_expose_outputs_adds_the_unreturned_outputs():
    from arbiter.probe.opinfo import expose_outputs
    from conftest import trace

    x, y = torch.randn(8, 4), torch.randint(0, 4, (8,))
    gm = trace(lambda x, y: torch.nn.functional.nll_loss(torch.log_softmax(x, 1), y), x, y)
    added = expose_outputs(gm)
    assert [(str(n.target), k) for n, k in added] == [("aten.nll_loss_forward.default", 1)]
    loss, total_weight = gm(x, y)
    assert float(total_weight) == 8.0


def test_probe_records_a_wrong_unreturned_output(make_backend, tmp_path):
    cls = make_backend("nll", NLL_OPS, compile=_total_weight_wrong)
    result = probe(cls(), ops=["nn.functional.nll_loss"], dtypes=["float32"])
    op = "aten.nll_loss_forward.default"
    # the loss itself is right: the op is credited, its output 1 is not
    assert "float32" in result.passed[op]
    assert set(result.wrong_outputs(op)) == {1}
    assert "differs from eager" in result.wrong_outputs(op)[1]["float32"]
    out = tmp_path / "m.yaml"
    write_manifest(cls.manifest_path(), result, out=out)
    m = load_manifest(out, backend="nll")
    assert set(m.ops[op].wrong_outputs) == {1}
    assert [(k, d) for k, d, _ in m.entry(op).wrong_outputs] == [(1, {torch.float32})]
    # a later probe where output 1 comes back right lifts it
    fixed = make_backend("nll2", NLL_OPS)
    again = probe(fixed(), ops=["nn.functional.nll_loss"], dtypes=["float32"])
    assert again.outputs_passed[op] == {(1, "float32")} and not again.wrong_outputs(op)
    doc = manifest_update(yaml.safe_load(out.read_text()), again)
    assert "wrong_outputs" not in doc["ops"][op]


def test_wrong_output_refuses_only_nodes_that_use_it(make_backend):
    from arbiter.plan.capability import CapabilityTable
    from conftest import trace

    cls = make_backend("nll", NLL_OPS)
    m = cls.manifest()
    m.ops["aten.nll_loss_forward.default"].wrong_outputs = {1: {"float32": "total_weight"}}
    m.defaults.dtypes = ["float32", "float64", "int64"]  # float64: right in this dtype
    m._resolved.cache_clear()
    eager = arbiter.get_backend_class("eager")
    table = CapabilityTable([cls(), eager()])
    x, y = torch.randn(8, 4), torch.randint(0, 4, (8,))

    def loss_only(x, y):
        return torch.ops.aten.nll_loss_forward(x, y, None, 1, -100)[0]

    def both(x, y):
        loss, tw = torch.ops.aten.nll_loss_forward(x, y, None, 1, -100)
        return loss / tw

    for fn, ok, x in ((loss_only, True, x), (both, False, x), (both, True, x.double())):
        node = next(n for n in trace(fn, x, y).graph.nodes
                    if n.target is torch.ops.aten.nll_loss_forward.default)
        sup = table.support(node)
        assert ("nll" in sup.candidates) is ok, sup
        if not ok:
            assert "output 1 is used" in sup.refusals["nll"]


def test_a_build_probe_writes_built_and_never_downgrades_a_run():
    """`--build-only` marks what built `verified: built` with `built_dtypes`; an entry a
    run already verified stays `probed`; a later run that fails a dtype that was only
    built drops it (building says nothing of the numbers)."""
    from arbiter.probe import ProbeResult

    add, mul = "aten.add.Tensor", "aten.mul.Tensor"
    build = ProbeResult("x", "x 1.0", str(torch.__version__), ["float32", "int64"],
                        mode="build")
    for op in (add, mul):
        for dt in ("float32", "int64"):
            build.record(_sample(op, dt, [op], "passed"), {(op, dt)})
    doc = {"backend": "x", "defaults": {"dtypes": ["float32", "int64"]},
           "ops": {add: {"verified": "probed", "probed_dtypes": ["float32"]}, mul: {}}}
    new = manifest_update(doc, build)
    assert new["ops"][add] == {"verified": "probed", "probed_dtypes": ["float32"],
                               "built_dtypes": ["float32", "int64"]}
    assert new["ops"][mul] == {"verified": "built", "built_dtypes": ["float32", "int64"]}
    assert new["probe"]["mode"] == "build"
    Manifest.model_validate(new)
    run = ProbeResult("x", "x 1.0", str(torch.__version__), ["int64"])
    run.record(_sample("mul", "int64", [mul], "failed"), {(mul, "int64")})
    after = manifest_update(new, run)
    assert after["ops"][mul]["dtypes"] == ["float32"]
    assert "mode" not in after["probe"]  # a run's record starts again


@pytest.mark.parametrize("key", ["probed_dtypes", "built_dtypes"])
def test_passed_dtypes_must_be_allowed(key):
    with pytest.raises(ManifestError, match=rf"ops\['aten.add.Tensor'\].{key}: int64 passed"):
        parse_manifest(f"backend: x\nops:\n  aten.add.Tensor: {{dtypes: [float32], "
                       f"{key}: [int64]}}\n")


def test_a_dtype_neither_allowed_nor_tried_skips_the_sample(make_backend):
    """embedding reads int64 indices: with the entry allowing float32 only, a float32
    probe skips the sample (arbiter never hands such a node to the backend); trying int64
    runs it, and the pass adds int64."""
    cls = make_backend("emb", ["aten.embedding.default"])
    m = cls.manifest()
    m.ops["aten.embedding.default"].dtypes = ["float32"]
    m._resolved.cache_clear()
    [skipped] = probe(cls(), ops=["nn.functional.embedding"], dtypes=["float32"]).samples
    assert (skipped.status, skipped.stage) == ("skipped", "dtype")
    assert skipped.reason.startswith("aten.embedding.default in int64: neither allowed")
    result = probe(cls(), ops=["nn.functional.embedding"], dtypes=["float32", "int64"])
    assert result.passed["aten.embedding.default"] == {"float32", "int64"}


def test_wrong_numbers_alone_leave_a_dtype_allowed_but_unverified():
    """var_mean on OpenVINO: right with a dim, wrong over every dim (float32): the dtype
    passed, so it stays allowed, but it is not verified (`probed_dtypes`) on these
    versions, whatever a later run passes; other versions start again."""
    from arbiter.probe import ProbeResult, SampleResult

    vm = "aten.var_mean.correction"

    def result(version, *statuses):
        r = ProbeResult("x", version, str(torch.__version__), ["float32"])
        for status in statuses:
            r.record(SampleResult("var_mean", "float32", [vm], status,
                                  "" if status == "passed" else "numbers",
                                  "" if status == "passed" else "max abs error 0.195"),
                     {(vm, "float32"), (vm, "int64")})
        return r

    doc = {"backend": "x", "defaults": {"dtypes": ["float32", "int64"]}, "ops": {vm: {}}}
    once = manifest_update(doc, result("x 1.0", "passed", "failed"))
    assert once["ops"][vm] == {"verified": "probed", "probed_dtypes": ["int64"]}
    assert once["probe"]["unverified"] == {vm: {"float32": "numbers: max abs error 0.195"}}
    Manifest.model_validate(once)
    again = manifest_update(once, result("x 1.0", "passed"))  # the failing sample not run
    assert again["ops"][vm]["probed_dtypes"] == ["int64"] and again["probe"]["unverified"]
    fixed = manifest_update(once, result("x 2.0", "passed"))
    assert fixed["ops"][vm]["probed_dtypes"] == ["float32", "int64"]
    assert "unverified" not in fixed["probe"]


def test_a_dtype_the_backend_holds_narrower_skips_the_sample(make_backend):
    """A backend with ``narrow_dtypes`` (OpenVINO's int64) is never handed a node with a
    tensor of that dtype (capability.py): the probe skips such a sample as a validator's
    refusal, neither crediting nor blaming the dtype; ``narrow_dtype_ops`` are run."""
    cls = make_backend("narrow64", OPS, compile=_sin_wrong)
    cls.narrow_dtypes = {torch.int64: "held in 32 bits"}
    result = probe(cls(), ops=["add", "sin"], dtypes=["float32", "int64"])
    int64 = [s for s in result.samples if s.dtype == "int64"]
    assert int64 and all((s.status, s.stage) == ("skipped", "validator") for s in int64)
    assert "dtype int64: held in 32 bits" in int64[0].reason
    assert result.passed["aten.add.Tensor"] == {"float32"}
    assert "int64" not in result.failed.get("aten.sin.default", {})
    cls.narrow_dtype_ops = frozenset({"aten.add.Tensor"})
    assert "int64" in probe(cls(), ops=["add"], dtypes=["int64"]).passed["aten.add.Tensor"]


def test_opinfo_names_that_match_nothing_are_an_error():
    """``--ops`` with a misspelt OpInfo name (or a variant that does not exist) is an
    error naming it, with close names; a variant selects that variant only."""
    from arbiter.errors import ArbiterError
    from arbiter.probe.sampling import label, opinfos

    assert [label(o) for o in opinfos(["max.binary"])] == ["max.binary"]
    assert len(opinfos(["max"])) > 1
    with pytest.raises(ArbiterError, match=r"no OpInfo matches 'max\.bniary' \(close: max\.binary"):
        opinfos(["add", "max.bniary"])
