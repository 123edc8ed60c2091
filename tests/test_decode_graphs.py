"""Decode graphs of generate() stay compiled (issue 47): grouped-query attention in a
symbolic graph on ONNX Runtime (its own export of the CPU flash attention took 8 query
heads against 2 key heads: "ShapeInferenceError: Incompatible dimensions"; the key and
value heads are now repeated in the graph, arbiter/decompose/per_backend.py), and the
second-shape check of a symbolic artifact ties the symbols equal at the first call (a
decoder's cache, mask and position lengths), holding the artifact to them per call
(arbiter/run/dynamic.py). Before, every decode step of a Llama-style model fell to
Inductor per length, then eager."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import arbiter

from conftest import generate_both, tiny_llama

pytest.importorskip("onnxruntime")


def attend(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True) * 2


def test_grouped_query_attention_compiles_symbolically_on_onnxruntime(fresh_dynamo):
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "min_block_size": 1,
                          "against_eager": "off"})
    compiled = torch.compile(attend, backend=be)
    with torch.no_grad():
        for n in (17, 19, 23, 30):  # the key/value length grows, as a cache does
            q, k, v = torch.randn(2, 8, 1, 32), torch.randn(2, 2, n, 32), torch.randn(2, 2, n, 32)
            torch._dynamo.mark_dynamic(k, 2)
            torch._dynamo.mark_dynamic(v, 2)
            torch.testing.assert_close(compiled(q, k, v), attend(q, k, v))
    parts = [p for g in be.report(advice=False).graphs for p in g.partitions]
    assert parts and all(p.backend == "onnxruntime" and not p.fallbacks for p in parts), \
        str(be.report(advice=False))
    assert any(p.shapes == "symbolic" for p in parts), str(be.report(advice=False))


def test_dynamic_cache_generate_stays_on_a_backend(fresh_dynamo, capfd):
    model, ids, kw = tiny_llama(10)
    want, got = generate_both(model, ids, kw, {"backends": ["onnxruntime"], "against_eager": "off",
                                               "cache": {"enabled": False}})
    assert torch.equal(got, want)
    rep = arbiter.report_for(model.forward)
    parts = [p for g in rep.graphs for p in g.partitions]
    compute = [p for p in parts if p.backend != "eager" or p.planned_backend != "eager"]
    assert all(p.backend == "onnxruntime" and not p.fallbacks for p in compute), str(rep)
    assert any(p.shapes == "symbolic" for p in parts), str(rep)
    # the second-shape check's expected failure (the symbols moved apart) is arbiter's
    # to judge: ONNX Runtime's own error log stays off the user's stderr
    assert "onnxruntime" not in capfd.readouterr().err


class _Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_exported_decoder_with_a_dynamic_length_stays_symbolic_after_load(backend, tmp_path):
    """A Llama-style decoder exported with its length a symbol: its rotary tables
    (``alias``, ``cos``, ``sin``) and causal mask (``bitwise_and`` of two masks) are
    probed dynamic, so the loaded partition is one symbolic artifact (was compiled per
    length, eight of them, then ran in eager)."""
    pytest.importorskip(backend)
    model, ids, _ = tiny_llama(1)
    step = _Logits(model).eval()
    length = torch.export.Dim("length", min=4, max=48)
    prog = arbiter.export(step, (ids,), dynamic_shapes={"ids": {1: length}},
                          config={"backends": [backend], "against_eager": "off",
                                  "cache": {"enabled": False}})
    path = tmp_path / "decoder.arbiter"
    prog.save(path)
    loaded = arbiter.load(path)
    with torch.no_grad():
        for n in (8, 5, 13, 21, 30, 9, 40, 17, 11, 25):  # more lengths than per-shape allows
            x = torch.randint(0, 128, (2, n))
            torch.testing.assert_close(loaded(x), step(x))
    rep = loaded.report()
    parts = [p for g in rep.graphs for p in g.partitions]
    big = max(parts, key=lambda p: p.nodes)
    assert big.backend == backend and big.shapes == "symbolic" and not big.fallbacks, str(rep)
