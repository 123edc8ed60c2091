"""ONNX Runtime's lower-precision variants (docs/precision.md): float16 and dynamic int8
quantization of the exported model, computed for real and checked against eager on
inputs they were not built with; under config `accuracy` they are candidates kept only
within the tolerance, refused (with why, in the report) outside it; a lowered model is
never served to a float32 compile from the cache."""
from __future__ import annotations

import pytest
import torch

import arbiter

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: pip install "
                    "'torch-arbiter[onnxruntime]'")
pytest.importorskip("onnxscript", reason="onnxscript is not installed")

from arbiter.backends.onnxruntime import (  # noqa: E402
    OnnxRuntime, OrtOptions)
from arbiter.backends._ort_precision import (  # noqa: E402
    kernel_types, variant_support)

#: tolerances each variant meets on these models (measured: MLP fp16 4e-4, int8 7e-3;
#: transformer block fp16 ~1e-3, int8 ~2e-2), with room for other inputs
LOOSE = {"fp16": 2e-2, "int8": 1e-1}


def _mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 32)).eval()


class Block(torch.nn.Module):
    """A pre-norm transformer encoder block (attention through SDPA, GELU MLP)."""

    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(2 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads) \
            .permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


def _block(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return Block().eval()


MODELS = {"mlp": (_mlp, (16, 64)), "block": (_block, (2, 12, 64))}


def _needs(label: str) -> None:
    why = variant_support(label, ["CPUExecutionProvider"], native=False)
    if why:
        pytest.skip(f"onnxruntime variant {label}: {why}")


def _frozen_graph(model: torch.nn.Module, x: torch.Tensor) -> torch.fx.GraphModule:
    """The model's ATen graph with its weights as constants (what freeze_weights hands
    a backend)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.no_grad():
        return make_fx(lambda a: (model(a),))(x)


def _ort(config: dict, variants: list[str]) -> dict:
    return {**config, "backends": [{"name": "onnxruntime",
                                    "options": {"variants": variants}}]}


def _graph(be):
    (g,) = be.report().graphs
    return g


def _run(be, model, shape, calls: int = 3, seed: int = 1) -> float:
    """``model`` compiled with ``be`` against eager on new inputs each call: max error."""
    compiled = torch.compile(model, backend=be)
    gen = torch.Generator().manual_seed(seed)
    worst = 0.0
    with torch.no_grad():
        for _ in range(calls):
            x = torch.randn(*shape, generator=gen)
            worst = max(worst, float((compiled(x) - model(x)).abs().max()))
    return worst


# -- what is offered -----------------------------------------------------------------------
def test_variants_offered_follow_the_kernels_and_the_option():
    providers = ["CPUExecutionProvider"]
    kernels = kernel_types(providers)
    fp16_native = any("tensor(float16)" in kernels.get(op, ()) for op in ("MatMul", "Gemm"))
    offered = OnnxRuntime(OrtOptions()).precision_variants()
    assert ("int8" in offered) == (not variant_support("int8", providers))
    assert ("int8" in offered) == ("MatMulInteger" in kernels)
    assert ("fp16" in offered) == (fp16_native and not variant_support("fp16", providers))
    if not fp16_native:  # x86 CPU provider: float16 would run float32 kernels
        assert "float16 MatMul or Gemm" in variant_support("fp16", providers)
    assert OnnxRuntime(OrtOptions(variants=[])).precision_variants() == {}
    _needs("fp16")
    assert OnnxRuntime(OrtOptions(variants=["fp16"])).precision_variants() == \
        {"fp16": {"precision": "fp16"}}
    # a config already below fp32 offers nothing more
    assert OnnxRuntime(OrtOptions(precision="fp16", variants=["int8"])) \
        .precision_variants() == {}


# -- the lowered models themselves, against eager --------------------------------------------
@pytest.mark.parametrize("label", ["fp16", "int8"])
@pytest.mark.parametrize("which", sorted(MODELS))
def test_lowered_partition_against_eager(label, which):
    _needs(label)
    make, shape = MODELS[which]
    model = make()
    gm = _frozen_graph(model, torch.randn(*shape))
    low = OnnxRuntime(OrtOptions(precision=label)).compile(gm, [torch.randn(*shape)])
    f32 = OnnxRuntime(OrtOptions()).compile(gm, [torch.randn(*shape)])
    gen = torch.Generator().manual_seed(7)
    for _ in range(2):  # inputs the models were not built with
        x = torch.randn(*shape, generator=gen)
        with torch.no_grad():
            (want,) = gm(x)
        (got,), (exact,) = low(x), f32(x)
        assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
        err = float((got - want).abs().max())
        assert 1e-5 < err <= LOOSE[label] / 2, err  # lowered: not eager-equal; close
        assert float((exact - want).abs().max()) < 1e-5


def test_int8_needs_constant_weights():
    _needs("int8")
    model = _mlp()
    x = torch.randn(16, 64)
    params = dict(model.named_parameters())
    from torch.fx.experimental.proxy_tensor import make_fx

    # weights as inputs (freeze_weights false, or a training graph)
    gm = make_fx(lambda a, *w: (torch.func.functional_call(
        model, dict(zip(params, w)), (a,)),))(x, *params.values())
    with pytest.raises(RuntimeError, match="nothing to quantize.*freeze_weights"):
        OnnxRuntime(OrtOptions(precision="int8")).compile(gm, [x, *params.values()])


# -- as candidates under `accuracy` ----------------------------------------------------------
@pytest.mark.parametrize("label", ["fp16", "int8"])
def test_variant_within_its_tolerance_is_accepted(fresh_dynamo, label):
    _needs(label)
    tol = LOOSE[label]
    be = arbiter.Arbiter(_ort({"min_block_size": 1, "cache": {"enabled": False},
                               "accuracy": {"atol": tol}}, [label]))
    model = _mlp(2)
    err = _run(be, model, (16, 64))
    g = _graph(be)
    name = f"priority with onnxruntime:{label}"
    assert not g.accuracy.rejected
    assert 1e-5 < g.accuracy.errors[name] <= tol  # lowered for real, within
    assert g.candidates_ms[name] is not None  # accepted, so timed
    faster = min(("priority", name), key=lambda k: g.candidates_ms[k])
    assert g.chosen == faster
    parts = [p for p in g.partitions if not p.inline]
    assert {p.precision for p in parts} == {label if faster == name else "native"}
    assert {p.backend for p in parts} == {f"onnxruntime:{label}" if faster == name
                                          else "onnxruntime"}
    assert err <= tol


@pytest.mark.parametrize("label", ["fp16", "int8"])
def test_variant_outside_a_tight_tolerance_is_refused(fresh_dynamo, label):
    _needs(label)
    be = arbiter.Arbiter(_ort({"min_block_size": 1, "cache": {"enabled": False},
                               "accuracy": {"atol": 1e-6}}, [label]))
    model = _mlp(3)
    assert _run(be, model, (16, 64)) < 1e-5  # float32: eager-equal
    g = _graph(be)
    name = f"priority with onnxruntime:{label}"
    assert g.chosen == "priority" and g.candidates_ms[name] is None  # never timed
    why = g.accuracy.rejected[name]
    assert "atol 1e-06" in why and "max abs error" in why  # keyed by the variant's name
    assert all(p.precision == "native" for p in g.partitions)
    assert {p.backend for p in g.partitions if not p.inline} == {"onnxruntime"}
    from arbiter.report.text import render

    text = render(be.report(), width=400)  # the text report says it, with why
    assert f"refused {name}: " in text and "atol 1e-06" in text


def test_int8_without_frozen_weights_is_refused_with_why(fresh_dynamo):
    _needs("int8")
    be = arbiter.Arbiter(_ort({"min_block_size": 1, "cache": {"enabled": False},
                               "freeze_weights": False, "accuracy": {"atol": 1.0}},
                              ["int8"]))
    assert _run(be, _mlp(4), (16, 64), calls=2) < 1e-5
    g = _graph(be)
    why = g.accuracy.rejected["priority with onnxruntime:int8"]
    assert "nothing to quantize" in why and "freeze_weights" in why
    assert all(p.precision == "native" for p in g.partitions)


@pytest.mark.slow
@pytest.mark.parametrize("label", ["fp16", "int8"])
def test_variant_on_a_transformer_block(fresh_dynamo, label):
    _needs(label)
    tol = LOOSE[label]
    be = arbiter.Arbiter(_ort({"cache": {"enabled": False}, "accuracy": {"atol": tol}},
                              [label]))
    model = _block(5)
    err = _run(be, model, (2, 12, 64), calls=2)
    g = _graph(be)
    name = f"priority with onnxruntime:{label}"
    assert not g.accuracy.rejected and 1e-5 < g.accuracy.errors[name] <= tol
    assert err <= tol


# -- the cache keeps the precisions apart ----------------------------------------------------
def test_float32_after_fp16_gets_float32(fresh_dynamo, tmp_path):
    _needs("fp16")
    from arbiter.cache.directory import entries

    model = _mlp(6)
    cache = {"dir": str(tmp_path)}
    be = arbiter.Arbiter(_ort({"min_block_size": 1, "cache": cache,
                               "accuracy": {"atol": LOOSE["fp16"]}}, ["fp16"]))
    assert _run(be, model, (16, 64), calls=1) <= LOOSE["fp16"]
    kinds = sorted(e.kind for e in entries(tmp_path))
    assert "onnx" in kinds and "onnx-fp16" in kinds  # the float32 export and the fp16 one
    torch._dynamo.reset()
    # the same graph, weights and backend options, without `accuracy`: float32 only
    plain = arbiter.Arbiter(_ort({"min_block_size": 1, "cache": cache}, ["fp16"]))
    assert _run(plain, model, (16, 64)) < 1e-5
    g = _graph(plain)
    assert all(p.precision == "native" for p in g.partitions)
    # and the fp16 backend itself, compiled from the same cache, is float16
    gm = _frozen_graph(model, torch.randn(16, 64))
    x = torch.randn(16, 64)
    keyed = []
    for label in ("fp32", "fp16", "fp32"):
        b = OnnxRuntime(OrtOptions(precision=label))
        if label != "fp32":
            b = OnnxRuntime(OrtOptions()).variant(label, OrtOptions(precision=label))
        b.artifact_cache = be.backends["onnxruntime"].artifact_cache
        (got,) = b.compile(gm, [x])(x)
        keyed.append(float((got - gm(x)[0]).abs().max()))
    assert keyed[0] < 1e-5 and keyed[1] > 1e-5 and keyed[2] < 1e-5


def test_refused_variant_keeps_the_float32_export_cached(fresh_dynamo, tmp_path, caplog):
    """A lowered model outside the tolerance is no sign that the float32 export it was
    made from is bad: that cache entry stays (a piece evicts what its compile was served
    when its result fails to verify)."""
    _needs("int8")
    from arbiter.cache.directory import entries

    # (per_module off: the module-by-module search caches float32 exports of its own
    # segments, which would blur the count below)
    be = arbiter.Arbiter(_ort({"min_block_size": 1, "cache": {"dir": str(tmp_path)},
                               "accuracy": {"atol": 1e-6, "per_module": False}}, ["int8"]))
    assert _run(be, _mlp(7), (16, 64), calls=1) < 1e-5
    assert "priority with onnxruntime:int8" in _graph(be).accuracy.rejected
    kinds = [e.kind for e in entries(tmp_path)]
    assert kinds.count("onnx") == 1 and "onnx-int8" in kinds
    assert not [r for r in caplog.records if "removing onnx entry" in r.getMessage()]
