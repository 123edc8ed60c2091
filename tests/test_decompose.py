"""Per-backend decompositions (arbiter/decompose/): a node is decomposed only for the
backend that takes it, the others get it whole; backward graphs stay whole on ONNX
Runtime; gradients equal eager's."""
from __future__ import annotations

import copy

import pytest
import torch
import yaml
from torch import nn

import arbiter
from arbiter.decompose import for_names
from arbiter.decompose.own import _convolution_backward
from arbiter.ops import op_name

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _ops(gm) -> set[str]:
    return {op_name(n.target) for n in gm.graph.nodes if n.op == "call_function"}


def _spy(be: arbiter.Arbiter, name: str, fail: bool = False) -> list:
    """Record every graph handed to backend ``name``'s compile (and make it fail)."""
    backend = be.backends[name]
    original = backend.compile
    seen: list = []

    def compile(gm, example_inputs):
        seen.append(gm)
        if fail:
            raise RuntimeError("injected compile failure")
        return original(gm, example_inputs)

    backend.compile = compile
    return seen


def _train(model, inputs, be, steps=2):
    """Forward + backward through ``be`` and eager, ``steps`` times: the largest
    differences of outputs and gradients (asserted close)."""
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend=be)
    for step in range(steps):
        torch.manual_seed(step)
        out = compiled(*inputs)
        out.float().pow(2).mean().backward()
        torch.manual_seed(step)
        want = ref(*inputs)
        want.float().pow(2).mean().backward()
        torch.testing.assert_close(out, want, **TOL)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **TOL, msg=lambda m: f"{name}: {m}")
        for m in (model, ref):
            m.zero_grad()


class TanhMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def test_the_backend_that_asked_gets_the_node_decomposed(fresh_dynamo):
    """ONNX Runtime's manifest decomposes tanh_backward: its backward partition gets
    the decomposition (no tanh_backward), the plan keeps the node whole."""
    torch.manual_seed(0)
    be = arbiter.Arbiter({"backends": ["onnxruntime", "inductor"], "min_block_size": 1,
                          "against_eager": "off"})
    seen = _spy(be, "onnxruntime")
    _train(TanhMLP(), (torch.randn(4, 8),), be)
    backward = [g for g in be.graphs if g.kind == "backward"][0]
    assert "aten.tanh_backward.default" in _ops(backward.plan.graph_module)  # not lowered away
    assert [p.backend for p in backward.plan.partitions] == ["onnxruntime"]
    handed = [_ops(gm) for gm in seen]
    assert not any("aten.tanh_backward.default" in ops for ops in handed)
    assert any("aten.mul.Tensor" in ops and "aten.sub.Tensor" in ops for ops in handed)


def test_another_backend_gets_the_node_whole(fresh_dynamo):
    """Inductor first: it takes tanh_backward as it is; ONNX Runtime's wish changes
    nothing there."""
    torch.manual_seed(0)
    be = arbiter.Arbiter({"backends": ["inductor", "onnxruntime"], "min_block_size": 1})
    seen = _spy(be, "inductor")
    _train(TanhMLP(), (torch.randn(4, 8),), be)
    assert any("aten.tanh_backward.default" in _ops(gm) for gm in seen)


def test_a_fallback_gets_the_partition_as_planned(fresh_dynamo):
    """ONNX Runtime fails to compile: the next backend gets the backward partition with
    tanh_backward whole (the decomposition was ONNX Runtime's alone)."""
    torch.manual_seed(0)
    be = arbiter.Arbiter({"backends": ["onnxruntime", "inductor"], "min_block_size": 1,
                          "against_eager": "off"})
    _spy(be, "onnxruntime", fail=True)
    seen = _spy(be, "inductor")
    _train(TanhMLP(), (torch.randn(4, 8),), be)
    assert any("aten.tanh_backward.default" in _ops(gm) for gm in seen)
    backward = [g for g in be.report(advice=False).graphs if g.kind == "backward"][0]
    assert {p.backend for p in backward.partitions} == {"inductor"}


