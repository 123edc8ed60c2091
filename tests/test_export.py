"""arbiter.export / arbiter.load (arbiter/deploy/, docs/deploy.md): round trips per
backend in a fresh process, fallbacks at load, refused files, the input check, threads.
Tiny models: backends' numbers are tested with ``against_eager: off``."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
import textwrap
import threading
import zipfile
from pathlib import Path

import pytest
import torch

import arbiter
from arbiter.cli.examples import mlp
from arbiter.errors import ArbiterError

ORT = {"backends": ["onnxruntime"], "against_eager": "off"}
OV = {"backends": ["openvino"], "against_eager": "off"}
EAGER = {"backends": ["eager"], "against_eager": "off"}
BATCH = ({0: torch.export.Dim("batch", min=2, max=64)},)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """The seed MLP exported with a symbolic batch on each CPU backend, saved."""
    out = {}
    folder = tmp_path_factory.mktemp("programs")
    model, args = mlp()
    for name, cfg in (("onnxruntime", ORT), ("openvino", OV), ("eager", EAGER)):
        if name == "openvino":
            pytest.importorskip("openvino")
        program = arbiter.export(model, args, dynamic_shapes=BATCH, config=cfg)
        path = folder / f"mlp_{name}.arbiter"
        program.save(path)
        out[name] = path
    return out


def _fresh_process(code: str) -> str:
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_round_trip_in_a_fresh_process(saved):
    """Each backend's file loads in a process that never saw the model's code run
    through arbiter (no Dynamo), and equals eager across the symbolic batch's range."""
    paths = {k: str(v) for k, v in saved.items()}
    out = _fresh_process(f"""
        import json, torch, arbiter
        from arbiter.cli.examples import mlp
        model, _ = mlp()
        res = {{}}
        for name, path in {paths!r}.items():
            program = arbiter.load(path)
            errs = []
            for n in (2, 5, 64):
                x = torch.randn(n, 32)
                with torch.no_grad():
                    errs.append((program(x) - model(x)).abs().max().item())
            rep = program.report()
            res[name] = dict(errs=errs, check=rep.deployed.check,
                             loaded=[p.loaded for p in rep.deployed.partitions],
                             artifact=[p.artifact for p in rep.deployed.partitions],
                             dynamo=torch._dynamo.utils.counters["frames"]["total"])
        print(json.dumps(res))
    """)
    res = json.loads(out.strip().splitlines()[-1])
    for name, r in res.items():
        assert max(r["errs"]) < 1e-5, (name, r)
        assert r["check"] == "passed", (name, r)
        assert r["dynamo"] == 0, (name, r)
    assert res["onnxruntime"]["artifact"] == ["onnx"]
    assert res["onnxruntime"]["loaded"] == ["saved artifact"]
    assert res["openvino"]["artifact"] == ["openvino-ir"]
    assert res["openvino"]["loaded"] == ["saved artifact"]
    assert set(res["eager"]["loaded"]) == {"eager"}


def test_input_check(saved):
    program = arbiter.load(saved["onnxruntime"])
    with pytest.raises(arbiter.ArbiterError, match=r"size 65 at dimension 0 is outside the "
                       r"exported range of s\d+: \[2, 64\]"):
        program(torch.randn(65, 32))
    with pytest.raises(arbiter.ArbiterError, match="dtype float64, the program takes float32"):
        program(torch.randn(4, 32, dtype=torch.float64))
    with pytest.raises(arbiter.ArbiterError, match="size 31 at dimension 1, the program was "
                       "exported for 32"):
        program(torch.randn(4, 31))
    with pytest.raises(arbiter.ArbiterError, match="3 dimensions"):
        program(torch.randn(4, 32, 1))
    with pytest.raises(arbiter.ArbiterError, match="2 inputs; the program takes 1"):
        program(torch.randn(4, 32), torch.randn(4, 32))
    with pytest.raises(arbiter.ArbiterError, match="got a list"):
        program([1.0] * 32)
    assert isinstance(program(torch.randn(4, 32)), torch.Tensor)


