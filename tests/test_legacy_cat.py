"""``cat`` without the 1-D empty tensors it skips by torch's legacy rule (run/legacy_cat.py)."""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import arbiter
from arbiter.run.legacy_cat import drop_legacy_empty


def _cats(gm):
    return [n for n in gm.graph.nodes if n.target is torch.ops.aten.cat.default]


def _check(fn, *args) -> torch.fx.GraphModule:
    gm = make_fx(fn, tracing_mode="fake")(*args)
    want = fn(*args)
    drop_legacy_empty(gm)
    gm.graph.lint()
    got = gm(*args)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
        assert g.dtype == w.dtype and g.shape == w.shape
    return gm


def test_the_caches_first_cat_becomes_a_copy_of_the_key():
    """``cat([empty(0), key], -2)`` (a key/value cache's first step): a contiguous copy
    of the key, never the key itself (cat returns a tensor of its own)."""
    key = torch.randn(1, 2, 5, 4).transpose(1, 2)  # not contiguous

    def f(k):
        return (torch.cat([torch.empty(0), k], dim=-2),)

    gm = _check(f, key)
    assert not _cats(gm)
    out = gm(key)[0]
    assert out.is_contiguous() and out.data_ptr() != key.data_ptr()
    assert not [n for n in gm.graph.nodes if n.target is torch.ops.aten.empty.memory_format]


def test_several_inputs_left_stay_a_cat_of_them():
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    gm = _check(lambda a, b: (torch.cat([a, torch.zeros(0), b]),), a, b)
    (cat,) = _cats(gm)
    assert len(cat.args[0]) == 2


def test_a_cat_the_empty_tensor_promotes_is_left_as_it_is():
    """A float64 ``(0,)`` beside float32 makes the result float64: not rewritten."""
    x = torch.randn(2, 3)
    gm = _check(lambda x: (torch.cat([torch.zeros(0, dtype=torch.float64), x]),), x)
    assert len(_cats(gm)) == 1 and len(_cats(gm)[0].args[0]) == 2


def test_one_dimensional_cats_are_left_as_they_are():
    """1-D cats of an empty tensor are ordinary (no legacy rule): left alone."""
    x = torch.randn(3)
    gm = _check(lambda x: (torch.cat([torch.zeros(0), x]),), x)
    assert len(_cats(gm)) == 1


class Cached(torch.nn.Module):
    """A decoder step with an empty key/value cache, as transformers' DynamicCache is on
    its first call."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        k = self.proj(x).view(1, 8, 2, 8).transpose(1, 2)
        k = torch.cat([torch.tensor([]), k], dim=-2)
        return torch.relu(k).sum(-1) * 2.0


def test_a_cache_step_is_one_openvino_partition(fresh_dynamo):
    """OpenVINO refuses the legacy cat (its Concat rejects a 1-D empty input), which cut
    the graph around every cache update; rewritten, it is one partition."""
    pytest.importorskip("openvino", reason="openvino is not installed")
    torch.manual_seed(0)
    model, x = Cached().eval(), torch.randn(1, 8, 16)
    be = arbiter.Arbiter({"backends": ["openvino"], "min_block_size": 1,
                          "against_eager": "off", "policy": "priority"})
    with torch.no_grad():
        out = torch.compile(model, backend=be)(x)
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    (g,) = be.report(advice=False).graphs
    assert [(p.backend, bool(p.fallbacks)) for p in g.partitions] == [("openvino", False)], \
        [(p.backend, p.ops) for p in g.partitions]
