"""A fast, talkative CLI (issue 15, item 6): ``--help``/``--version`` without torch,
progress that never shares a line with a log line, tables that wrap instead of cut."""
from __future__ import annotations

import logging
import re
import subprocess
import sys

import pytest

import arbiter
from arbiter.report import (BackendStatus, GraphReport, OpReport, PartitionReport, Report,
                            TensorReport)
from arbiter.report.text import render

CHECK = ("import sys; from arbiter.cli import main\n"
         "try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
         "print('\\nHEAVY', sorted(m for m in ('torch', 'pydantic', 'rich', 'onnxruntime') "
         "if m in sys.modules))")


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["report", "--help"],
                                  ["probe", "--help"]])
def test_help_and_version_import_no_torch(args):
    """Before: `arbiter --help` imported torch (4-8 s)."""
    out = subprocess.run([sys.executable, "-c", CHECK.format(args=args)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "HEAVY []"
    if args == ["--version"]:
        assert f"torch-arbiter {arbiter.__version__}" in out.stdout


def test_import_arbiter_is_lazy_and_no_function_shadows_a_submodule():
    code = ("import sys, arbiter; a = 'torch' in sys.modules\n"
            "from arbiter.report.html import render_html\n"
            "import arbiter.report.text\n"
            "print(a, callable(arbiter.report_for), arbiter.report.__name__, "
            "arbiter.Report.__name__, 'explain' in dir(arbiter))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.split() == ["False", "True", "arbiter.report", "Report", "True"]


def _report(reason: str) -> Report:
    part = PartitionReport(
        id=0, planned_backend="onnxruntime", compiled=True, backend="onnxruntime", nodes=3,
        ops={"aten.addmm.default": 1}, node_names=["a"], chain=["onnxruntime"],
        inputs=[TensorReport(name="w", shape=[768, 768], dtype="float32", source="constant"),
                TensorReport(name="x", shape=[1, 128, 768], dtype="float32",
                             source="graph input")])
    op = OpReport(op="aten.native_layer_norm.default", nodes=2, able=["eager"],
                  placed={"eager": 2}, refused={"onnxruntime": reason})
    return Report(backends=[BackendStatus(name="onnxruntime", available=True),
                            BackendStatus(name="eager", available=True)],
                  graphs=[GraphReport(graph_id=0, kind="inference", nodes=3,
                                      partitions=[part], ops=[op])])


@pytest.mark.parametrize("width", [100, 160])
def test_tables_wrap_reasons_instead_of_cutting(width):
    """Before: "refused by: why" showed `onnxruntime: exc…` even at --width 160, and the
    in/out column showed a frozen weight instead of the data input."""
    reason = ("excluded by the config's exclude_ops; and a long tail that names the file "
              "capabilities/onnxruntime.yaml and the dtype float16 it does not allow")
    text = render(_report(reason), width=width)
    assert "…" not in text
    flat = re.sub(r"\s+", "", text)
    assert re.sub(r"\s+", "", reason) in flat
    assert "1x128x768+1->" in flat  # the data input first, not the 768x768 weight
    assert max(len(line) for line in text.splitlines()) <= width


def test_progress_lines_never_share_a_line_with_log_lines(capsys):
    """Off a terminal: each stage, compile and warning is a whole line on stderr."""
    from arbiter.cli.progress import Progress

    log = logging.getLogger("arbiter.run.piece")
    with Progress() as progress:
        progress.stage("loading mlp")
        logging.getLogger("arbiter.arbiter").info(
            "graph 0 (inference): 9 nodes in 2 partitions (eager, onnxruntime), planned in "
            "0.1 ms (policy priority); 1 to compile")
        log.info("graph 0 (inference) partition 0: compiling with onnxruntime")
        log.warning("graph 0 (inference) partition 0: onnxruntime failed to compile (boom); "
                    "falling back to eager")
        progress.stage("timing 3 calls", 3)
    err = capsys.readouterr().err.splitlines()
    assert err == ["arbiter: loading mlp",
                   "arbiter: [1] graph 0 (inference) partition 0: compiling with onnxruntime",
                   "arbiter: graph 0 (inference) partition 0: onnxruntime failed to compile "
                   "(boom); falling back to eager",
                   "arbiter: timing 3 calls (3)"]
    assert logging.getLogger("arbiter").propagate  # restored


def test_rich_progress_counts_compiles_and_prints_logs_above(monkeypatch):
    """On a terminal: a rich bar of partitions compiled; warnings print above it."""
    pytest.importorskip("rich")
    import io

    from rich.console import Console

    from arbiter.cli import progress as mod

    buf = io.StringIO()
    real = Console
    monkeypatch.setattr("rich.console.Console",
                        lambda **kw: real(file=buf, force_terminal=True, width=100))
    with mod.Progress() as p:
        assert p._rich is not None
        p.stage("tracing")
        logging.getLogger("arbiter.arbiter").info("graph 0: 5 nodes in 3 partitions (a, b), "
                                                  "planned in 0.1 ms (policy x); 2 to compile")
        logging.getLogger("arbiter.run.piece").info("graph 0 partition 1: compiled with a in 1 s")
        logging.getLogger("arbiter.run.piece").warning("something odd")
        task = p._task(p._tasks["compile"])
        assert (task.completed, task.total) == (1, 2)
    out = buf.getvalue()
    assert "something odd" in out and "compiling partitions" in out
