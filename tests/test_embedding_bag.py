"""EmbeddingBag trains like eager (issue 25, item 3).

ONNX Runtime's export of ``aten._embedding_bag`` (onnxscript's torchlib) computes the
bags right but returns offset2bag, bag_size and max_indices as zeros, which the backward
reads: one training step under arbiter gave weight gradients off by 7.7 (max) and 3.8
(mean). OpenVINO ignores ``padding_idx`` (the padded rows are summed) and converts only
the first output. Both now refuse the node when it would be wrong
(backends/_onnx_export.py, backends/_openvino_checks.py); these tests train every mode
against eager under `default` and `cpu_all`, untimed (so the backends take the graph),
and check where the embedding bag ran and why the others refused it.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import arbiter

pytest.importorskip("onnxruntime")

TOL = {"rtol": 1e-4, "atol": 1e-5}  # float32 (verify's defaults); the bug was 3.8-7.7
BAG = "aten._embedding_bag.default"
INDICES = torch.tensor([3, 49, 7, 7, 0, 49, 12, 2, 49, 5, 18, 3])
OFFSETS = torch.tensor([0, 3, 3, 5, 9])  # bag 1 is empty

#: name -> (F.embedding_bag keyword arguments, 1-D indices with offsets?)
CASES = {
    "sum": ({"mode": "sum"}, False),
    "mean": ({"mode": "mean"}, False),
    "max": ({"mode": "max"}, False),
    "sum_offsets": ({"mode": "sum"}, True),
    "mean_offsets": ({"mode": "mean"}, True),
    "max_offsets": ({"mode": "max"}, True),
    "sum_per_sample_weights": ({"mode": "sum", "per_sample_weights": True}, True),
    "sum_padding_idx": ({"mode": "sum", "padding_idx": 49}, True),
    "mean_padding_idx": ({"mode": "mean", "padding_idx": 49}, True),
    "max_padding_idx": ({"mode": "max", "padding_idx": 49}, True),
    "sum_include_last_offset": ({"mode": "sum", "include_last_offset": True}, True),
    "mean_include_last_offset": ({"mode": "mean", "include_last_offset": True}, True),
}

#: What ONNX Runtime takes in a training graph, where the backward reads every output:
#: sum mode without padding_idx (eager's offset2bag is empty there, its bag_size and
#: max_indices zeros, as the export's) and without include_last_offset.
ORT_TRAINS = {"sum", "sum_offsets", "sum_per_sample_weights"}


class Bags(nn.Module):
    """An embedding bag, then enough compute that the graph is no tiny partition."""

    def __init__(self, kwargs: dict):
        super().__init__()
        self.kwargs = dict(kwargs)
        self.w = nn.Parameter(torch.randn(50, 8))
        self.proj = nn.Parameter(torch.randn(8, 4))
        if self.kwargs.pop("per_sample_weights", False):
            self.psw = nn.Parameter(torch.rand(len(INDICES)))
        else:
            self.psw = None

    def forward(self, i, offsets=None):
        h = F.embedding_bag(i, self.w, offsets, per_sample_weights=self.psw, **self.kwargs)
        return (h * 0.5 + 1.0) @ self.proj


def _inputs(with_offsets: bool, kwargs: dict) -> tuple:
    if not with_offsets:
        return (INDICES.reshape(3, 4),)
    if kwargs.get("include_last_offset"):
        return INDICES, torch.cat([OFFSETS, torch.tensor([len(INDICES)])])
    return INDICES, OFFSETS


def _config(name: str) -> dict:
    """A shipped config's backends, in priority order, untimed and without a minimum
    partition size: the backends take even these small graphs, and a node refused by one
    goes to the next able one (policy calibrated would put a graph this small where a
    call costs least, whole)."""
    cfg = arbiter.load_config(name).model_dump(mode="json", exclude={"source"})
    return {**cfg, "against_eager": "off", "min_block_size": 1, "policy": "priority"}


def _bag_ops(be, kind: str):
    return [o for g in be.report(advice=False).graphs if g.kind == kind for o in g.ops
            if o.op == BAG]


@pytest.mark.parametrize("config", ["default", "cpu_all"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_embedding_bag_trains_like_eager(case, config, fresh_dynamo):
    if config == "cpu_all":
        pytest.importorskip("openvino")
    kwargs, with_offsets = CASES[case]
    torch.manual_seed(0)
    model = Bags(kwargs)
    ref = copy.deepcopy(model)
    args = _inputs(with_offsets, kwargs)
    be = arbiter.Arbiter(_config(config))
    out = torch.compile(model, backend=be)(*args)
    expected = ref(*args)
    torch.testing.assert_close(out, expected, **TOL)
    out.pow(2).sum().backward()
    expected.pow(2).sum().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL, msg=lambda m: f"{name}: {m}")

    [bag] = _bag_ops(be, "forward")
    if case in ORT_TRAINS:
        assert bag.placed == {"onnxruntime": 1}, bag
    else:  # refused, and Inductor runs it (ATen's own kernel inside Inductor's code)
        assert "ONNX export returns" in bag.refused["onnxruntime"], bag.refused
        assert bag.placed == {"inductor": 1}, bag
    if config == "cpu_all":  # every output is read by the backward: OpenVINO converts one
        assert "OpenVINO converts only output 0" in bag.refused["openvino"] or \
            "counts the padded rows" in bag.refused["openvino"], bag.refused


@pytest.mark.parametrize("config", ["default", "cpu_all"])
@pytest.mark.parametrize("case", ["sum_offsets", "mean_padding_idx", "max_offsets",
                                  "sum_per_sample_weights"])
def test_embedding_bag_inference_reads_only_the_bags(case, config, fresh_dynamo):
    """Without a backward only output 0 is read: ONNX Runtime computes it right in every
    mode and keeps the node; OpenVINO refuses padding_idx (it counts the padded rows)."""
    if config == "cpu_all":
        pytest.importorskip("openvino")
    kwargs, with_offsets = CASES[case]
    torch.manual_seed(0)
    model = Bags(kwargs)
    args = _inputs(with_offsets, kwargs)
    be = arbiter.Arbiter(_config(config))
    with torch.no_grad():
        out = torch.compile(model, backend=be)(*args)
        torch.testing.assert_close(out, model(*args), **TOL)
    [bag] = _bag_ops(be, "inference")
    assert "onnxruntime" not in bag.refused, bag.refused
    if config == "default":
        assert bag.placed == {"onnxruntime": 1}, bag
    elif "padding_idx" in kwargs:
        assert "counts the padded rows" in bag.refused["openvino"], bag.refused
        assert bag.placed == {"onnxruntime": 1}, bag
    else:
        assert "openvino" not in bag.refused, bag.refused


def test_the_issue_repro_gives_eagers_gradient(fresh_dynamo):
    """The issue's repro: max mode, two-dimensional indices, one backward (7.74 before)."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(50, 8))

        def forward(self, i):
            return F.embedding_bag(i, self.w, mode="max")

    torch.manual_seed(0)
    m = M()
    ref = copy.deepcopy(m)
    i = torch.randint(0, 50, (4, 6))
    cfg = {"backends": ["onnxruntime", "inductor"], "fallback": ["eager"],
           "against_eager": "off"}
    torch.compile(m, backend=arbiter.Arbiter(cfg))(i).pow(2).sum().backward()
    ref(i).pow(2).sum().backward()
    assert float((m.w.grad - ref.w.grad).abs().max()) == 0.0


def test_tensorrt_refuses_what_the_export_gets_wrong():
    """TensorRT builds from the same export: the same validator, without a GPU (plan
    only): the max-mode node of a training forward is refused for its outputs."""
    from arbiter.backends._onnx_export import EXPORT_VALIDATORS
    from arbiter.registry import get_backend_class

    validator = get_backend_class("tensorrt").validators["aten._embedding_bag"]
    assert validator is EXPORT_VALIDATORS["aten._embedding_bag"]
    from torch.fx.experimental.proxy_tensor import make_fx

    def fwd(w, i, o):
        out = torch.ops.aten._embedding_bag.default(w, i, o, False, 2)
        return out[0], out[3]  # the result and max_indices, as a training forward

    gm = make_fx(fwd, tracing_mode="fake")(torch.randn(50, 8), INDICES, OFFSETS)
    node = next(n for n in gm.graph.nodes if n.target is torch.ops.aten._embedding_bag.default)
    assert "3 (max_indices)" in validator(node)
