"""Which dtypes a node reads or writes as values (arbiter.ops.value_dtypes): a backend
that holds int64 in 32 bits (OpenVINO's CPU plugin) is refused values, not positions."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from arbiter.ops import op_name, value_dtypes
from conftest import trace

W = torch.randn(10, 4)
IDS = torch.zeros(1, 8, dtype=torch.int64)


def _nodes(gm, packet):
    return [n for n in gm.graph.nodes if n.op == "call_function"
            and op_name(n.target).startswith(packet + ".")]


def test_ids_moved_into_an_embedding_are_positions():
    """BERT's token-type ids: an int64 buffer sliced and expanded, read only as an
    embedding's indices."""
    gm = trace(lambda ids, w: F.embedding(ids[:, :3].expand(2, 3), w), IDS, W)
    for packet in ("aten.slice", "aten.expand", "aten.embedding"):
        (node,) = _nodes(gm, packet)
        assert torch.int64 not in value_dtypes(node), packet


def test_ids_computed_with_are_values():
    gm = trace(lambda ids, w: F.embedding(ids[:, :3] + 1, w), IDS, W)
    (node,) = _nodes(gm, "aten.slice")
    assert torch.int64 in value_dtypes(node)


def test_ids_also_returned_are_values():
    def f(ids, w):
        moved = ids[:, :3].expand(2, 3)
        return F.embedding(moved, w), moved

    gm = trace(f, IDS, W)
    (node,) = _nodes(gm, "aten.expand")
    assert torch.int64 in value_dtypes(node)
    (node,) = _nodes(gm, "aten.slice")
    assert torch.int64 in value_dtypes(node)


def test_the_plan_keeps_the_moved_ids_on_the_narrow_backend():
    """Under cpu_all (OpenVINO first), the slice and expand feeding the embedding are
    OpenVINO's; an add on the same ids is not (its int64 values could pass 2**31)."""
    import pytest

    import arbiter

    pytest.importorskip("openvino", reason="openvino is not installed")
    moved = trace(lambda ids, w: F.embedding(ids[:, :3].expand(2, 3), w) * 2, IDS, W)
    plan = arbiter.partition(moved, {"backends": ["openvino"], "fallback": ["eager"],
                                     "min_block_size": 1})
    got = {op_name(n.target): p.backend for p in plan.partitions for n in p.nodes}
    assert got["aten.slice.Tensor"] == got["aten.expand.default"] == "openvino", got
    added = trace(lambda ids, w: F.embedding(ids[:, :3] + 1, w) * 2, IDS, W)
    plan = arbiter.partition(added, {"backends": ["openvino"], "fallback": ["eager"],
                                     "min_block_size": 1})
    got = {op_name(n.target): p.backend for p in plan.partitions for n in p.nodes}
    assert got["aten.add.Tensor"] == "eager", got
