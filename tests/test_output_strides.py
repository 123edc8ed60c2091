"""A partition's outputs reach the nodes after it in the layout they were traced with.

Found on GPT-2 training (issue 17): a partition received a ``cat`` of one non-empty
tensor in that tensor's transposed order (Inductor's decomposition of it) where eager
and the trace made it contiguous; the ``view`` after it failed in every backend of the
chain, eager's included ("view size is not compatible")."""
from __future__ import annotations

import torch

import arbiter


def _column_major(self, gm, example_inputs):
    """A backend computing the right values, each 2-d output in column-major layout (a
    layout choice real backends make)."""
    def run(*args):
        return [o.t().contiguous().t() if isinstance(o, torch.Tensor) and o.dim() == 2
                else o for o in gm(*args)]
    return run


def f(x):
    # mul: the backend; view (needs the traced, contiguous layout) and add: eager
    return (x * 2).view(-1) + 1


def test_output_in_another_layout_is_restrided_for_eager_after_it(make_backend,
                                                                   fresh_dynamo):
    make_backend("colmajor", ["aten.mul.Tensor"], compile=_column_major)
    be = arbiter.Arbiter({"backends": ["colmajor"], "min_block_size": 1})
    compiled = torch.compile(f, backend=be)
    for seed in range(3):  # the first calls learn the layout, later ones keep restriding
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(compiled(x), f(x))
    (part,) = [p for p in be.report().graphs[0].partitions if not p.inline]
    assert (part.backend, part.fallbacks) == ("colmajor", [])
    assert part.restride_copies == 3


def test_symbolic_output_in_another_layout_is_restrided(make_backend, fresh_dynamo):
    # the same with dynamic shapes (arbiter/run/dynamic.py's OutputCheck)
    make_backend("colmajor", ["aten.mul.Tensor"], compile=_column_major, dynamic=True)
    be = arbiter.Arbiter({"backends": ["colmajor"], "min_block_size": 1})
    compiled = torch.compile(f, backend=be, dynamic=True)
    for n in (4, 7):
        x = torch.randn(n, 6)
        torch.testing.assert_close(compiled(x), f(x))
    parts = [p for g in be.report().graphs for p in g.partitions if not p.inline]
    assert [(p.backend, p.shapes, p.fallbacks) for p in parts] == \
        [("colmajor", "symbolic", [])]
    assert parts[0].restride_copies >= 2


def attention_keys(x):
    # GPT-2's first attention step in training (transformers' DynamicCache): an empty
    # key cache concatenated with the keys, a transposed slice of the fused QKV output;
    # eager's cat is contiguous, and the matmul's view after it relies on that
    keys = x[:, :, 4:8].view(2, 3, 2, 2).transpose(1, 2)
    cache = torch.cat([torch.tensor([]), keys], -2)
    return cache.view(4, 3, 2) * 2


def test_inductor_compiles_a_cat_of_one_tensor_in_eagers_layout(fresh_dynamo):
    """Before: Inductor's decomposition kept the transposed layout and its own trace of
    the view failed ("Cannot view a tensor with shape [2, 2, 3, 2] and strides ..."):
    the partition fell back to eager (GPT-2's whole training forward did)."""
    be = arbiter.Arbiter({"backends": ["inductor"], "min_block_size": 1})
    compiled = torch.compile(attention_keys, backend=be)
    for seed in range(2):
        x = torch.randn(2, 3, 12, generator=torch.Generator().manual_seed(seed))
        got, want = compiled(x), attention_keys(x)
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()
    parts = [p for p in be.report().graphs[0].partitions if not p.inline]
    assert [(p.backend, p.fallbacks) for p in parts] == [("inductor", [])]
