"""The rough edges a new user hits first (issue 45): a factory returning a lone tensor,
a model that fails in eager, a report asked for before the first call, a damaged saved
file given to `arbiter report`. Each test failed before its fix."""
from __future__ import annotations

import contextlib
import logging
import textwrap
import zipfile

import pytest
import torch

import arbiter
from arbiter.cli.main import main


@pytest.fixture
def factories(tmp_path, monkeypatch):
    (tmp_path / "models.py").write_text(textwrap.dedent("""
        import torch

        def wrong_width():
            torch.manual_seed(0)
            return torch.nn.Linear(8, 4), (torch.randn(2, 5),)

        def lone():
            torch.manual_seed(0)
            return torch.nn.Linear(8, 4).eval(), torch.randn(2, 8)

        def bare():
            return torch.nn.Linear(8, 4)

        def three():
            return torch.nn.Linear(8, 4), torch.randn(2, 8), 1
    """))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_factory_may_return_one_tensor(factories, capsys):
    """`(model, x)`: taken as `(model, (x,))` (before: batch 1 unpacked the tensor into
    rows and reported a model of 1-D input)."""
    torch._dynamo.reset()
    assert main(["report", "models.py:lone", "--dry-run", "--quiet"]) == 0
    assert "2x8" in "".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("factory,words", [
    ("bare", "returned a bare Linear; it must return (model, (input, ...))"),
    ("three", "returned a tuple of 3 items; it must return (model, (input, ...))"),
])
def test_a_factory_returning_something_else_is_named(factories, capsys, factory, words):
    assert main(["report", f"models.py:{factory}", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"arbiter: error: models.py:{factory} {words}" in err


@pytest.mark.parametrize("command", [["report", "models.py:wrong_width", "--dry-run"],
                                     ["explain", "models.py:wrong_width"]])
def test_a_model_that_fails_in_eager_gets_one_error_line(factories, capsys, command):
    """Before: ~190 lines of Dynamo internals, no `arbiter: error:` line."""
    torch._dynamo.reset()
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "arbiter: error: models.py:wrong_width: the model fails in eager" in err
    assert "mat1 and mat2 shapes cannot be multiplied" in err
    assert "Traceback" not in err and len(err.splitlines()) < 8, err


def test_report_for_before_the_first_call_says_so(fresh_dynamo):
    """The README's pattern, run before a call, raised AttributeError on None."""
    class NeverCalled(torch.nn.Linear):  # a class no other test compiled
        pass

    model = NeverCalled(4, 4).eval()
    compiled = torch.compile(model, backend="arbiter")
    rep = arbiter.report_for(compiled)
    assert rep is not None and rep.not_called
    assert rep.summary().startswith("not called yet")
    assert arbiter.report_for(torch.compile(model, backend="eager")) is None


@pytest.fixture(scope="module")
def saved_mlp(tmp_path_factory):
    from arbiter.cli.examples import mlp

    model, args = mlp()
    path = tmp_path_factory.mktemp("saved") / "mlp.arbiter"
    arbiter.export(model, args, config={"backends": ["eager"], "against_eager": "off"}
                   ).save(path)
    return path


def test_report_of_a_damaged_or_missing_file_names_the_file(saved_mlp, tmp_path, capsys):
    """Before: "unknown model" and the list of built-in examples; an altered file's
    report was printed with exit code 0 (arbiter.load refuses it)."""
    cut = tmp_path / "cut.arbiter"
    cut.write_bytes(saved_mlp.read_bytes()[:200])
    altered = tmp_path / "altered.arbiter"
    with zipfile.ZipFile(saved_mlp) as zin, zipfile.ZipFile(altered, "w") as zout:
        for info in zin.infolist():
            blob = zin.read(info.filename)
            if info.filename.endswith(".safetensors") or info.filename.endswith(".json") \
                    and info.filename != "manifest.json":
                blob = blob[:-1] + bytes([blob[-1] ^ 1])
            zout.writestr(info.filename, blob)
    (tmp_path / "empty.arbiter").write_bytes(b"")
    for name, words in (("missing.arbiter", "no such file"),
                        ("empty.arbiter", "not a saved arbiter program, or truncated"),
                        ("cut.arbiter", "not a saved arbiter program, or truncated"),
                        ("altered.arbiter", "does not match its sha256")):
        assert main(["report", str(tmp_path / name)]) == 2, name
        err = capsys.readouterr().err
        assert "arbiter: error:" in err and words in err and "unknown model" not in err, err
    assert main(["report", str(saved_mlp)]) == 0


def test_cache_kind_that_is_not_there_names_the_kinds(tmp_path, capsys):
    """`--kind bogus` answered "0 entries" alone; `clear` removed the calibration without
    saying that the next compile measures it again."""
    from arbiter.cache import Cache

    d = tmp_path / "c"
    cache = Cache(d)
    cache.put("onnx", "ab" + "1" * 62, b"x" * 20)
    cache.put("calibration", "cd" + "2" * 62, b"{}")
    assert main(["cache", "list", "--dir", str(d), "--kind", "onxx"]) == 0
    err = capsys.readouterr().err
    assert "no entry of kind 'onxx'" in err and "did you mean 'onnx'" in err
    assert "kinds here: calibration, onnx" in err
    assert main(["cache", "clear", "--dir", str(d)]) == 0
    assert "measures it again" in capsys.readouterr().out


def test_one_model_under_several_configs_is_no_recompile(make_backend, fresh_dynamo,
                                                         caplog):
    """Comparing configs compiles a frame once per Arbiter: each counts its own compiles
    (before: "Dynamo compiled this frame 3 times (static shapes each time)" and a
    recompile in the summary, with no shape changed)."""
    make_backend("nu_a", ["aten.addmm.default", "aten.t.default", "aten.relu.default"])
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    bes = [arbiter.Arbiter({"backends": ["nu_a"], "min_block_size": k + 1}) for k in range(3)]
    with torch.no_grad():
        for be in bes:
            torch.compile(model, backend=be)(torch.randn(2, 8))
        assert all("recompiles" not in be.report(advice=False).summary() for be in bes)
        assert "compiled this frame" not in caplog.text
        compiled = torch.compile(model, backend=bes[0], dynamic=False)
        for n in (3, 4):  # a real recompile of the same Arbiter's frame still counts
            compiled(torch.randn(n, 8))
    assert "recompiles: " in bes[0].report(advice=False).summary()


@contextlib.contextmanager
def _warnings_of_arbiter(caplog):
    """caplog's handler on the ``arbiter`` logger itself, at WARNING: what another test
    in the same worker left on that logger (its level, ``propagate``) changes nothing."""
    logger = logging.getLogger("arbiter")
    saved = logger.level
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.removeHandler(caplog.handler)
        logger.setLevel(saved)


def test_a_recompile_with_the_same_sizes_is_not_sent_to_dynamic_shapes(make_backend,
                                                                       fresh_dynamo, caplog):
    """A frame recompiled three times without any size changing (here a string argument
    Dynamo guards on; four threads making a model's first calls at once do the same) is
    told to look at the failing guard, not to compile with dynamic shapes (before: "static
    shapes each time ... torch.compile(dynamic=None or True) lets one symbolic graph serve
    every size"); one whose sizes changed still gets that advice."""
    make_backend("nu_r", ["aten.mul.Tensor", "aten.add.Tensor"])
    be = arbiter.Arbiter({"backends": ["nu_r"], "min_block_size": 1})

    def f(x, mode: str):
        return x * 2 + len(mode)

    compiled = torch.compile(f, backend=be, dynamic=False)
    x = torch.randn(4)
    with _warnings_of_arbiter(caplog):
        for mode in ("a", "bb", "ccc"):
            torch.testing.assert_close(compiled(x, mode), x * 2 + len(mode))
    assert "recompiles: 2" in be.report(advice=False).summary()
    said = [r.getMessage() for r in caplog.records if "compiled this frame" in r.getMessage()]
    assert said and "with the same input sizes" in said[-1], said
    assert "dynamic=None or True" not in said[-1]
    caplog.clear()
    g = torch.compile(lambda t: t * 2 + 1, backend=be, dynamic=False)
    with _warnings_of_arbiter(caplog):
        for n in (2, 3, 5):
            g(torch.randn(n))
    said = [r.getMessage() for r in caplog.records if "compiled this frame" in r.getMessage()]
    assert said and "with other input sizes" in said[-1] and "dynamic=None or True" in said[-1]


def test_an_estimate_a_measurement_contradicts_is_flagged():
    """Before: "~186.225 ms" estimated beside a measured 0.933 ms, unremarked."""
    from arbiter.report.cells import estimates_text

    got = estimates_text({"priority": 186.225, "only eager": 0.5},
                         {"priority": 0.933, "only eager": 0.6})
    assert got == "priority ~186 ms (measured 0.933 ms: 200x off), only eager ~0.5 ms"


def test_size_arithmetic_is_no_eager_share_and_symbolic_bytes_vary(make_backend,
                                                                   fresh_dynamo):
    """A symbolic graph's `sym_size` and `s0 * s1` run inline (eager) but compute no
    tensor: the summary's shares leave them out (before: "eager 4%"), and a symbolic
    partition's bytes say they vary (before: "0 B/0 B")."""
    make_backend("nu_sym", ["aten.relu.default", "aten.mul.Tensor", "aten.view.default",
                            "aten.add.Tensor"], dynamic=True)
    be = arbiter.Arbiter({"backends": ["nu_sym"], "min_block_size": 1,
                          "against_eager": "off", "verify": {"mode": "off"}})

    def f(x):
        return torch.relu(x).view(-1) * 2 + 1

    compiled = torch.compile(f, backend=be, dynamic=True)
    for n in (3, 5):
        x = torch.randn(n, 4)
        torch.testing.assert_close(compiled(x), f(x))
    rep = be.report(advice=False)
    assert "varies (symbolic)" in str(rep), str(rep)
    # an inline partition of size arithmetic alone (as Dynamo's graphs of a decoder have)
    g = rep.graphs[0]
    sizes = g.partitions[0].model_copy(update={
        "id": 1, "backend": "eager", "planned_backend": "eager", "nodes": 3,
        "ops": {"aten.sym_size.int": 2, "_operator.mul": 1}})
    rep.graphs[0] = g.model_copy(update={"partitions": [*g.partitions, sizes]})
    assert "ran: nu_sym 100%;" in rep.summary(), rep.summary()


def test_a_summary_says_which_partitions_compile_per_size(make_backend, fresh_dynamo):
    """A symbolic partition that a backend takes one size at a time (a saved program's
    partition traced with a dynamic length whose ops are static-only) compiles at every
    new size; the summary said only "ran: onnxruntime 100%"."""
    make_backend("nu_static", ["aten.relu.default", "aten.mul.Tensor"])
    be = arbiter.Arbiter({"backends": ["nu_static"], "min_block_size": 1,
                          "against_eager": "off", "verify": {"mode": "off"}})
    compiled = torch.compile(lambda x: torch.relu(x) * 2, backend=be, dynamic=True)
    for n in (3, 5):
        compiled(torch.randn(n, 4))
    summary = be.report(advice=False).summary()
    assert "per shape: 1 (a compile per new size)" in summary, summary


@pytest.mark.parametrize("config,named", [(None, "default"), ("cpu_all", "cpu_all")])
def test_explain_and_report_name_the_model_and_config_alike(factories, capsys, config,
                                                            named):
    """`explain` said `model SeedMLP | config /.../configs/default.yaml` where `report`
    says `model mlp | config default`."""
    extra = ["--config", config] if config else []
    heads = []
    for cmd in (["explain", "mlp"], ["report", "mlp", "--dry-run", "--quiet"]):
        torch._dynamo.reset()
        assert main([*cmd, *extra]) == 0
        out = capsys.readouterr().out
        heads.append(next(line for line in out.splitlines() if line.startswith("model ")))
    assert [h.rsplit(" | ", 1)[0] for h in heads] == [f"model mlp | config {named}"] * 2
