"""The bench model zoo: builders give the same model and inputs in every process (the
bench compares outputs across processes), and bench/zoo.py runs end to end."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from arbiter.cli import examples

ROOT = Path(__file__).resolve().parents[1]


def test_zoo_names_and_seed_mlp():
    assert set(examples.ZOO) == {"mlp", "bert_base", "gpt2_small", "resnet50", "vit_base",
                                 "distilbert", "t5_small_encoder"}
    assert set(examples.ZOO) <= set(examples.EXAMPLES)
    model, (x,) = examples.ZOO["mlp"]()
    assert tuple(x.shape) == (8, 32) and tuple(model(x).shape) == (8, 32)


def test_zoo_builder_is_deterministic_eval_float32():
    pytest.importorskip("transformers", reason="transformers is not installed: pip install "
                        "'torch-arbiter[examples]'")
    m1, (x1,) = examples.t5_small_encoder()
    m2, (x2,) = examples.t5_small_encoder()
    assert not m1.training and all(p.dtype == torch.float32 for p in m1.parameters())
    assert tuple(x1.shape) == (1, examples.ZOO_SEQ) and torch.equal(x1, x2)
    with torch.no_grad():
        assert torch.equal(m1(x1), m2(x2))


@pytest.mark.slow
def test_zoo_bench_smoke(tmp_path):
    for mod in ("onnxruntime", "openvino"):
        pytest.importorskip(mod, reason=f"{mod} is not installed")
    out = tmp_path / "r.md"
    subprocess.run([sys.executable, str(ROOT / "bench" / "zoo.py"), "--models", "mlp",
                    "--contenders", "eager", "onnxruntime", "openvino", "--rounds", "1",
                    "--round-s", "0.05", "--out", str(out)], check=True, timeout=600,
                   capture_output=True)
    text = out.read_text()
    for name in ("eager", "onnxruntime", "openvino"):
        row = next(ln for ln in text.splitlines() if ln.startswith(f"| {name} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert re.fullmatch(r"[0-9.]+", cells[1]), row  # a measured median
        assert float(cells[5]) < 1e-4, row  # max error vs eager


@pytest.mark.slow
def test_zoo_bench_compiles_each_contender_cold(tmp_path):
    """Two arbiter contenders with the same placement each export their own ONNX model,
    into their own cache: neither is served the other's (the compile times are cold)."""
    import os

    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    run = tmp_path / "run"
    env = dict(os.environ, ARBITER_CACHE_DIR=str(run),
               ARBITER_CALIBRATION=str(ROOT / "tests" / "calibration_reference.json"))
    subprocess.run([sys.executable, str(ROOT / "bench" / "zoo.py"), "--models", "mlp",
                    "--contenders", "eager", "arbiter_default", "arbiter_cpu_all",
                    "--rounds", "1", "--round-s", "0.05", "--out", str(tmp_path / "r.md")],
                   check=True, timeout=600, capture_output=True, env=env)
    text = (tmp_path / "r.md").read_text()
    assert "ran: onnxruntime 100%" in text  # both ran the seed MLP on ONNX Runtime
    for name in ("arbiter_default", "arbiter_cpu_all"):
        models = list((run / "mlp" / name).glob("onnx/*/*.bin"))
        assert len(models) == 1, (name, models)  # exported here, not read from elsewhere
    assert not (run / "onnx").exists()  # nothing in a cache the contenders share