def test_a_decomposition_the_backend_cannot_run_is_refused_with_why(tmp_path, fresh_dynamo):
    """Without `aten.rsub` in its decompositions, ONNX Runtime cannot run tanh_backward's
    decomposition (rsub is not in its manifest): refused, the reason names rsub."""
    from arbiter.backends.onnxruntime import OnnxRuntime

    doc = yaml.safe_load(OnnxRuntime.manifest_path().read_text())
    doc["decompositions"] = [d for d in doc["decompositions"] if d != "aten.rsub"]
    path = tmp_path / "ort.yaml"
    path.write_text(yaml.safe_dump(doc))
    be = arbiter.Arbiter({"backends": ["onnxruntime", "inductor"], "min_block_size": 1,
                          "against_eager": "off",
                          "manifests": {"onnxruntime": str(path)}})
    torch.manual_seed(0)
    _train(TanhMLP(), (torch.randn(4, 8),), be)
    backward = [g for g in be.report(advice=False).graphs if g.kind == "backward"][0]
    op = next(o for o in backward.ops if o.op == "aten.tanh_backward.default")
    assert "onnxruntime" not in op.able
    assert "aten.rsub.Scalar" in op.refused["onnxruntime"]
    assert "decomposed for onnxruntime" in op.refused["onnxruntime"]


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("stride,padding,dilation", [(1, 0, 1), (2, 1, 1), (3, 2, 2), (2, 0, 3)])
def test_convolution_backward_decomposition_equals_aten(nd, stride, padding, dilation):
    """arbiter's own decomposition (PyTorch's table has none) against ATen's kernel."""
    torch.manual_seed(nd * 100 + stride * 10 + dilation)
    x = torch.randn(2, 3, *[9 + k for k in range(nd)], dtype=torch.float64)
    w = torch.randn(5, 3, *[3] * nd, dtype=torch.float64)
    args = ([stride] * nd, [padding] * nd, [dilation] * nd, False, [0] * nd, 1)
    out = torch.ops.aten.convolution(x, w, None, *args)
    g = torch.randn_like(out)
    for mask in ([True, True, True], [True, False, False], [False, True, True]):
        want = torch.ops.aten.convolution_backward(g, x, w, [5], *args, mask)
        got = _convolution_backward(g, x, w, [5], *args, mask)
        for a, b in zip(want, got):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(b, a)


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("groups,cin,cout", [(2, 4, 6), (4, 4, 4), (4, 4, 8), (3, 6, 3)])
@pytest.mark.parametrize("stride,padding,dilation,output_padding",
                         [(1, 0, 1, 0), (2, 1, 1, 1), (3, 2, 2, 1), (2, 0, 3, 0)])
