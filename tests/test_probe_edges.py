"""`arbiter probe BACKEND --edges` (arbiter/probe/edges.py): edge-value samples through
one backend, compared with eager, with what the backend refuses named."""
from __future__ import annotations

import json

import pytest
import torch

import arbiter
from arbiter.probe.edges import SAMPLES, probe_edges, summary

from test_hostile_numbers import _NanDropper  # NaN outputs become 0: a mean over nothing, relu(0/0)


class _Eager(arbiter.Backend):
    """Computes every graph as eager does."""

    name = "same_as_eager"

    def compile(self, gm, example_inputs):
        return gm


def _manifest_of_everything(monkeypatch, tmp_path, cls):
    """The backend takes every op (a manifest with a wildcard entry)."""
    path = tmp_path / f"{cls.name}.yaml"
    path.write_text(f"backend: {cls.name}\nformat: 1\ndefaults:\n  dtypes: [float32, "
                    "int64, int32, bool]\n  devices: [cpu]\nops:\n  \"*\": {}\n")
    monkeypatch.setattr(cls, "manifest_path", classmethod(lambda c: path))


def test_samples_are_distinct_and_eager_matches_them_all(monkeypatch, tmp_path):
    assert len({s.name for s in SAMPLES}) == len(SAMPLES)
    assert {s.edge for s in SAMPLES} == {"integer overflow", "empty", "huge",
                                         "NaN made inside", "outputs"}
    _manifest_of_everything(monkeypatch, tmp_path, _Eager)
    results = probe_edges(_Eager())
    assert [r.status for r in results] == ["matched"] * len(SAMPLES), \
        [(r.name, r.status, r.detail) for r in results]
    assert not any(r.refused for r in results)


def test_a_backend_that_drops_nan_is_silently_wrong(monkeypatch, tmp_path):
    _manifest_of_everything(monkeypatch, tmp_path, _NanDropper)
    names = ["mean_empty", "relu_of_0_over_0", "pow_int64_overflow"]
    results = {r.name: r for r in probe_edges(_NanDropper(), names)}
    assert results["mean_empty"].silent and results["relu_of_0_over_0"].silent
    assert results["pow_int64_overflow"].status == "matched"
    lines = summary("nan_dropper", list(results.values()))
    assert "2 silently wrong" in lines[0] and lines[1].startswith("  SILENT ")


def test_unknown_sample_names_are_an_error():
    with pytest.raises(ValueError, match="unknown edge samples"):
        probe_edges(_Eager(), ["mean_empty", "no_such_sample"])


def test_cli_on_onnx_runtime(tmp_path, capsys):
    """What ONNX Runtime gets wrong at these edges is refused: nothing is silent."""
    pytest.importorskip("onnxruntime")
    from arbiter.cli import main

    js = tmp_path / "edges.json"
    names = ["pow_int64_overflow", "mean_empty_dim", "remainder_1e8",
             "embedding_bag_max_outputs", "relu_of_0_over_0"]
    assert main(["probe", "onnxruntime", "--edges", "--ops", *names, "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "5 edge samples, 0 silently wrong" in out
    rows = {r["name"]: r for r in json.loads(js.read_text())}
    assert rows["remainder_1e8"]["status"] == "matched"  # the export's own translation
    assert rows["pow_int64_overflow"]["status"] == "differs"  # what ONNX Runtime computes,
    assert "integer pow" in rows["pow_int64_overflow"]["refused"]  # and why it is refused
    assert "offset2bag" in rows["embedding_bag_max_outputs"]["refused"]
    assert main(["probe", "onnxruntime", "--edges", "--write"]) != 0
    assert "writes nothing" in capsys.readouterr().err
