"""Saved programs of every format version load: files written by earlier arbiters
(tests/fixtures/programs/, made by make_programs.py there and never refreshed) give the
model's outputs, rebuild the chain they were saved with, and say how each partition
loaded. Tiny models: the configs set ``against_eager: off``."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import arbiter
from arbiter.cli.examples import mlp

HERE = Path(__file__).resolve().parent / "fixtures" / "programs"

SYMBOLIC = ["onnxruntime (symbolic)", "onnxruntime (per shape)", "eager"]
#: file -> (its format version, the chain at load, how partition 0 loads, batch sizes)
FILES = {
    "mlp_onnxruntime_symbolic_v3": (3, SYMBOLIC, "saved artifact", (2, 8, 40)),
    "mlp_onnxruntime_symbolic_v2": (2, SYMBOLIC, "saved artifact", (2, 8, 40)),
    "mlp_onnxruntime_symbolic_v1": (1, SYMBOLIC, "saved artifact", (2, 8, 40)),
    "mlp_onnxruntime_static_v3": (3, ["onnxruntime", "eager"], "saved artifact", (8,)),
    "mlp_onnxruntime_pershape_v3": (3, ["onnxruntime (per shape)", "eager"], "pending",
                                    (3, 8)),
    "mlp_openvino_symbolic_v3": (3, ["openvino (symbolic)", "openvino (per shape)", "eager"],
                                 "saved artifact", (2, 8, 40)),
    "mlp_eager_symbolic_v3": (3, ["eager"], "eager", (2, 8)),
}
# version 4 (links): the same programs
FILES.update({k.replace("_v3", "_v4"): (4, *v[1:]) for k, v in FILES.items() if k.endswith("_v3")})


@pytest.mark.parametrize("name", sorted(FILES))
def test_a_saved_file_loads(name):
    version, chain, how, batches = FILES[name]
    if "openvino" in name:
        pytest.importorskip("openvino")
    program = arbiter.load(HERE / f"{name}.arbiter")
    assert program.deployed.format_version == version
    assert program.deployed.check == "passed"
    model, _ = mlp()
    for n in batches:
        x = torch.randn(n, 32)
        with torch.no_grad():
            torch.testing.assert_close(program(x), model(x), atol=1e-5, rtol=1e-5)
    rep = program.report()
    assert rep.deployed.partitions[0].loaded == how
    part = rep.graphs[0].partitions[0]
    # the chain at load: the saved artifact (when one loaded), then the saved chain from
    # the level it ran at (the same backend compiled again from ATen, ..., eager)
    loaded = part.chain
    if how == "saved artifact":
        assert loaded[0] == f"{chain[0].partition(' (')[0]} (saved)", loaded
        loaded = loaded[1:]
    assert loaded == chain
    # nothing fell back at load (the saved report's own fallbacks stay in it)
    assert not [f for f in part.fallbacks if f.stage in ("load", "verify")], part.fallbacks


def _saved_symbolic(path: Path) -> None:
    model, args = mlp()
    batch = ({0: torch.export.Dim("batch", min=2, max=64)},)
    arbiter.export(model, args, dynamic_shapes=batch,
                   config={"backends": ["onnxruntime"], "against_eager": "off"}).save(path)


def test_the_loader_follows_a_changed_label(tmp_path, monkeypatch):
    """Labels are derived from links, never read back: with another label layout the
    file saves and loads the same chain, shown in the new layout."""
    from arbiter.run.chain import Link

    pytest.importorskip("onnxruntime")
    monkeypatch.setattr(Link, "label", property(
        lambda k: f"{k.name} <{k.mode.value}>" if k.mode.value != "static" else k.name))
    _saved_symbolic(tmp_path / "p.arbiter")
    program = arbiter.load(tmp_path / "p.arbiter")
    assert program.deployed.check == "passed"
    part = program.report().graphs[0].partitions[0]
    assert part.chain == ["onnxruntime <saved>", "onnxruntime <symbolic>",
                          "onnxruntime <per shape>", "eager"]
    model, _ = mlp()
    x = torch.randn(5, 32)
    with torch.no_grad():
        torch.testing.assert_close(program(x), model(x), atol=1e-5, rtol=1e-5)


def test_the_loader_follows_a_changed_mode(tmp_path):
    """A file whose partition's links say "per shape" where its labels say "symbolic"
    (links edited, the artifact dropped) loads the links' chain: the partition compiles
    per shape at load; the labels are not read."""
    import json
    import zipfile

    pytest.importorskip("onnxruntime")
    src, dst = tmp_path / "p.arbiter", tmp_path / "q.arbiter"
    _saved_symbolic(src)
    with zipfile.ZipFile(src) as zin:
        m = json.loads(zin.read("manifest.json"))
        part = m["plan"]["partitions"][0]
        assert [k["mode"] for k in part["links"]] == ["symbolic", "per shape", "static"]
        assert part["chain"][0] == "onnxruntime (symbolic)"
        part["links"][0]["mode"] = "per shape"
        part["artifact"], part["not_saved"] = None, "dropped by the test"
        with zipfile.ZipFile(dst, "w") as zout:
            for info in zin.infolist():
                blob = zin.read(info.filename)
                zout.writestr(info.filename, json.dumps(m).encode()
                              if info.filename == "manifest.json" else blob)
    program = arbiter.load(dst)
    assert program.deployed.check == "passed"
    model, _ = mlp()
    x = torch.randn(5, 32)
    with torch.no_grad():
        torch.testing.assert_close(program(x), model(x), atol=1e-5, rtol=1e-5)
    got = program.report().graphs[0].partitions[0]
    assert got.chain == ["onnxruntime (per shape)", "onnxruntime (per shape)", "eager"]
    assert got.backend == "onnxruntime" and got.shapes == "per shape"
    assert got.specializations == 2  # the check's batch of 8, then 5