def test_grouped_and_transposed_convolution_backward_equals_aten(
        nd, transposed, groups, cin, cout, stride, padding, dilation, output_padding):
    """Grouped (depthwise: groups == channels) and transposed convolutions, output
    padding included, against ATen's kernel."""
    torch.manual_seed(nd * 1000 + groups * 100 + stride * 10 + dilation)
    op = output_padding if transposed else 0
    x = torch.randn(2, cin, *[7 + k for k in range(nd)], dtype=torch.float64)
    shape = (cin, cout // groups) if transposed else (cout, cin // groups)
    w = torch.randn(*shape, *[3] * nd, dtype=torch.float64)
    args = ([stride] * nd, [padding] * nd, [dilation] * nd, transposed, [op] * nd, groups)
    out = torch.ops.aten.convolution(x, w, None, *args)
    g = torch.randn_like(out)
    for mask in ([True, True, True], [True, False, False], [False, True, False]):
        want = torch.ops.aten.convolution_backward(g, x, w, [out.shape[1]], *args, mask)
        got = _convolution_backward(g, x, w, [out.shape[1]], *args, mask)
        for a, b in zip(want, got):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(b, a)


def test_grouped_and_transposed_convolution_training_on_onnx_runtime(fresh_dynamo):
    """Grouped, depthwise and transposed convolutions (stride, padding, output padding,
    dilation): their backward is one ONNX Runtime partition (grouped and transposed
    ``convolution_backward`` stayed whole in eager before), gradients eager's."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(4, 8, 3, groups=2), nn.ReLU(), nn.Conv2d(8, 8, 3, groups=8, padding=1),
        nn.ReLU(), nn.ConvTranspose2d(8, 6, 3, stride=2, padding=1, output_padding=1),
        nn.ReLU(), nn.ConvTranspose2d(6, 6, 3, stride=2, groups=3, dilation=2))
    be = arbiter.Arbiter({"backends": ["onnxruntime", "inductor"], "min_block_size": 1,
                          "against_eager": "off"})
    _train(model, (torch.randn(2, 4, 9, 9),), be)
    backward = [g for g in be.report(advice=False).graphs if g.kind == "backward"][0]
    assert [(p.backend, bool(p.fallbacks)) for p in backward.partitions] == \
        [("onnxruntime", False)]
    op = next(o for o in backward.ops if o.op == "aten.convolution_backward.default")
    assert op.nodes == 4 and op.placed.get("onnxruntime") == 4


def test_decompositions_apply_leaves_the_partition_alone():
    """``apply`` works on a copy: the graph eager and the other backends run is intact."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(g, y):
        return (torch.ops.aten.tanh_backward(g, y) * 2,)

    gm = make_fx(f, tracing_mode="fake")(torch.randn(3, 4), torch.randn(3, 4))
    dec = for_names(["aten.tanh_backward", "aten.rsub"])
    new = dec.apply(gm)
    assert "aten.tanh_backward.default" in _ops(gm)
    assert "aten.tanh_backward.default" not in _ops(new)
    g, y = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(new(g, y)[0], gm(g, y)[0])
    assert for_names(["aten.gelu_backward"]).apply(gm) is gm  # nothing to do: the same graph


@pytest.mark.parametrize("model", ["small_cnn", "gpt2_tiny"])
def test_backward_graphs_stay_whole_and_match_eager(model, fresh_dynamo):
    """The default config: the backward graph is one ONNX Runtime partition (was 2 for
    the small CNN, 19 for the demo's GPT-2 before per-backend decompositions), and the
    gradients are eager's."""
    from arbiter.cli.examples import load_model

    if model == "gpt2_tiny":
        pytest.importorskip("transformers")
    net, inputs = load_model(model)
    net.train()
    # the default config's plan (untimed: eager may win the timing against it)
    be = arbiter.Arbiter(arbiter.load_config(None).model_copy(update={"against_eager": "off"}))
    _train(net, inputs, be)
    report = be.report(advice=False)
    backward = [g for g in report.graphs if g.kind == "backward"]
    assert backward and all(len(g.partitions) == 1 for g in backward), \
        [[(p.backend, p.nodes) for p in g.partitions] for g in backward]
    assert all(p.backend == "onnxruntime" and not p.fallbacks
               for g in backward for p in g.partitions)


@pytest.mark.parametrize("shape,dim,correction,keepdim", [
    ((4, 3, 5, 5), [0, 2, 3], 0, False), ((4, 3, 5, 5), [0, 2, 3], 1, True),
    ((6, 7), -1, None, False), ((6, 7), None, 2, True), ((2, 3, 4), [1], 1, False)])
def test_var_mean_decomposition_equals_aten(shape, dim, correction, keepdim):
    """arbiter's var_mean (ATen reductions, no prims) against ATen's kernel."""
    from arbiter.decompose.own import _var_mean

    torch.manual_seed(len(shape) + (correction or 0))
    x = torch.randn(*shape, dtype=torch.float64) * 3 + 1
    want = torch.ops.aten.var_mean.correction(x, dim, correction=correction, keepdim=keepdim)
    got = _var_mean(x, dim, correction=correction, keepdim=keepdim)
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a)


def test_squeeze_dims_decomposition_equals_aten():
    from arbiter.decompose.own import _squeeze_dims

    x = torch.randn(1, 3, 1, 4, 1)
    for dims in ([0], [0, 2], [-1, 1], [1]):  # [1]: size 3, kept
        torch.testing.assert_close(_squeeze_dims(x, dims), torch.ops.aten.squeeze.dims(x, dims))