def test_eight_threads(saved):
    """Eight threads calling one loaded program get eager's results (ONNX Runtime's
    bindings are per thread)."""
    program = arbiter.load(saved["onnxruntime"])
    model, _ = mlp()
    errors: list = []

    def work(k: int) -> None:
        try:
            g = torch.Generator().manual_seed(k)
            for i in range(20):
                x = torch.randn(2 + (k * 7 + i) % 60, 32, generator=g)
                with torch.no_grad():
                    err = (program(x) - model(x)).abs().max().item()
                if err > 1e-5:
                    errors.append((k, i, err))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append((k, repr(exc)))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(not p.fallbacks for g in program.report().graphs for p in g.partitions)


def test_missing_backend_falls_back_to_eager(saved, caplog):
    """A config at load whose ONNX Runtime cannot run (a provider this build lacks):
    the partition runs in eager ATen, the load warns and the report says why, the answer
    is eager's."""
    cfg = {"backends": [{"name": "onnxruntime",
                         "options": {"providers": ["CUDAExecutionProvider"]}}]}
    with caplog.at_level("WARNING", logger="arbiter.deploy.loading"):
        program = arbiter.load(saved["onnxruntime"], config=cfg)
    assert any("its saved artifact is not used: onnxruntime is not available here" in
               r.getMessage() for r in caplog.records), caplog.records
    model, _ = mlp()
    x = torch.randn(7, 32)
    with torch.no_grad():
        assert torch.allclose(program(x), model(x), atol=1e-6)
    rep = program.report()
    part = rep.deployed.partitions[0]
    assert part.loaded == "eager" and "onnxruntime is not available here" in part.reason
    fall = rep.graphs[0].partitions[0].fallbacks[-1]
    assert (fall.from_backend, fall.to_backend, fall.stage) == ("onnxruntime", "eager", "load")
    assert rep.graphs[0].partitions[0].backend == "eager"


