"""Outputs saved for backward are right: training through arbiter gives eager's gradients.

A forward partition returns, besides what the user sees, values only the backward graph
reads (cross-entropy's ``total_weight``, layer norm's statistics, SDPA's logsumexp). A
backend that gets one of them wrong leaves the loss right and every gradient wrong (the
cross-entropy case: gradients multiplied by the batch size). Guarded three ways: the
probe compares every output of tuple-returning ops and records the wrong ones in the
manifest (``wrong_outputs``; a node using one is refused, tests/test_probe.py); `verify`
compares every output of a partition, saved ones included (below); and these tests train
against eager.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import arbiter

TOL = {"rtol": 1e-4, "atol": 1e-5}

CROSS_ENTROPY = {
    "mean": {},
    "sum": {"reduction": "sum"},
    "ignore_index": {"ignore_index": 2},
    "label_smoothing": {"label_smoothing": 0.1},
    "weight": {"weight": torch.tensor([0.5, 2.0, 1.0, 3.0])},
    "weight_ignore_mean": {"weight": torch.tensor([0.5, 2.0, 1.0, 3.0]), "ignore_index": 0},
}

#: The default config's plan, untimed: timed against eager (the default), a small graph
#: may run in eager, and these must check the backends' gradients.
UNTIMED = arbiter.load_config(None).model_copy(update={"against_eager": "off"})


@pytest.mark.parametrize("case", sorted(CROSS_ENTROPY))
def test_cross_entropy_trains_like_eager(case, fresh_dynamo):
    """The issue's repro (Linear + cross-entropy, default config) over a few SGD steps."""
    kwargs = CROSS_ENTROPY[case]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    ref = copy.deepcopy(model)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    be = arbiter.Arbiter(UNTIMED)

    def loss_of(m):
        return lambda x, y: nn.functional.cross_entropy(m(x), y, **kwargs)

    step = torch.compile(loss_of(model), backend=be)
    ref_step = loss_of(ref)
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.5) for m in (model, ref))
    for _ in range(3):
        loss, ref_loss = step(x, y), ref_step(x, y)
        loss.backward(), ref_loss.backward()
        torch.testing.assert_close(loss, ref_loss, **TOL)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **TOL)
        opt.step(), ref_opt.step()
        opt.zero_grad(), ref_opt.zero_grad()
    ran = {p.backend for g in be.report(advice=False).graphs for p in g.partitions}
    assert "onnxruntime" in ran  # compiled, not all eager


def test_issue_repro_ratio_is_one(fresh_dynamo):
    torch.manual_seed(0)
    m = nn.Linear(16, 4)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))

    def f(x, y):
        return nn.functional.cross_entropy(m(x), y)

    f(x, y).backward()
    ref = m.weight.grad.clone()
    m.zero_grad(set_to_none=True)
    torch.compile(f, backend=arbiter.Arbiter(UNTIMED))(x, y).backward()
    assert float((m.weight.grad / ref).median()) == pytest.approx(1.0, abs=1e-5)


def test_shipped_manifest_refuses_ort_total_weight(fresh_dynamo):
    """What `arbiter probe onnxruntime` found: torchlib's nll_loss_forward returns 1 for
    total_weight. The backward graph reads it, so in training the node is refused."""
    entry = arbiter.get_backend_class("onnxruntime").manifest().entry(
        "aten.nll_loss_forward.default")
    assert entry is not None
    assert any(k == 1 and torch.float32 in dtypes for k, dtypes, _ in entry.wrong_outputs)


def _corrupt_saved(self, gm, example_inputs):
    """A backend that returns tanh's value wrong when a partition returns it: in
    ``_TanhTimesTwo`` only the backward graph reads it (the user sees 2 * tanh, computed
    right inside the partition)."""
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    corrupt = [k for k, a in enumerate(out_node.args[0])
               if isinstance(a, torch.fx.Node) and a.target is torch.ops.aten.tanh.default]

    def fn(*args):
        out = list(gm(*args))
        for k in corrupt:
            out[k] = out[k] * 1.5
        return out
    return fn


class _TanhTimesTwo(nn.Module):
    """The output is 2 * tanh(...); tanh itself is saved for backward, never returned."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.fc(x)) * 2


@pytest.mark.parametrize("verify", ["off", "first"])
def test_verify_checks_outputs_saved_for_backward(make_backend, fresh_dynamo, verify):
    """A saved tanh output (tanh_backward reads it) corrupted by the backend: without
    verify the gradients are silently wrong; with verify the piece is demoted at its
    first call and the gradients are eager's."""
    make_backend("saver", ["aten.mm.default", "aten.tanh.default", "aten.t.default",
                           "aten.addmm.default", "aten.sum.default", "aten.mul.Tensor"],
                 compile=_corrupt_saved)
    torch.manual_seed(0)
    model = _TanhTimesTwo()
    ref = copy.deepcopy(model)
    x = torch.randn(4, 8)
    be = arbiter.Arbiter({"backends": ["saver"], "min_block_size": 1,
                          "verify": {"mode": verify}, "against_eager": "off"})
    out = torch.compile(model, backend=be)(x)
    ref_out = ref(x)
    torch.testing.assert_close(out, ref_out, **TOL)  # what the user sees is right
    out.sum().backward()
    ref_out.sum().backward()
    same = all(torch.allclose(p.grad, q.grad, **TOL)
               for p, q in zip(model.parameters(), ref.parameters()))
    fwd = next(g for g in be.report(advice=False).graphs if g.kind == "forward")
    falls = [f for p in fwd.partitions for f in p.fallbacks]
    if verify == "off":
        assert not same and not falls  # the failure this guards against, unseen
    else:
        assert same
        assert falls and falls[0].stage == "verify" and falls[0].from_backend == "saver"
