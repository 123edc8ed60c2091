"""The TensorRT backend: conversion and engine builds (no GPU needed), what it refuses,
the build-only probe, and, on a CUDA machine only (``gpu``), running engines.

Builds run with TensorRT for RTX (``pip install 'torch-arbiter[tensorrt-build]'``) or
datacenter TensorRT; without either the tests skip, naming the package.
"""
from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
import yaml

import arbiter
from arbiter.cli.main import main
from arbiter.probe import manifest_update, probe

from conftest import trace


def _trt():
    for name in ("tensorrt", "tensorrt_rtx"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    pytest.skip("neither tensorrt nor tensorrt_rtx is installed "
                "(pip install 'torch-arbiter[tensorrt-build]')")


@pytest.fixture
def trt():
    pytest.importorskip("onnxscript", reason="onnxscript is not installed (the ONNX export)")
    return _trt()


@pytest.fixture
def backend(trt):
    from arbiter.backends.tensorrt import TensorRT

    return TensorRT()


needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(),
                                   reason="checks the behaviour without CUDA")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def lin_gelu_ln(x, w, b, g, beta):
    y = F.gelu(F.linear(x, w, b))
    return (F.layer_norm(y, (y.shape[-1],), g, beta, 1e-5),)


def lin_args(dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(1)
    shapes = [(8, 32), (32, 32), (32,), (32,), (32,)]
    return [torch.randn(*s, generator=gen).to(device=device, dtype=dtype) for s in shapes]


def test_build_only_builds_an_engine_without_running_it(backend):
    args = lin_args()
    gm = trace(lin_gelu_ln, *args)
    text = backend.build_only(gm, args)
    assert "layers" in text and "(not run)" in text
    engine = backend._build(gm, tuple(args))
    assert len(engine.inputs) == 5 and len(engine.outputs) == 1 and engine.layers > 0
    assert len(engine.plan) > 1000
    from arbiter.backends.tensorrt import Engine

    back = Engine.unpack(engine.pack())
    assert (back.plan, back.inputs, back.outputs) == (engine.plan, engine.inputs,
                                                     engine.outputs)
    with pytest.raises(ValueError, match="not a TensorRT engine"):
        Engine.unpack(b"garbage")


def test_the_parser_refusal_names_the_onnx_op(backend):
    x, t = torch.randn(4, 10), torch.randint(0, 10, (4,))
    gm = trace(lambda x, t: (F.cross_entropy(x, t),), x, t)
    with pytest.raises(RuntimeError, match=r"ONNX parser refused the model: "
                       r"\[NegativeLogLikelihoodLoss\] UNSUPPORTED_NODE"):
        backend.build_only(gm, [x, t])


def test_float64_is_refused_not_silently_run_as_float32(backend, trt):
    from arbiter.backends.onnxruntime import export_onnx
    from arbiter.backends.tensorrt import TensorRTOptions, build_engine

    x = torch.randn(4, dtype=torch.float64)
    gm = trace(lambda x: (x * 2 + 1,), x)
    with pytest.raises(TypeError, match="dtype torch.float64 is not supported"):
        backend.build_only(gm, [x])
    # what TensorRT itself does with a float64 model: types it float32, without a word
    model = export_onnx(gm, (x,))
    with pytest.raises(RuntimeError, match=r"typed input 'x_1' as FLOAT, the partition "
                       r"has torch.float64"):
        build_engine(trt, model, [torch.float64], [torch.float64], TensorRTOptions())
    # and the manifest never offers it a float64 node
    assert torch.float64 not in backend.manifest().entry("aten.add.Tensor").dtypes


def test_tf32_is_off_unless_asked(trt):
    from arbiter.backends.tensorrt import TensorRTOptions, _logger, configure

    builder = trt.Builder(_logger(trt))
    cfg = configure(trt, builder.create_builder_config(), TensorRTOptions())
    assert not cfg.get_flag(trt.BuilderFlag.TF32)
    cfg = configure(trt, builder.create_builder_config(), TensorRTOptions(tf32=True))
    assert cfg.get_flag(trt.BuilderFlag.TF32)
    assert cfg.builder_optimization_level == 3


@needs_no_cuda
def test_without_cuda_it_builds_and_plans_but_does_not_run(backend):
    ok, why = backend.available()
    assert not ok and "no CUDA device" in why and "builds engines here" in why
    assert backend.plannable() == (True, "")
    args = lin_args()
    with pytest.raises(TypeError, match="TensorRT runs CUDA tensors; input 0 is on cpu"):
        backend.compile(trace(lin_gelu_ln, *args), args)
    # compiling: unavailable; a dry run: planned onto, and said so
    assert "tensorrt" in arbiter.Arbiter({"backends": ["tensorrt"]}).unavailable
    be = arbiter.Arbiter({"backends": ["tensorrt", "onnxruntime"]}, dry_run=True)
    assert "tensorrt" in be.plans_only and "tensorrt" not in be.unavailable
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    with torch.no_grad():
        report = arbiter.explain(model, torch.randn(2, 8), config={
            "backends": ["tensorrt", "onnxruntime"]}, breaks=False)
    (status,) = [b for b in report.backends if b.name == "tensorrt"]
    assert status.plans_only and not status.available and "no CUDA device" in status.reason
    # CPU tensors: the manifest says cuda, so every node is refused with that reason
    assert {r.reason for r in report.graphs[0].refusals if r.backend == "tensorrt"} == \
        {"device cpu not supported (manifest allows cuda)"}
    assert "this dry run plans onto it" in str(report)


@needs_no_cuda
def test_arbiter_backends_says_what_runs_and_what_was_verified(trt, capsys):
    assert main(["backends", "--width", "200"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (at,) = [k for k, ln in enumerate(lines) if ln.startswith("tensorrt ")]
    row, why = lines[at], lines[at + 1]  # the reason is wrapped below its row
    assert "plans only" in row
    assert "built " in row  # the shipped manifest's entries: `verified: built`
    assert why.startswith("  builds and plans (dry runs), cannot run here: ") and \
        "no CUDA device" in why, why


def test_build_only_probe_marks_entries_built(backend):
    # int64 tried too: the cross-entropy graph holds int64 targets, and a graph holding a
    # dtype its node's entry neither allows nor the probe tries is skipped
    result = probe(backend, ops=["add", "nn.functional.cross_entropy"],
                   dtypes=["float32", "int64"], build_only=True)
    assert result.mode == "build"
    assert "float32" in result.passed["aten.add.Tensor"]
    failed = [s for s in result.samples if s.status == "failed"]
    assert failed and all(s.stage == "build" and "NegativeLogLikelihoodLoss" in s.reason
                          for s in failed)
    doc = {"backend": "tensorrt", "defaults": {"dtypes": ["float32", "int64"]}, "ops": {
        "aten.add.Tensor": {}, "aten.nll_loss_forward.default": {},
        "aten._log_softmax.default": {}}}
    new = manifest_update(doc, result)
    assert new["ops"]["aten.add.Tensor"] == {"verified": "built",
                                             "built_dtypes": ["float32", "int64"]}
    # the failed graph (float32 scores, int64 targets) had two ops: it drops both dtypes
    # from nll_loss_forward, which keeps its entry (it never failed alone) allowing none,
    # and float32 from _log_softmax, which keeps int64 as declared
    assert new["ops"]["aten.nll_loss_forward.default"] == {"dtypes": []}
    assert new["ops"]["aten._log_softmax.default"] == {"dtypes": ["int64"]}
    assert new["probe"]["mode"] == "build"


def test_probe_cli_build_only(trt, tmp_path, capsys):
    out = tmp_path / "trt.yaml"
    assert main(["probe", "tensorrt", "--build-only", "--ops", "add", "--dtypes", "float32",
                 "--write", "--out", str(out)]) == 0
    assert "built (not run)" in capsys.readouterr().out
    doc = yaml.safe_load(out.read_text())
    assert doc["ops"]["aten.add.Tensor"]["verified"] == "built"
    assert main(["probe", "onnxruntime", "--build-only", "--ops", "add"]) == 2
    assert "has no build-only mode" in capsys.readouterr().err


def test_the_shipped_manifest_was_built_not_run(trt):
    from arbiter.backends.tensorrt import TensorRT

    m = TensorRT.manifest()
    assert m.probe is not None and m.probe.mode == "build"
    assert m.defaults.devices == ["cuda"] and "float64" not in m.defaults.dtypes
    assert not any(e.verified == "probed" for e in m.ops.values())
    built = [op for op, e in m.ops.items() if e.verified == "built"]
    assert len(built) > 100 and "aten.nll_loss_forward.default" not in built


# -- on a CUDA machine ------------------------------------------------------------------------
def _skip_if_this_gpu_is_refused(exc: Exception) -> None:
    # TensorRT-RTX runs on RTX GPUs only: on an H100 (compute capability 9.0) it refuses
    # every engine (seen 2026-11-26, bench/README.md); datacenter `tensorrt` is needed there
    if "cannot run on this GPU" in str(exc) or "cannot run engines on" in str(exc):
        pytest.skip(f"this GPU needs datacenter TensorRT (pip install tensorrt): {exc}")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float16, 2e-2)])