@pytest.mark.parametrize("first", ["onnxruntime", "inductor"])
def test_training_batch_norm_on_a_backend_with_batch_statistics(first, fresh_dynamo):
    """Training batch norm is decomposed for ONNX Runtime (batch statistics, new running
    statistics as outputs; the exporter's own BatchNormalization normalizes with the
    running statistics: refused by its validator), Inductor takes it whole: placed on
    the first backend, not in eager; outputs, gradients and the running statistics
    equal eager's over steps."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 4, 3), nn.BatchNorm2d(4, momentum=0.3))
    model.train()
    ref = copy.deepcopy(model)
    backends = ["onnxruntime", "inductor"] if first == "onnxruntime" else ["inductor"]
    be = arbiter.Arbiter({"backends": backends, "min_block_size": 3, "against_eager": "off"})
    compiled = torch.compile(model, backend=be)
    for step in range(3):
        x = torch.randn(4, 3, 10, 10) * (step + 1) + step  # statistics that move
        out = compiled(x)
        out.pow(2).mean().backward()
        want = ref(x)
        want.pow(2).mean().backward()
        torch.testing.assert_close(out, want, **TOL)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **TOL, msg=lambda m: f"{name}: {m}")
        for (name, b), c in zip(model.named_buffers(), ref.buffers()):
            torch.testing.assert_close(b, c, **TOL, msg=lambda m: f"{name}: {m}")
        for m in (model, ref):
            m.zero_grad()
    forward = [g for g in be.report(advice=False).graphs if g.kind == "forward"][0]
    op = next(o for o in forward.ops
              if o.op == "aten._native_batch_norm_legit_functional.default")
    assert op.placed == {first: 2}, (op.placed, op.refused)
    assert {p.backend for p in forward.partitions if p.backend != "eager"} == {first}
    # only the running statistics' in-place updates are left to eager
    assert all(set(p.ops) == {"aten.copy_.default"}
               for p in forward.partitions if p.backend == "eager")


FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
FLASH_BW = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _assert_flash_equals_the_kernel(q, k, v, causal, **kwargs):
    """arbiter's attention forward (output, logsumexp) and backward (from that logsumexp)
    against the CPU kernel's, with ``kwargs`` (scale, attn_mask); returns the kernel's
    logsumexp."""
    from arbiter.decompose.own import _flash_attention_for_cpu, _flash_attention_for_cpu_backward

    out, lse = FLASH(q, k, v, 0.0, causal, **kwargs)[:2]
    got_out, got_lse = _flash_attention_for_cpu(q, k, v, 0.0, causal, **kwargs)
    torch.testing.assert_close(got_out, out)
    torch.testing.assert_close(got_lse, lse)
    g = torch.randn_like(out)
    want = FLASH_BW(g, q, k, v, out, lse, 0.0, causal, **kwargs)
    got = _flash_attention_for_cpu_backward(g, q, k, v, out, lse, 0.0, causal, **kwargs)
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a)
    return lse


@pytest.mark.parametrize("causal,scale,lengths", [(False, None, (7, 7)), (True, None, (6, 6)),
                                                  (True, 0.3, (5, 9)), (False, 0.5, (8, 3))])
def test_flash_attention_decompositions_equal_aten(causal, scale, lengths):
    """arbiter's attention forward returns the kernel's real logsumexp (PyTorch's
    decomposition returns the attention matrix in its place), and its backward from that
    logsumexp equals the kernel's gradients."""
    torch.manual_seed(sum(lengths))
    q = torch.randn(2, 3, lengths[0], 8, dtype=torch.float64)
    k, v = (torch.randn(2, 3, lengths[1], 8, dtype=torch.float64) for _ in range(2))
    lse = _assert_flash_equals_the_kernel(q, k, v, causal, scale=scale)
    from torch._decomp import decomposition_table

    assert decomposition_table[FLASH](q, k, v, 0.0, causal, scale=scale)[1].shape != lse.shape


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_shape", [(6, 9), (2, 1, 6, 9), (1, 3, 6, 9), (2, 1, 1, 9)])
def test_flash_attention_decompositions_with_a_mask_equal_aten(causal, mask_shape):
    """An additive mask (what SDPA hands the CPU kernel; -inf where a key is masked),
    broadcast over batch and heads, rows it leaves no key (the kernel's output 0 and
    logsumexp 0) included: outputs, logsumexp and gradients equal the kernel's."""
    torch.manual_seed(len(mask_shape) + causal)
    q = torch.randn(2, 3, 6, 8, dtype=torch.float64)
    k, v = (torch.randn(2, 3, 9, 8, dtype=torch.float64) for _ in range(2))
    mask = torch.randn(*mask_shape, dtype=torch.float64)
    mask = mask.masked_fill(torch.rand(*mask_shape) < 0.3, float("-inf"))
    if mask_shape[-2] > 1:
        mask[..., 2, :] = float("-inf")  # a row with no key
    _assert_flash_equals_the_kernel(q, k, v, causal, attn_mask=mask)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(6, 2), (4, 1)])
