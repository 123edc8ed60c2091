"""`arbiter report` as a user runs it: built-in examples, a user's file, side by side."""
from __future__ import annotations

import json
import textwrap

import pytest

from arbiter.cli import main
from arbiter.report import Report
from arbiter.report.schema import schema
from conftest import run_cli

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (test extra) missing")

USER_MODEL = textwrap.dedent("""\
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(16, 16)
            self.b = torch.nn.Linear(16, 4)

        def forward(self, x):
            h = torch.relu(self.a(x))
            torch._dynamo.graph_break()
            return self.b(h).softmax(-1)

    def build():
        torch.manual_seed(0)
        return Net(), (torch.randn(3, 16),)
    """)


_run = run_cli


@pytest.mark.parametrize("model", ["mlp", "encoder_block", "small_cnn", "gpt2_tiny"])
def test_dry_run_each_builtin(model, tmp_path, capsys):
    if model == "gpt2_tiny":
        pytest.importorskip("transformers", reason="gpt2_tiny needs transformers")
    js, page = tmp_path / "r.json", tmp_path / "r.html"
    out, _ = _run(["report", model, "--dry-run", "--json", str(js), "--html", str(page)], capsys)
    assert out.startswith("[dry run] ")
    data = json.loads(js.read_text())
    jsonschema.validate(data, schema())
    rep = Report.model_validate(data)
    assert rep.dry_run and rep.model == model and rep.graphs
    assert all(not p.compiled and p.backend is None and p.compile_s == 0
               for g in rep.graphs for p in g.partitions)
    parts = sum(len(g.partitions) for g in rep.graphs)
    assert page.read_text().count('class="partition-box"') == parts
    # off a terminal: tables within 100 columns where their words allow, wrapped between
    # words, never inside one (they once read `_native_batch_nor` / `m_legit_no_traini`)
    words = set(out.split())
    for g in rep.graphs:
        for op in g.ops:
            name = op.op.removeprefix("aten.").removesuffix(".default")
            assert name in words, (name, [w for w in words if w in name])
    assert max(len(line) for line in out.splitlines()) <= 120


def test_user_file_compiled_timed(tmp_path, capsys):
    path = tmp_path / "user_model.py"
    path.write_text(USER_MODEL)
    js = tmp_path / "u.json"
    # priority order: policy calibrated may run a graph this small in eager, whose
    # inline calls are not counted
    cfg = tmp_path / "ort.yaml"
    cfg.write_text("backends: [onnxruntime]\nfallback: [eager]\npolicy: priority\n")
    out, err = _run(["report", f"{path}:build", "--inference", "--time", "5", "--json", str(js),
                     "--config", str(cfg)], capsys)
    rep = Report.model_validate_json(js.read_text())
    jsonschema.validate(json.loads(js.read_text()), schema())
    assert rep.graph_breaks.breaks == 1 and "graph_break" in rep.graph_breaks.reasons[0]
    assert len(rep.graphs) == 2  # one per Dynamo graph
    for g in rep.graphs:
        for p in g.partitions:
            # where policy calibrated put it (a graph this small: the cheapest call)
            assert p.backend == p.planned_backend and not p.fallbacks
            assert p.calls == 5 and p.run_s > 0
    assert rep.timing.calls == 5 and 0 < rep.timing.pieces_s <= rep.timing.total_s
    assert out.splitlines()[0].endswith("; fallbacks: 0; graph breaks: 1; first-use checks: 2")
    # progress: one numbered line per partition compiled (or loaded from the cache)
    assert "[1] graph 0 (inference) partition 0: compiling with onnxruntime" in err
    assert "[2] graph 1 (inference) partition 0: compiling with onnxruntime" in err


def test_side_by_side_configs(tmp_path, capsys):
    a = tmp_path / "ort_only.yaml"
    a.write_text("backends: [onnxruntime]\nmin_block_size: 1\n")
    b = tmp_path / "split.yaml"
    b.write_text("backends: [onnxruntime]\nmin_block_size: 1\nexclude_ops: [aten.gelu]\n")
    js = tmp_path / "both.json"
    out, _ = _run(["report", "mlp", "--dry-run", "--config", str(a), "--config", str(b),
                   "--json", str(js)], capsys)
    data = json.loads(js.read_text())
    jsonschema.validate(data, schema())
    reps = [Report.model_validate(d) for d in data]
    assert [r.label for r in reps] == ["ort_only", "split"]
    assert [sum(len(g.partitions) for g in r.graphs) for r in reps] == [1, 3]
    head = out.splitlines()[:3]
    assert "side by side" in head[0] and "ort_only" in head[2] and "split" in head[2]


def test_bad_model_names_valid_ones(capsys):
    assert main(["report", "mpl", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'mpl'" in err and "did you mean 'mlp'" in err
