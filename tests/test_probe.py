"""`arbiter probe`: OpInfo samples through one backend alone vs eager; manifest updates."""
from __future__ import annotations

import pytest
import torch
import yaml

import arbiter
from arbiter.manifest import load_manifest
from arbiter.probe import manifest_update, probe, write_manifest

OPS = ["aten.add.Tensor", "aten.mul.Tensor", "aten.sin.default", "aten.cos.default"]


def _sin_wrong(self, gm, example_inputs):
    """A backend that computes every op right except sin (off by 0.1)."""
    uses_sin = any(n.target is torch.ops.aten.sin.default for n in gm.graph.nodes)

    def fn(*args):
        out = list(gm(*args))
        return [o + 0.1 for o in out] if uses_sin else out
    return fn


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
    assert m.ops["aten.add.Tensor"].dtypes == ["float32"]
    assert "aten.sin.default" not in m.ops  # every sample of it alone failed
    assert "aten.sin.default" in m.probe.failed
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
    assert new["ops"]["aten.add.Tensor"] == {"note": "kept", "dtypes": ["float32", "int64"],
                                              "verified": "probed"}
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
    assert load_manifest(out, backend="onnxruntime").ops["aten.mul.Tensor"].dtypes == ["float32"]


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