def test_flash_attention_with_grouped_heads_equals_aten(causal, heads):
    """Grouped-query attention (SDPA's ``enable_gqa``: key and value with fewer heads,
    query head h reading key/value head h // groups; LLaMA's, Mistral's, Qwen's): the
    kernel takes it, and so does the decomposition (it declined it: the op stayed whole,
    and ONNX Runtime's and OpenVINO's exports failed on it, "Incompatible dimensions").
    Outputs, logsumexp and gradients, each key/value head's summed over its group."""
    torch.manual_seed(heads[0] + causal)
    q = torch.randn(2, heads[0], 7, 8, dtype=torch.float64)
    k, v = (torch.randn(2, heads[1], 9, 8, dtype=torch.float64) for _ in range(2))
    mask = torch.randn(2, 1, 7, 9, dtype=torch.float64)
    _assert_flash_equals_the_kernel(q, k, v, causal)
    _assert_flash_equals_the_kernel(q, k, v, causal, attn_mask=mask)


def test_flash_attention_declines_heads_that_do_not_group():
    """Key and value heads that differ, or do not divide the query's: NotImplemented (the
    op stays whole), never a guess."""
    from arbiter.decompose.own import _flash_attention_for_cpu

    q = torch.randn(1, 6, 4, 8)
    assert _flash_attention_for_cpu(q, torch.randn(1, 4, 4, 8), torch.randn(1, 4, 4, 8)) \
        is NotImplemented
    assert _flash_attention_for_cpu(q, torch.randn(1, 2, 4, 8), torch.randn(1, 3, 4, 8)) \
        is NotImplemented


@pytest.mark.parametrize("masked", [False, True])
def test_flash_attention_inference_decomposes_to_one_softmax(masked):
    """In an inference graph (the logsumexp unread) the attention decomposes to one
    ``_softmax`` (a fused Softmax in ONNX): the logsumexp's ops are dropped; a graph
    that returns the logsumexp (a training forward) keeps them. Both equal the kernel."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from arbiter.decompose.per_backend import for_names

    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    kw = {"attn_mask": torch.randn(5, 5).masked_fill(torch.rand(5, 5) < 0.3, float("-inf"))} \
        if masked else {}
    table = for_names(["aten._scaled_dot_product_flash_attention_for_cpu"])
    for returns_lse in (False, True):
        gm = make_fx(lambda q, k, v: FLASH(q, k, v, 0.0, False, **kw)[:1 + returns_lse])(q, k, v)
        new = table.apply(gm)
        ops = [str(n.target) for n in new.graph.nodes if n.op == "call_function"]
        assert ops.count("aten._softmax.default") == 1, ops
        assert ("aten.log.default" in ops) == returns_lse, ops
        for got, want in zip(new(q, k, v), FLASH(q, k, v, 0.0, False, **kw)):
            torch.testing.assert_close(got, want)


def test_probe_checks_the_logsumexp_a_backward_reads():
    """The probe's check of unreturned outputs (what a backward graph reads) on the
    attention op: its logsumexp, computed through ONNX Runtime's decomposition, equals
    eager's."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from arbiter.probe.opinfo import probe_sample, probe_unreturned

    backend = arbiter.get_backend_class("onnxruntime")()
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    gm = make_fx(lambda q, k, v: (FLASH(q, k, v, 0.0, True)[0],))(q, k, v)
    status, stage, reason, _ = probe_sample(backend, gm, [q, k, v])
    assert status == "passed", (stage, reason)
    added, wrong = probe_unreturned(backend, gm, [q, k, v])
    assert [k for _, k in added] == [1] and not wrong


