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

from conftest import tiny_llama

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


def test_dynamic_cache_generate_stays_on_a_backend(fresh_dynamo):
    model, ids, kw = tiny_llama(10)
    with torch.no_grad():
        want = model.generate(ids, **kw)
        model.forward = torch.compile(model.forward, backend="arbiter", options={
            "backends": ["onnxruntime"], "against_eager": "off", "cache": {"enabled": False}})
        got = model.generate(ids, **kw)
    assert torch.equal(got, want)
    rep = arbiter.report_for(model.forward)
    parts = [p for g in rep.graphs for p in g.partitions]
    compute = [p for p in parts if p.backend != "eager" or p.planned_backend != "eager"]
    assert all(p.backend == "onnxruntime" and not p.fallbacks for p in compute), str(rep)
    assert any(p.shapes == "symbolic" for p in parts), str(rep)
