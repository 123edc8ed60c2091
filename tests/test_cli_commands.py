"""The commands as a new user meets them (issue 30): help that describes every option and
names the built-in models, quiet exit on a closed pipe, `arbiter cache` listing by default,
a `backends` table that stays a table, install hints only for what is missing, the same
training-or-inference choice in `explain` and `report`, files without padded tables, and
a demo speed line that says when the machine is too busy to time."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import textwrap

import pytest

from arbiter.cli import main
from arbiter.cli.main import _parser
from arbiter.cli.models import EXAMPLE_MODELS
from conftest import run_cli

TRAIN_MODEL = textwrap.dedent("""\
    import torch

    def build():  # a fresh module is in training mode, as PyTorch makes it
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        return net, (torch.randn(3, 8),)
    """)


_run = run_cli


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_builtin_model_names_are_the_examples():
    from arbiter.cli.examples import EXAMPLES

    assert list(EXAMPLE_MODELS) == list(EXAMPLES)


@pytest.mark.parametrize("command", ["explain", "demo", "report", "cache", "backends",
                                     "probe", "calibrate"])
def test_every_option_is_described(command):
    """Before: `arbiter explain --help` and `arbiter demo --help` described none of their
    options."""
    sub = _subparsers()[command]
    for action in sub._actions:
        assert action.help, f"arbiter {command}: {action.option_strings or action.dest}"
    if command in ("explain", "demo", "report"):
        text = sub.format_help()
        assert all(name in text for name in EXAMPLE_MODELS), text  # the built-in models


def test_top_help_has_no_rst_and_names_the_models():
    text = _parser().format_help()
    assert "``" not in text
    description = text.split("\n\n")[1]
    assert description.startswith("arbiter: one torch.compile backend") and "`" not in description
    assert all(name in text for name in EXAMPLE_MODELS)


@pytest.mark.parametrize("args", [["explain", "--help"], ["demo", "--help"],
                                  ["cache", "--help"], ["backends", "--help"],
                                  ["calibrate", "--help"]])
def test_help_imports_no_torch(args):
    from test_cli import CHECK

    out = subprocess.run([sys.executable, "-c", CHECK.format(args=args)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "HEAVY []"


def test_cache_help_keeps_its_usage_lines_and_lists_by_default(tmp_path, capsys):
    """Before: `arbiter cache` without an action was an error, and its --help reflowed the
    usage lines into one paragraph."""
    text = _subparsers()["cache"].format_help()
    assert "\n    arbiter cache size  [--dir D | --config C]" in text
    d = tmp_path / "cache"
    (d / "onnx" / "ab").mkdir(parents=True)
    (d / "onnx" / "ab" / "k1.bin").write_bytes(b"xx")
    d.chmod(0o700)
    assert main(["cache", "--dir", str(d)]) == 0
    out = capsys.readouterr().out
    assert "1 entry, 2 B in" in out and "k1" in out


def _closed_pipe(args: list[str], cwd) -> subprocess.CompletedProcess:
    """Run ``arbiter ARGS`` with its stdout a pipe nobody reads: closed before it prints."""
    proc = subprocess.Popen([sys.executable, "-m", "arbiter.cli", *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone (`| head` after its lines)
    err = proc.stderr.read().decode()
    return subprocess.CompletedProcess(args, proc.wait(timeout=120), "", err)


@pytest.mark.parametrize("args", [["cache", "list", "--dir", "CACHE"], ["schema"],
                                  ["--help"]])
def test_closed_pipe_exits_quietly(args, tmp_path):
    """Before: `arbiter cache list | head` ended in a BrokenPipeError traceback."""
    d = tmp_path / "cache"
    (d / "onnx" / "ab").mkdir(parents=True)
    for k in range(3000):  # more than a pipe's buffer
        (d / "onnx" / "ab" / f"k{k}.bin").write_bytes(b"x")
    d.chmod(0o700)
    done = _closed_pipe([str(d) if a == "CACHE" else a for a in args], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Error" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_backends_table_keeps_its_columns_and_wraps_reasons():
    """Before: the tensorrt and triton rows (reasons of 200+ characters) broke the table."""
    from arbiter.cli.backends import table_lines

    why = ("no GPU driver for triton 3.9.0 (RuntimeError: 0 active drivers ([]). There "
           "should only be one.); TRITON_INTERPRET=1, set before triton is imported, runs "
           "its kernels in Triton's interpreter on CPU tensors (slow: for tests)")
    rows = [("eager", "available", "all ops", "2.13.0+cpu", ""),
            ("triton", "unavailable", "no ops, 4 patterns", "-", why)]
    lines = table_lines(rows, 80)
    head, rule, eager, triton, *reason = lines
    assert head.split() == ["backend", "status", "manifest", "version"]
    col = head.index("manifest")
    assert eager[col:].startswith("all ops") and triton[col:].startswith("no ops, 4 patterns")
    assert all(line.startswith("  ") and len(line) <= 80 for line in reason)
    assert " ".join(x.strip() for x in reason) == why
    assert all(line == line.rstrip() for line in lines)


def test_install_hint_only_when_a_package_is_missing():
    """Before: triton, installed, said `install: pip install 'torch-arbiter[triton]'` when
    it lacked a GPU driver."""
    from arbiter.backend import Backend
    from arbiter.registry import install_advice, missing_packages

    class Installed(Backend):
        name = "installed-here"
        install_hint = "pip install 'pyyaml>=6' pydantic"

    class Missing(Backend):
        name = "missing-here"
        install_hint = "pip install no-such-distribution-for-arbiter-tests"

    class Extra(Backend):  # an extra of arbiter itself: its requirements are checked
        name = "extra-here"
        install_hint = "pip install 'torch-arbiter[report]' (the report's tables)"

    assert missing_packages(Installed.install_hint) == []
    assert install_advice(Installed) == ""
    assert missing_packages(Missing.install_hint) == ["no-such-distribution-for-arbiter-tests"]
    assert install_advice(Missing) == f" (install: {Missing.install_hint})"
    try:
        import rich  # noqa: F401  (what the extra `report` installs)
    except ImportError:
        assert missing_packages(Extra.install_hint) == ["rich"]
    else:
        assert missing_packages(Extra.install_hint) == []
    assert missing_packages("apt-get install x") is None  # cannot tell: the hint stays


def test_backends_rows_say_installed_or_how_to_install(make_backend):
    """An unavailable backend whose packages are installed says so, with its version and no
    install command; one missing a package gets the command."""
    from arbiter.cli.backends import rows

    for name, hint in (("nodriver", "pip install pyyaml"),
                       ("notinstalled", "pip install no-such-distribution-for-arbiter-tests")):
        cls = make_backend(name, ["aten.relu.default"], available=(False, "no GPU driver"))
        cls.install_hint = hint
        cls.version = lambda self: "mine 1.0"
    (a, b) = rows(["nodriver", "notinstalled"])
    assert a == ("nodriver", "unavailable", "1 op (declared 1)", "mine 1.0",
                 "installed, but cannot run here: no GPU driver")
    assert b[1] == "unavailable" and b[3] == "-" and b[4] == (
        "no GPU driver (install: pip install no-such-distribution-for-arbiter-tests)")


@pytest.fixture
def train_mode_model(tmp_path):
    path = tmp_path / "net.py"
    path.write_text(TRAIN_MODEL)
    return f"{path}:build"


@pytest.mark.parametrize("flag, kinds", [([], ["backward", "forward"]),
                                         (["--inference"], ["inference"])])
def test_explain_and_report_follow_the_models_mode(flag, kinds, train_mode_model, tmp_path,
                                                   capsys):
    """Before: `explain` traced training by default and `report` inference: one model, two
    plans. Now both follow model.training (a fresh module: training), flags override."""
    out, err = _run(["explain", train_mode_model, *flag], capsys)
    assert sorted(set(re.findall(r"^graph \d+ \((\w+)", out, re.M))) == kinds
    assert "tracing for " + ("inference" if flag else "training") in err
    js = tmp_path / "r.json"
    _run(["report", train_mode_model, "--dry-run", "--json", str(js), *flag], capsys)
    assert sorted(k["kind"] for k in json.loads(js.read_text())["kinds"]) == kinds


def test_builtin_examples_are_traced_for_inference_by_both(capsys, tmp_path):
    out, err = _run(["explain", "mlp"], capsys)
    assert "graph 0 (inference" in out and "the model is in eval mode" in err
    js = tmp_path / "r.json"
    _run(["report", "mlp", "--dry-run", "--json", str(js)], capsys)
    assert [k["kind"] for k in json.loads(js.read_text())["kinds"]] == ["inference"]
    _run(["report", "mlp", "--dry-run", "--train", "--json", str(js)], capsys)
    assert sorted(k["kind"] for k in json.loads(js.read_text())["kinds"]) == ["backward",
                                                                              "forward"]


def test_report_into_a_file_has_no_padded_tables(capsys):
    """Before: redirected to a file, every table was drawn 100 columns wide with trailing
    spaces."""
    out, _ = _run(["report", "mlp", "--dry-run"], capsys)
    lines = out.splitlines()
    assert all(line == line.rstrip() for line in lines)
    # the ops table is as wide as its cells (on a terminal it fills the 100 columns)
    title = lines.index("graph 0: ops")
    rule = next(line for line in lines[title:] if set(line.strip()) == {"─"})
    assert len(rule) < 90, lines[title:title + 5]


def test_backends_shows_the_calibration_the_cache_holds(tmp_path, monkeypatch):
    """`arbiter backends` ends with this machine's calibration for the embedded default's
    backends, from the cache (nothing measured: an empty cache says so)."""
    from arbiter.cli.backends import calibration_lines
    from arbiter.measure import calibration

    monkeypatch.setenv("ARBITER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(calibration.ENV_FILE, raising=False)
    calibration.forget()
    lines = calibration_lines()
    assert lines[0].startswith("calibration on this machine (")
    rows = dict(line.strip().split(": ", 1) for line in lines[1:])
    assert "eager" in rows and "onnxruntime" in rows
    assert set(rows.values()) == {"not calibrated"}
    # a pinned file is what `calibrated` reads instead: said last
    monkeypatch.setenv(calibration.ENV_FILE, "/some/where/calibration.json")
    pinned = calibration_lines()
    assert pinned[:-1] == lines
    assert "pinned file /some/where/calibration.json" in pinned[-1]


def test_output_paths_and_dynamic_ranges_are_checked_before_the_work(tmp_path, capsys,
                                                                      monkeypatch):
    # Before: a raw traceback after the whole compile (report --html to a missing folder,
    # export --out a directory), or torch's AssertionError for --dynamic 0.0=64:2.
    from arbiter.cli import report as report_cmd

    monkeypatch.setattr(report_cmd, "build_report", lambda *a, **k: pytest.fail("compiled"))
    cases = [(["report", "mlp", "--html", str(tmp_path / "no" / "r.html")],
              "--html .*the folder .* does not exist"),
             (["report", "mlp", "--json", str(tmp_path)], "--json .*is a directory"),
             (["export", "mlp", "--out", str(tmp_path)], "is a directory"),
             (["export", "mlp", "--out", str(tmp_path / "m.arbiter"), "--dynamic", "0.0=64:2"],
              "MIN 64 is above MAX 2"),
             (["export", "mlp", "--out", str(tmp_path / "m.arbiter"), "--dynamic", "0.5=2:64"],
              r"input 0 has 2 dimension\(s\) \(0 to 1\)"),
             (["export", "mlp", "--out", str(tmp_path / "m.arbiter"), "--dynamic", "0.0=2:64",
               "--dynamic", "0.0=2:32"], "dimension 0 of input 0 is given twice")]
    from arbiter.deploy import saving

    monkeypatch.setattr(saving, "save", lambda *a, **k: pytest.fail("exported"))
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert re.search(message, capsys.readouterr().err), argv
    assert list(tmp_path.iterdir()) == []
    factory = tmp_path / "models.py"
    factory.write_text("notfunc = 3\n")
    assert main(["report", f"{factory}:notfunc", "--dry-run"]) == 2
    assert "is a int, not a function returning (model, inputs)" in capsys.readouterr().err


def test_a_saved_programs_report_refuses_what_would_compile(tmp_path, capsys):
    # Before: `arbiter report x.arbiter --dry-run` / `--config cpu` / `--time 5` were
    # silently ignored (the saved report is read, nothing compiled); `--time -5` accepted.
    path = str(tmp_path / "x.arbiter")
    assert main(["report", path, "--dry-run", "--config", "cpu"]) == 2
    assert "--config and --dry-run do not apply" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", "mlp", "--time", "-5"])
    assert "a number of calls is 0 or more" in capsys.readouterr().err