class Attention(nn.Module):
    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal
        self.qkv, self.out = nn.Linear(32, 96), nn.Linear(32, 32)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(b, t, 32))


class MaskedAttention(Attention):
    """Attention with a padding mask (boolean: SDPA makes it additive for the kernel)."""

    def forward(self, x, keep):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=keep[:, None, None, :], is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(b, t, 32))


@pytest.mark.parametrize("causal", [False, True])
def test_masked_attention_training_stays_on_onnx_runtime(causal, fresh_dynamo):
    """SDPA with a mask in a training step: forward and backward each one ONNX Runtime
    partition, no run-time fallback (the op stayed whole before, and its logsumexp output
    could fail on ONNX Runtime's first run), gradients equal eager's."""
    torch.manual_seed(0)
    keep = torch.ones(2, 16, dtype=torch.bool)
    keep[0, 11:] = False  # padding
    be = arbiter.Arbiter({"backends": ["onnxruntime", "inductor"], "min_block_size": 1,
                          "against_eager": "off"})
    _train(MaskedAttention(causal), (torch.randn(2, 16, 32), keep), be)
    report = be.report(advice=False)
    assert {g.kind for g in report.graphs} == {"forward", "backward"}
    for g in report.graphs:
        assert [(p.backend, bool(p.fallbacks)) for p in g.partitions] == \
            [("onnxruntime", False)], (g.kind, [(p.backend, p.fallbacks) for p in g.partitions])


@pytest.mark.parametrize("causal", [False, True])
def test_attention_training_stays_on_onnx_runtime(causal, fresh_dynamo):
    """SDPA in a training step: forward and backward each one ONNX Runtime partition,
    no run-time fallback (was: "Got invalid dimensions for output: getitem_1", then
    Inductor), gradients equal eager's."""
    torch.manual_seed(0)
    be = arbiter.Arbiter({"backends": ["onnxruntime", "inductor"], "min_block_size": 1,
                          "against_eager": "off"})
    _train(Attention(causal), (torch.randn(2, 16, 32),), be)
    report = be.report(advice=False)
    for g in report.graphs:
        assert [(p.backend, bool(p.fallbacks)) for p in g.partitions] == \
            [("onnxruntime", False)], (g.kind, [(p.backend, p.fallbacks) for p in g.partitions])


def test_safe_softmax_decomposition_equals_aten():
    """``_safe_softmax``: rows of -inf give 0, partly masked rows the softmax, a NaN row
    NaN, over every dimension."""
    from arbiter.decompose.own import _safe_softmax

    torch.manual_seed(0)
    x = torch.randn(3, 4, 5)
    x[0, 1, :] = float("-inf")
    x[1, 2, :3] = float("-inf")
    x[2, 0, 1] = float("nan")
    for dim in (-1, 0, 1):
        torch.testing.assert_close(_safe_softmax(x, dim),
                                   torch.ops.aten._safe_softmax.default(x, dim),
                                   equal_nan=True, rtol=0, atol=0)
    assert _safe_softmax(x, -1, torch.float64) is NotImplemented


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_safe_softmax_runs_on_the_backend(backend, fresh_dynamo):
    """A graph with ``_safe_softmax`` (SDPA's math path, Falcon-style attention) is one
    partition on the backend, equal to eager with a fully masked row (OpenVINO kept it in
    eager: PyTorch's decomposition needs ``all.dim``, which it does not list)."""
    pytest.importorskip(backend, reason=f"{backend} is not installed")
    mask = torch.zeros(6, 6)
    mask[2] = float("-inf")
    mask[4, :3] = float("-inf")

    def f(x, w):
        s = torch.ops.aten._safe_softmax.default(x @ w + mask, -1)
        return torch.relu(s @ x) * 2.0

    torch.manual_seed(0)
    x, w = torch.randn(6, 6), torch.randn(6, 6)
    be = arbiter.Arbiter({"backends": [backend], "min_block_size": 1, "against_eager": "off",
                          "policy": "priority"})
    with torch.no_grad():
        out = torch.compile(f, backend=be)(x, w)
    torch.testing.assert_close(out, f(x, w), rtol=1e-5, atol=1e-6)
    (g,) = be.report(advice=False).graphs
    assert [(p.backend, bool(p.fallbacks)) for p in g.partitions] == [(backend, False)], \
        [(p.backend, p.ops) for p in g.partitions]