def _rewrite(src: Path, dst: Path, change) -> None:
    """Copy a saved program, ``change(name, bytes) -> bytes`` applied to each member."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, change(info.filename, zin.read(info.filename)))


def _with_hash(manifest: bytes, name: str, blob: bytes) -> bytes:
    m = json.loads(manifest)
    m["files"][name] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    return json.dumps(m).encode()


def test_failing_artifact_falls_down_the_chain(saved, tmp_path):
    """An artifact its backend cannot read (bytes that pass the hash: a backend that
    changed) falls down the saved chain: ONNX Runtime compiles the ATen partition again,
    checked against eager at its first call."""
    bad = b"not an onnx model"
    dst = tmp_path / "bad.arbiter"
    _rewrite(saved["onnxruntime"], dst, lambda n, b: bad if n.endswith("model.onnx") else
             _with_hash(b, "partitions/0/model.onnx", bad) if n == "manifest.json" else b)
    program = arbiter.load(dst)
    rep = program.report()
    assert rep.deployed.check == "passed"
    p = rep.graphs[0].partitions[0]
    assert p.backend == "onnxruntime" and p.verify_checks == 1
    assert p.fallbacks[-1].stage == "load" and "failed to load it" in p.fallbacks[-1].reason
    assert rep.deployed.partitions[0].loaded == "pending"  # compiled at the check's call


def test_check_at_load_that_differs(saved, tmp_path):
    """Outputs at load unlike the saved program's (here: the saved ones altered, hashes
    made to match): every partition is checked against eager ATen; ONNX Runtime passes
    and stays."""
    from safetensors.torch import load, save

    with zipfile.ZipFile(saved["onnxruntime"]) as z:
        samples = load(z.read("samples.safetensors"))
    samples["out.0"] = samples["out.0"] + 1
    new = save(samples)
    dst = tmp_path / "samples.arbiter"
    _rewrite(saved["onnxruntime"], dst, lambda n, b: new if n == "samples.safetensors" else
             _with_hash(b, "samples.safetensors", new) if n == "manifest.json" else b)
    program = arbiter.load(dst)
    rep = program.report()
    assert rep.deployed.check.startswith("differs from the saved program's outputs")
    assert "0 fell back" in rep.deployed.check
    p = rep.graphs[0].partitions[0]
    assert p.backend == "onnxruntime" and p.verify_checks == 1


def test_no_save_artifact_compiles_at_load(tmp_path, monkeypatch):
    """A backend without a saved form: the partition is saved as ATen and compiled again
    at load by the same backend."""
    from arbiter.backends.onnxruntime import OnnxRuntime

    model, args = mlp()
    program = arbiter.export(model, args, config=ORT)
    monkeypatch.setattr(OnnxRuntime, "save_artifact", lambda self, c, gm: None)
    program.save(tmp_path / "aten.arbiter")
    monkeypatch.undo()
    loaded = arbiter.load(tmp_path / "aten.arbiter")
    part = loaded.report().deployed.partitions[0]
    assert (part.artifact, part.loaded) == ("aten", "pending")
    assert "onnxruntime has no saved form" in part.reason
    assert loaded.report().graphs[0].partitions[0].backend == "onnxruntime"
    with torch.no_grad():
        assert torch.allclose(loaded(*args), model(*args), atol=1e-6)


def test_tampered_and_truncated_files_are_refused(saved, tmp_path):
    src = saved["onnxruntime"]
    blob = src.read_bytes()
    (tmp_path / "cut.arbiter").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(ArbiterError, match="truncated"):
        arbiter.load(tmp_path / "cut.arbiter")

    def flip(name: str, b: bytes) -> bytes:
        if name == "weights.safetensors":
            b = bytearray(b)
            b[-3] ^= 1
            return bytes(b)
        return b
    _rewrite(src, tmp_path / "flip.arbiter", flip)
    with pytest.raises(ArbiterError, match="weights.safetensors does not match its sha256"):
        arbiter.load(tmp_path / "flip.arbiter")

    def version(name: str, b: bytes) -> bytes:
        if name != "manifest.json":
            return b
        m = json.loads(b)
        m["format_version"] = 99
        return json.dumps(m).encode()
    _rewrite(src, tmp_path / "v99.arbiter", version)
    with pytest.raises(ArbiterError, match="format version 99; this arbiter reads versions 1, 2"):
        arbiter.load(tmp_path / "v99.arbiter")
    def plan(name: str, b: bytes) -> bytes:
        if name != "manifest.json":
            return b
        m = json.loads(b)
        m["plan"]["partitions"][0]["nodes"] = "t"
        return json.dumps(m).encode()
    _rewrite(src, tmp_path / "plan.arbiter", plan)
    with pytest.raises(ArbiterError, match="manifest.json is malformed .*partition 0: nodes"):
        arbiter.load(tmp_path / "plan.arbiter")
    (tmp_path / "junk.arbiter").write_bytes(b"junk" * 100)
    with pytest.raises(ArbiterError, match="not a saved arbiter program"):
        arbiter.load(tmp_path / "junk.arbiter")


def test_shared_weights_match_by_content():
    """A saved artifact refers to a program weight only when dtype, shape and every byte
    are the same (a matrix's transpose too); -0.0 is not 0.0; small tensors are kept."""
    from arbiter.deploy.shared import SharedWeights

    w = torch.randn(64, 48)
    b = torch.zeros(32, 64)
    shared = SharedWeights({"p:w": w, "p:b": b, "p:small": torch.randn(8)})
    assert shared.find(w.clone()) == "p:w"
    assert shared.find(w.t().contiguous()) == "t:p:w"
    assert torch.equal(shared.get("t:p:w"), w.t())
    assert shared.find(w.double()) is None and shared.find(w.reshape(48, 64)) is None
    changed = w.clone()
    changed[3, 7] = torch.nextafter(changed[3, 7], torch.tensor(1e9))
    assert shared.find(changed) is None
    assert shared.find(-b) is None  # -0.0: other bytes
    assert shared.find(torch.randn(8)) is None and shared.find(torch.zeros(8)) is None
    assert shared.found == {"p:w"} and shared.refs == {"p:w", "t:p:w"}
    shared.prefetch(["t:p:w", "t:p:gone", "p:w", 3])  # made ahead (a load's thread), given once
    made = shared._made["t:p:w"]
    assert shared.get("t:p:w") is made and torch.equal(made, w.t()) and not shared._made
    with pytest.raises(ArbiterError, match="refers to weight 'p:gone'"):
        shared.get("p:gone")


def test_weights_are_saved_once(saved, tmp_path):
    """The ONNX model saved for ONNX Runtime holds no initializer the program's weights
    hold (the MLP's transposed Linear weights: references), and loads with them; a
    reference to a weight the program lacks falls down the saved chain, said why."""
    import onnx

    src = saved["onnxruntime"]
    with zipfile.ZipFile(src) as z:
        m = json.loads(z.read("manifest.json"))
        model = onnx.load_from_string(z.read("partitions/0/model.onnx"))
    refs = m["plan"]["partitions"][0]["artifact"]["entry"]["shared_initializers"]
    assert sorted(refs.values()) == ["t:p:fc1.weight", "t:p:fc2.weight", "t:p:fc3.weight"]
    assert m["shared_weights"] == sorted(refs.values())  # what a load transposes ahead
    # taken only transposed: stored transposed, so a load gives them without a copy
    assert m["stored_transposed"] == ["p:fc1.weight", "p:fc2.weight", "p:fc3.weight"]
    with zipfile.ZipFile(src) as z:
        from safetensors.torch import load as st_load

        stored = st_load(z.read("weights.safetensors"))
    model_, _ = mlp()
    assert torch.equal(stored["p:fc1.weight"], model_.fc1.weight.detach().t())
    big = [i.name for i in model.graph.initializer if len(i.raw_data) >= 4096]
    assert big == [] and all(i.data_location == onnx.TensorProto.EXTERNAL
                             for i in model.graph.initializer if i.name in refs)

    def rename(name: str, b: bytes) -> bytes:
        if name != "manifest.json":
            return b
        m = json.loads(b)
        entry = m["plan"]["partitions"][0]["artifact"]["entry"]
        entry["shared_initializers"] = {k: "p:gone" for k in entry["shared_initializers"]}
        return json.dumps(m).encode()
    _rewrite(src, tmp_path / "gone.arbiter", rename)
    loaded = arbiter.load(tmp_path / "gone.arbiter")
    part = loaded.report().deployed.partitions[0]
    assert part.loaded == "pending" and "refers to weight 'p:gone'" in part.reason
    x = torch.randn(5, 32)
    with torch.no_grad():
        assert torch.allclose(loaded(x), model_(x), atol=1e-5)

    def unlisted(name: str, b: bytes) -> bytes:
        if name != "manifest.json":
            return b
        m = json.loads(b)
        m["stored_transposed"] = ["p:fc1.bias"]
        return json.dumps(m).encode()
    _rewrite(src, tmp_path / "bad.arbiter", unlisted)
    with pytest.raises(ArbiterError, match="stored_transposed names 'p:fc1.bias', which is "
                                           "not a matrix"):
        arbiter.load(tmp_path / "bad.arbiter")

    def twice(name: str, b: bytes) -> bytes:  # transposed twice: the stored layout again
        if name != "manifest.json":
            return b
        m = json.loads(b)
        m["stored_transposed"] = ["p:fc1.weight", "p:fc1.weight"]
        return json.dumps(m).encode()
    _rewrite(src, tmp_path / "twice.arbiter", twice)
    with pytest.raises(ArbiterError, match="stored_transposed is not a list of distinct"):
        arbiter.load(tmp_path / "twice.arbiter")


def test_artifact_and_zip_layout_are_checked(saved, tmp_path):
    """The artifacts, read in a thread while the ATen program is read, are refused on a
    hash mismatch all the same; a stored member whose directory entry points at another
    member's header, or that is longer than the manifest says, is refused; a member that
    is compressed (not what save writes) is read through zipfile and loads."""
    src = saved["onnxruntime"]

    def flip(name: str, b: bytes) -> bytes:
        return bytes(b[:-5]) + bytes([b[-5] ^ 1]) + b[-4:] if name.endswith("model.onnx") else b
    _rewrite(src, tmp_path / "onnx.arbiter", flip)
    with pytest.raises(ArbiterError, match="model.onnx does not match its sha256"):
        arbiter.load(tmp_path / "onnx.arbiter")

    _rewrite(src, tmp_path / "long.arbiter",
             lambda n, b: b + b"x" if n == "weights.safetensors" else b)
    with pytest.raises(ArbiterError, match="weights.safetensors has .* bytes, manifest.json "
                                           "says .* \\(truncated or altered\\)"):
        arbiter.load(tmp_path / "long.arbiter")

    blob = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as z:
        onnx = z.getinfo("partitions/0/model.onnx")
        name = onnx.filename.encode()
    at = onnx.header_offset
    assert blob[at + 30: at + 30 + len(name)] == name
    blob[at + 30] ^= 0x20  # the local header's name no longer the directory's
    (tmp_path / "header.arbiter").write_bytes(bytes(blob))
    with pytest.raises(ArbiterError, match="model.onnx cannot be read: truncated or altered"):
        arbiter.load(tmp_path / "header.arbiter")

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp_path / "deflated.arbiter", "w",
                                                      zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
    model, args = mlp()
    loaded = arbiter.load(tmp_path / "deflated.arbiter")
    assert loaded.report().deployed.partitions[0].loaded == "saved artifact"
    with torch.no_grad():
        x = torch.cat([args[0]] * 3)
        assert torch.allclose(loaded(x), model(x), atol=1e-5)


@pytest.mark.parametrize("what", ["target", "expr"])
def test_code_in_the_program_is_refused(saved, tmp_path, what):
    """The program's JSON cannot make torch's deserializer resolve or evaluate code: a
    node calling ``torch.load``, a size expression calling ``__import__``."""
    def change(name: str, b: bytes) -> bytes:
        if name != "program.json":
            return b
        d = json.loads(b)
        if what == "target":
            d["graph_module"]["graph"]["nodes"][0]["target"] = "torch.load"
        else:
            d["graph_module"]["graph"]["sym_int_values"] = {"x": {"as_expr": {
                "expr_str": "__import__('os').system('true')", "hint": None}}}
        return json.dumps(d).encode()

    with zipfile.ZipFile(saved["onnxruntime"]) as z:
        new = change("program.json", z.read("program.json"))
    dst = tmp_path / f"{what}.arbiter"
    _rewrite(saved["onnxruntime"], dst, lambda n, b: change(n, b) if n == "program.json" else
             _with_hash(b, "program.json", new) if n == "manifest.json" else b)
    with pytest.raises(ArbiterError, match="torch.load|name '__import__' is not allowed"):
        arbiter.load(dst)


@pytest.mark.parametrize("name", ["mlp", "encoder_block", "small_cnn"])
def test_the_planner_sees_the_compile_paths_ops(name, fresh_dynamo):
    """torch.export's graph, decomposed for arbiter, holds the same ops as the inference
    graph AOTAutograd hands arbiter under torch.compile."""
    from collections import Counter

    from torch._functorch.aot_autograd import aot_module_simplified

    from arbiter.cli.examples import EXAMPLES
    from arbiter.deploy.tracing import aten_graph, trace
    from arbiter.run.lower import decomposition_table

    model, args = EXAMPLES[name]()

    def ops(gm):
        return Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")

    exported = ops(aten_graph(trace(model, args, None, None, [])).gm)
    seen = {}

    def backend(gm, example):
        def keep(g, _):
            seen["g"] = g
            return g
        return aot_module_simplified(gm, example, fw_compiler=keep, inference_compiler=keep,
                                     decompositions=decomposition_table([]))

    with torch.no_grad():
        torch.compile(model, backend=backend)(*args)
    assert exported == ops(seen["g"])


def test_fast_dataclasses_equal_torchs(saved):
    """serde_fast builds the same schema objects as torch's own helper."""
    from torch._export.serde.schema import ExportedProgram
    from torch._export.serde.serialize import _dict_to_dataclass

    from arbiter.deploy.serde_fast import to_dataclass

    with zipfile.ZipFile(saved["onnxruntime"]) as z:
        data = json.loads(z.read("program.json"))
    ours, theirs = to_dataclass(ExportedProgram, data), _dict_to_dataclass(ExportedProgram, data)
    assert ours == theirs

    def same_state(a, b):  # unions compare by tag and value: their whole state too
        assert type(a) is type(b)
        if dataclasses.is_dataclass(a):
            assert vars(a).keys() == vars(b).keys()
            assert getattr(a, "_type", None) == getattr(b, "_type", None)
            for k in vars(a):
                if k != "_type":
                    same_state(vars(a)[k], vars(b)[k])
        elif isinstance(a, (list, tuple)):
            assert len(a) == len(b)
            for x, y in zip(a, b):
                same_state(x, y)
        elif isinstance(a, dict):
            assert a.keys() == b.keys()
            for k in a:
                same_state(a[k], b[k])
    same_state(ours, theirs)


def test_dtype_asserts_do_not_split_the_plan(tmp_path):
    """torch.export checks a ``.to()``'s dtype with ``_assert_tensor_metadata`` (a node
    that returns nothing, so only eager could run it): dropped, the model is one
    ONNX Runtime partition returning one tensor, as through torch.compile (T5's 16 made an
    eager partition and 16 more outputs)."""
    class RMS(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            h = self.lin(x)
            return self.lin(h.to(torch.float32) * torch.rsqrt(h.pow(2).mean(-1, keepdim=True)))

    model, x = RMS().eval(), torch.randn(2, 8)
    program = arbiter.export(model, (x,), config=ORT)
    program.save(tmp_path / "rms.arbiter")
    with zipfile.ZipFile(tmp_path / "rms.arbiter") as z:
        parts = json.loads(z.read("manifest.json"))["plan"]["partitions"]
        assert b"_assert_tensor_metadata" not in z.read("program.json")
    assert [(p["ran"], p["inline"]) for p in parts] == [("onnxruntime", False)]
    with torch.no_grad():
        assert torch.allclose(arbiter.load(tmp_path / "rms.arbiter")(x), model(x), atol=1e-6)


def test_training_mode_is_refused():
    model, args = mlp()
    with pytest.raises(ArbiterError, match="inference: call model.eval"):
        arbiter.export(model.train(), args, config=ORT)


class _Scaled(torch.nn.Module):
    def forward(self, x, *, scale):
        return {"y": x * scale, "z": x.sum(0)}


def test_keyword_inputs_and_structured_outputs(tmp_path):
    x, scale = torch.randn(3, 4), torch.randn(4)
    program = arbiter.export(_Scaled().eval(), (x,), {"scale": scale}, config=EAGER)
    program.save(tmp_path / "kw.arbiter")
    loaded = arbiter.load(tmp_path / "kw.arbiter")
    out = loaded(x, scale=scale)
    assert set(out) == {"y", "z"} and torch.equal(out["y"], x * scale)
    with pytest.raises(ArbiterError, match="the program takes 1 positional argument and keyword scale; this call gave 2 positional arguments"):
        loaded(x, scale)


def test_cli_export_and_report(tmp_path, capsys):
    from arbiter.cli.main import main

    out = tmp_path / "cli.arbiter"
    assert main(["export", "mlp", "--out", str(out), "--config", "default",
                 "--dynamic", "0.0=2:16"]) == 0
    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    # (the text wraps at 100 columns, a long temporary path with it)
    assert "ran: onnxruntime 100%" in text and f"savedin{out}" in "".join(text.split())
    assert "s" in text and "in [2, 16]" in text


@pytest.mark.slow
@pytest.mark.parametrize("native", [True, False])
def test_inductor_round_trip(tmp_path, native):
    """Inductor's partition saved as an AOTInductor package: loaded with native_code=True;
    without it, compiled again from ATen at load (minutes on 2 cores: slow)."""
    model, args = mlp()
    program = arbiter.export(model, args, config={"backends": ["inductor"],
                                                  "against_eager": "off"})
    program.save(tmp_path / "ind.arbiter")
    loaded = arbiter.load(tmp_path / "ind.arbiter", native_code=native)
    part = loaded.report().deployed.partitions[0]
    assert part.artifact == "aotinductor"
    assert part.loaded == ("saved artifact" if native else "pending")
    with torch.no_grad():
        assert torch.allclose(loaded(*args), model(*args), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["default", "cpu_all"])
@pytest.mark.parametrize("name", ["bert_base", "resnet50", "gpt2_small"])
def test_zoo_round_trip(tmp_path, name, config):
    """A zoo model exported, saved and loaded in a fresh process equals eager (minutes)."""
    from arbiter.cli.examples import ZOO

    model, args = ZOO[name]()
    program = arbiter.export(model, args, config=config)
    path = tmp_path / f"{name}.arbiter"
    program.save(path)
    out = _fresh_process(f"""
        import torch, arbiter
        from arbiter.cli.examples import ZOO
        model, args = ZOO[{name!r}]()
        program = arbiter.load({str(path)!r})
        with torch.no_grad():
            err = (program(*args) - model(*args)).abs().max().item()
        print(program.report().deployed.check, err)
    """)
    check, err = out.strip().splitlines()[-1].rsplit(" ", 1)
    assert check == "passed" and float(err) < 1e-3, out


@pytest.mark.slow
def test_gpt2_symbolic_sequence(tmp_path):
    """GPT-2 (2 layers) with a symbolic sequence length, across its range."""
    from arbiter.cli.examples import gpt2_tiny

    model, args = gpt2_tiny()
    seq = torch.export.Dim("seq", min=2, max=64)
    program = arbiter.export(model, args, dynamic_shapes=({1: seq},), config="default")
    program.save(tmp_path / "gpt2.arbiter")
    loaded = arbiter.load(tmp_path / "gpt2.arbiter")
    for n in (2, 17, 64):
        ids = torch.randint(0, 1000, (1, n))
        with torch.no_grad():
            assert (loaded(ids) - model(ids)).abs().max() < 1e-4


def test_a_version_2_file_loads(saved, tmp_path):
    """A file of format version 2 (every weight stored as the ATen program holds it; the
    transposes made at load) still loads and equals eager."""
    from safetensors.torch import load as st_load, save as st_save

    from arbiter.cli.examples import mlp

    with zipfile.ZipFile(saved["onnxruntime"]) as z:
        m = json.loads(z.read("manifest.json"))
        weights = st_load(z.read("weights.safetensors"))
    flipped = m.pop("stored_transposed")
    assert flipped
    old = st_save({k: v.t().contiguous() if k in flipped else v for k, v in weights.items()})
    m["format_version"] = 2
    m["files"]["weights.safetensors"] = {"size": len(old),
                                         "sha256": hashlib.sha256(old).hexdigest()}
    _rewrite(saved["onnxruntime"], tmp_path / "v2.arbiter",
             lambda n, b: json.dumps(m).encode() if n == "manifest.json" else
             old if n == "weights.safetensors" else b)
    loaded = arbiter.load(tmp_path / "v2.arbiter")
    assert loaded.deployed.check == "passed"
    model, _ = mlp()
    x = torch.randn(3, 32)
    with torch.no_grad():
        assert torch.allclose(loaded(x), model(x), atol=1e-5)
    assert loaded.report().deployed.partitions[0].loaded == "saved artifact"


def test_saving_to_a_directory_or_a_missing_folder_is_named_and_leaves_nothing(tmp_path):
    # Before: IsADirectoryError / FileNotFoundError from os.replace naming the internal
    # PATH.tmp, which stayed behind; two saves to one path shared that name.
    program = arbiter.export(*mlp(), config=EAGER)
    with pytest.raises(ArbiterError, match="is a directory"):
        program.save(tmp_path)
    with pytest.raises(ArbiterError, match="does not exist"):
        program.save(tmp_path / "nowhere" / "m.arbiter")
    assert list(tmp_path.iterdir()) == []
    program.save(tmp_path / "m.arbiter")
    assert [p.name for p in tmp_path.iterdir()] == ["m.arbiter"]  # no temporary left
    from arbiter.deploy import archive

    def broken(*a, **k):
        raise OSError("disk full")

    original = archive.zipfile.ZipFile.writestr
    archive.zipfile.ZipFile.writestr = broken
    try:
        with pytest.raises(OSError, match="disk full"):
            program.save(tmp_path / "n.arbiter")
    finally:
        archive.zipfile.ZipFile.writestr = original
    assert [p.name for p in tmp_path.iterdir()] == ["m.arbiter"]  # the partial one removed