def test_engine_runs_on_cuda_like_eager(backend, dtype, tol):
    args = lin_args(dtype, "cuda")
    gm = trace(lin_gelu_ln, *args)
    try:
        fn = backend.compile(gm, args)
    except RuntimeError as exc:
        _skip_if_this_gpu_is_refused(exc)
        raise
    fresh = lin_args(dtype, "cuda")  # other inputs than the ones it was built with
    fresh[0] = torch.randn(8, 32, device="cuda", dtype=dtype)
    (got,) = fn(*fresh)
    (want,) = gm(*fresh)
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    assert backend._gpu_allocator is not None


@pytest.mark.gpu
@cuda
def test_model_through_arbiter_on_cuda(trt, fresh_dynamo):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.LayerNorm(64), torch.nn.Linear(64, 8)).cuda().eval()
    x = torch.randn(4, 32, device="cuda")
    be = arbiter.Arbiter({"backends": ["tensorrt"]})
    if "tensorrt" in be.unavailable:
        _skip_if_this_gpu_is_refused(RuntimeError(be.unavailable["tensorrt"]))
    with torch.no_grad():
        out = torch.compile(model, backend=be)(x)
        torch.testing.assert_close(out, model(x), atol=1e-4, rtol=1e-4)
    parts = [p for g in be.report().graphs for p in g.partitions if not p.inline]
    assert parts and all(p.backend == "tensorrt" and not p.fallbacks for p in parts)


def test_a_gpu_that_refused_an_engine_makes_the_backend_unavailable_there(backend, monkeypatch):
    # TensorRT-RTX refuses data-centre GPUs (an H100, compute capability 9.0: seen on one,
    # bench/README.md) when an engine is loaded; the first refusal is remembered so that no
    # other partition builds an engine for nothing, and `available()` says why
    from arbiter.backends import tensorrt as T

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.setattr(T.TensorRT, "_gpu_refused", {})
    assert backend.available() == (True, "")
    T.TensorRT._gpu_refused[T._gpu_key()] = "tensorrt_rtx cannot run engines on it"
    assert backend.available() == (False, "tensorrt_rtx cannot run engines on it")
    assert T._gpu_key() == "NVIDIA H100 80GB HBM3 (compute capability 9.0)"