class GroupedAttention(nn.Module):
    """Grouped-query attention as LLaMA-style models call it (4 query heads, 2 key/value
    heads, causal, SDPA's ``enable_gqa``)."""

    def __init__(self):
        super().__init__()
        self.q, self.kv, self.out = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, 4, 8).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, 2, 8).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                             enable_gqa=True)
        return self.out(y.transpose(1, 2).reshape(b, t, 32))


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_grouped_query_attention_runs_on_the_backend(backend, fresh_dynamo):
    """Inference: one partition on the backend, no fallback, outputs equal eager's (both
    failed to compile it and fell back to eager: ONNX Runtime's export "Incompatible
    dimensions", OpenVINO's attention "key_input_correctness")."""
    pytest.importorskip(backend, reason=f"{backend} is not installed")
    torch.manual_seed(0)
    model, x = GroupedAttention().eval(), torch.randn(2, 16, 32)
    be = arbiter.Arbiter({"backends": [backend], "min_block_size": 1, "against_eager": "off",
                          "policy": "priority"})
    with torch.no_grad():
        out = torch.compile(model, backend=be)(x)
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    (g,) = be.report(advice=False).graphs
    assert [(p.backend, bool(p.fallbacks)) for p in g.partitions] == [(backend, False)], \
        [(p.backend, p.fallbacks) for p in g.partitions]


def test_grouped_query_attention_training_stays_on_onnx_runtime(fresh_dynamo):
    """A training step: forward and backward each one ONNX Runtime partition, gradients
    (each key/value head's summed over its group) equal eager's."""
    torch.manual_seed(0)
    be = arbiter.Arbiter({"backends": ["onnxruntime", "inductor"], "min_block_size": 1,
                          "against_eager": "off"})
    _train(GroupedAttention(), (torch.randn(2, 16, 32),), be)
    report = be.report(advice=False)
    assert {g.kind for g in report.graphs} == {"forward", "backward"}
    for g in report.graphs:
        assert [(p.backend, bool(p.fallbacks)) for p in g.partitions] == \
            [("onnxruntime", False)], (g.kind, [(p.backend, p.fallbacks) for p in g.partitions])


def test_a_declined_decomposition_leaves_the_op_whole(make_backend, tmp_path, fresh_dynamo,
                                                     monkeypatch):
    """SDPA whose heads the decomposition declines (made so here: the real declines are
    dropout, which never reaches a backend, and heads that do not group): it keeps the op
    itself, so a backend that asked for the decomposition is asked about the op as it is
    and takes it whole by its manifest entry, as before it asked (declined nodes were
    refused once, and T5's and GPT-2's inference graphs, whose masked attention was
    declined then, fell into 13 and 25 partitions with attention in eager)."""
    from conftest import write_manifest

    import arbiter.decompose.own as own

    monkeypatch.setattr(own, "head_groups", lambda *a: None)

    flash = "aten._scaled_dot_product_flash_attention_for_cpu.default"
    make_backend("asks", [flash, "aten.mul.Tensor"])
    write_manifest(tmp_path, "asks", [flash, "aten.mul.Tensor"],
                   extra=f"decompositions: [{flash}]\n")
    torch.manual_seed(0)

    def f(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True) * 2.0

    q, k, v = torch.randn(1, 4, 16, 8), torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8)
    be = arbiter.Arbiter({"backends": ["asks"], "min_block_size": 1})
    assert list(be.backends["asks"].manifest().decompositions) == [flash]
    with torch.no_grad():
        out = torch.compile(f, backend=be)(q, k, v)
    torch.testing.assert_close(out, f(q, k, v), rtol=1e-4, atol=1e-5)
    (g,) = be.report(advice=False).graphs
    assert [p.backend for p in g.partitions] == ["asks"], \
        [(p.backend, p.ops) for p in g.partitions]
    assert flash in g.partitions[0].ops
