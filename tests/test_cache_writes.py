"""A static cache's write made in place (arbiter/run/cache_writes.py): the functional
``index_copy`` and its trailing ``copy_`` back into the user's buffer become one
``index_copy_`` into it, so a decode step stops copying whole caches; the buffers and
outputs stay eager's, under the paths that run a graph again."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

import arbiter
from arbiter.run import cache_writes
from arbiter.run.cache_writes import write_caches_in_place

from conftest import generate_both, tiny_llama
from test_input_mutation import OPS, Cached, _against_eager

aten = torch.ops.aten


def _graph(model: torch.nn.Module, x: torch.Tensor) -> torch.fx.GraphModule:
    """The inference graph arbiter gets for ``model`` (writes into inputs kept)."""
    got = []

    def keep(gm, example_inputs):
        got.append(gm)
        return gm

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=aot_autograd(
            fw_compiler=keep, keep_inference_input_mutations=True))(x)
    torch._dynamo.reset()
    return got[0]


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_a_large_cache_write_is_made_in_place_and_a_small_one_kept(monkeypatch):
    gm = _graph(Cached().eval(), torch.randn(2, 1, 4))
    assert write_caches_in_place(gm) == 0  # 192 bytes: the copies cost less than a cut
    assert aten.index_copy.default in _targets(gm)
    monkeypatch.setattr(cache_writes, "MIN_BYTES", 0)
    assert write_caches_in_place(gm) == 1
    targets = _targets(gm)
    assert aten.index_copy_.default in targets and aten.index_copy.default not in targets
    # the position counter's write (read by more than its write) stays functional
    assert targets.count(aten.copy_.default) == 1


def test_a_cache_read_elsewhere_keeps_its_functional_write(monkeypatch):
    class ReadTwice(Cached):
        def forward(self, x):
            before = self.cache.sum()
            self.cache.index_copy_(1, self.pos, self.lin(x))
            return self.cache.sum(1) + before

    monkeypatch.setattr(cache_writes, "MIN_BYTES", 0)
    gm = _graph(ReadTwice().eval(), torch.randn(2, 1, 4))
    assert write_caches_in_place(gm) == 0


@pytest.mark.parametrize("extra", [{}, {"policy": "measure"}])
def test_written_in_place_the_buffers_stay_eagers(make_backend, fresh_dynamo, monkeypatch,
                                                 extra):
    """Three calls against eager (outputs and buffers equal after each), also with every
    candidate timed on the first call (runs restored from private copies)."""
    monkeypatch.setattr(cache_writes, "MIN_BYTES", 0)
    make_backend("fake", OPS)
    be = arbiter.Arbiter({"backends": ["fake"], "min_block_size": 1,
                          "against_eager": "off", **extra})
    _against_eager(be)
    eager_ops = [op for g in be.report(advice=False).graphs for p in g.partitions
                 if p.backend == "eager" for op in p.ops]
    assert any("index_copy_" in op for op in eager_ops), eager_ops


def test_static_cache_generate_with_the_cache_written_in_place(fresh_dynamo, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.setattr(cache_writes, "MIN_BYTES", 0)
    model, ids, kw = tiny_llama(5, cache_implementation="static")
    want, got = generate_both(model, ids, kw, {"backends": ["onnxruntime"], "policy": "measure",
                                               "cache": {"enabled": False}})
    assert torch.equal(got, want)
    rep = arbiter.report_for(model.forward)
    ops = [op for g in rep.graphs for p in g.partitions for op in p.ops]
    assert any("index_copy_" in op for op in ops), str(rep)
