"""The OpenVINO backend: eager's results alone and split with others, float32 in force,
zero-copy inputs and outputs, per-thread requests, its cache dir, and fallbacks for
partitions OpenVINO cannot convert."""
from __future__ import annotations

import copy
import threading
import types

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

pytest.importorskip("openvino", reason="openvino is not installed: pip install "
                    "'torch-arbiter[openvino]'")

import arbiter  # noqa: E402
from arbiter.cli import examples  # noqa: E402
from arbiter.backends.openvino import OpenVino, OvOptions  # noqa: E402

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _run(model_name: str, config: dict):
    torch._dynamo.reset()
    model, args = getattr(examples, model_name)()
    model.eval()
    be = arbiter.Arbiter(config)
    with torch.no_grad():
        ref = model(*args)
        out = torch.compile(model, backend=be)(*args)
    torch._dynamo.reset()
    return out, ref, be.report()


def _parts(rep):
    return [p for g in rep.graphs for p in g.partitions]


@pytest.mark.parametrize("name", ["mlp", "encoder_block", "small_cnn"])
def test_alone_matches_eager(name):
    out, ref, rep = _run(name, {"backends": ["openvino"], "min_block_size": 1})
    torch.testing.assert_close(out, ref, **TOL)
    parts = _parts(rep)
    assert any(p.backend == "openvino" for p in parts), str(rep)
    assert not [f for p in parts for f in p.fallbacks], str(rep)


@pytest.mark.parametrize("name", ["encoder_block", "small_cnn"])
def test_split_with_other_backends_matches_eager(name):
    # softmax / max-pool only in eager, linear layers pinned to ONNX Runtime: three
    # backends in one graph.
    cfg = {"backends": ["openvino", "onnxruntime"], "min_block_size": 1,
           "exclude_ops": ["aten._softmax", "aten.max_pool2d_with_indices"],
           "pin": {"aten.addmm": "onnxruntime"}}
    out, ref, rep = _run(name, cfg)
    torch.testing.assert_close(out, ref, **TOL)
    used = {p.backend for p in _parts(rep)}
    assert {"openvino", "onnxruntime", "eager"} <= used, str(rep)
    assert not [f for p in _parts(rep) for f in p.fallbacks], str(rep)


def _tiny():
    def f(x, w):
        return (torch.relu(x @ w) + 1,)

    x, w = torch.randn(4, 8), torch.randn(8, 3)
    return f, make_fx(f, tracing_mode="fake")(x, w), x, w


def test_float32_is_in_force_by_default_and_inputs_outputs_share_memory():
    f, gm, x, w = _tiny()
    runner = OpenVino().compile(gm, [x, w])
    record = types.SimpleNamespace(copies=0)  # what run.piece.Piece attaches
    runner.attach_record(record)
    assert str(runner.compiled.get_property("INFERENCE_PRECISION_HINT")) == "<Type: 'float32'>"
    (out,) = runner(x, w)
    torch.testing.assert_close(out, f(x, w)[0], **TOL)
    req = runner.handle()
    assert req.get_input_tensor(0).data.ctypes.data == x.data_ptr()
    assert req.get_output_tensor(0).data.ctypes.data == out.data_ptr()
    assert record.copies == 0


def test_non_contiguous_input_is_copied_once_and_correct():
    f, gm, x, w = _tiny()
    runner = OpenVino().compile(gm, [x, w])
    record = types.SimpleNamespace(copies=0)  # what run.piece.Piece attaches
    runner.attach_record(record)
    xt = torch.randn(8, 4).t()
    torch.testing.assert_close(runner(xt, w)[0], f(xt, w)[0], **TOL)
    assert record.copies == 1


def test_precision_option_reaches_the_plugin():
    import openvino as ov

    _, gm, x, w = _tiny()
    supported = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    if "BF16" not in supported:
        pytest.skip(f"this CPU has no bf16 support in OpenVINO ({supported})")
    runner = OpenVino(OvOptions(precision="bf16")).compile(gm, [x, w])
    assert str(runner.compiled.get_property("INFERENCE_PRECISION_HINT")) == "<Type: 'bfloat16'>"


def test_cache_dir_gets_files(tmp_path):
    _, gm, x, w = _tiny()
    OpenVino(OvOptions(cache_dir=str(tmp_path))).compile(gm, [x, w])
    assert any(p.stat().st_size > 0 for p in tmp_path.iterdir())


def test_one_request_per_thread():
    f, gm, x, w = _tiny()
    runner = OpenVino().compile(gm, [x, w])
    inputs = [torch.randn(4, 8) for _ in range(8)]
    results: dict[int, torch.Tensor] = {}

    def work(i):
        for _ in range(20):
            results[i] = runner(inputs[i], w)[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, x_i in enumerate(inputs):
        torch.testing.assert_close(results[i], f(x_i, w)[0], **TOL)


class _CatEmpty(torch.nn.Module):
    # transformers' DynamicCache starts from a 1-D empty tensor and cats onto it; a float64
    # one makes the result float64, so arbiter/run/legacy_cat.py leaves this cat as it is
    def forward(self, x):
        y = torch.relu(x) * 2
        return torch.cat([torch.tensor([], dtype=torch.float64), y], dim=-2) + 1


def test_validator_refuses_cat_with_legacy_empty_tensor():
    x = torch.randn(1, 4, 8, 8)
    out, rep = _compile_cat(x, {"backends": ["openvino"], "min_block_size": 1})
    torch.testing.assert_close(out, _CatEmpty()(x))
    assert "OpenVINO's Concat rejects it" in str(rep)
    assert not [f for p in _parts(rep) for f in p.fallbacks], str(rep)


def test_partition_openvino_cannot_convert_falls_back(monkeypatch):
    # Without its validator the cat reaches OpenVINO, whose frontend fails: the partition
    # must fall back to eager, give eager's result, and the report must say why.
    monkeypatch.setattr(OpenVino, "validators", {})
    x = torch.randn(1, 4, 8, 8)
    out, rep = _compile_cat(x, {"backends": ["openvino"], "min_block_size": 1})
    torch.testing.assert_close(out, _CatEmpty()(x))
    falls = [f for p in _parts(rep) for f in p.fallbacks]
    assert falls and falls[0].from_backend == "openvino" and falls[0].stage == "compile"
    assert "could not convert" in falls[0].reason and "aten.cat" in falls[0].reason


def _compile_cat(x, cfg):
    torch._dynamo.reset()
    be = arbiter.Arbiter(cfg)
    with torch.no_grad():
        out = torch.compile(_CatEmpty(), backend=be)(x)
    torch._dynamo.reset()
    return out, be.report()


def test_output_that_is_an_input_is_returned_right():
    # The CPU plugin leaves a bound output buffer unwritten when the output is a model
    # input as it is (found by `arbiter probe`: clone returned uninitialized memory).
    x = torch.randn(4, 5)
    gm = make_fx(lambda t: (torch.clone(t), t * 2))(x)
    runner = OpenVino(OvOptions()).compile(gm, [x])
    a, b = runner(x)
    torch.testing.assert_close(a, x, rtol=0, atol=0)
    torch.testing.assert_close(b, x * 2)
    assert a.data_ptr() != x.data_ptr()  # a copy: callers may mutate it


def test_a_value_returned_twice_converts_and_each_output_is_right():
    """OpenVINO's frontend cannot convert a graph returning one value twice; training
    forwards return x and detach(x) (returned and saved for the backward), and fell
    back to eager whole. Each value is returned once and given back in every place."""
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    gm = make_fx(lambda t, w: (lambda y, z: (y, torch.ops.aten.detach.default(y), z, z))(
        torch.tanh(t @ w), t * 2))(x, w)
    runner = OpenVino(OvOptions()).compile(gm, [x, w])
    a, b, c, d = runner(x, w)
    torch.testing.assert_close(a, torch.tanh(x @ w), **TOL)
    assert b.data_ptr() == a.data_ptr() and c is d  # as in eager: one value
    torch.testing.assert_close(c, x * 2, **TOL)


def test_a_training_forward_runs_on_openvino_with_eager_gradients():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Sigmoid(),
                            torch.nn.Linear(8, 8), torch.nn.Tanh())
    ref = copy.deepcopy(m)
    x = torch.randn(4, 8)
    be = arbiter.Arbiter({"backends": [{"name": "openvino", "options": {"precision": "f32"}}],
                          "fallback": ["eager"], "against_eager": "off", "min_block_size": 1})
    torch.compile(m, backend=be)(x).pow(2).sum().backward()
    torch._dynamo.reset()
    ref(x).pow(2).sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL)
    (fwd,) = [g for g in be.report().graphs if g.kind == "forward"]
    assert [(p.backend, p.fallbacks) for p in fwd.partitions] == [("openvino", [])]


def test_full_variance_is_refused_and_runs_right():
    class M(torch.nn.Module):
        def forward(self, x):
            y = torch.sin(x) * 2 + 1
            return torch.var(y), torch.std(y, 0), torch.var(y, correction=0)

    x = torch.randn(5, 5, 5)
    be = arbiter.Arbiter({"backends": ["openvino"], "min_block_size": 1})
    m = M()
    with torch.no_grad():
        out = torch.compile(m, backend=be)(x)
    torch._dynamo.reset()
    for o, r in zip(out, m(x)):
        torch.testing.assert_close(o, r, **TOL)
    ran = {(op, p.backend) for p in _parts(be.report()) for op in p.ops}
    assert ("aten.var.correction", "eager") in ran  # the full variance with a correction
    assert ("aten.var.correction", "openvino") in ran  # correction 0
    assert ("aten.std.correction", "openvino") in ran  # over one dimension


def _linear_gelu_graph():
    w = torch.randn(16, 8)

    def f(x):
        return (torch.nn.functional.gelu(x @ w.t()).view(2, 3, 16),)

    x = torch.randn(6, 8)
    gm = make_fx(f)(x)
    assert torch.ops.aten.t.default in {n.target for n in gm.graph.nodes}
    return gm, x, f(x)[0]


def _run_converted(model, x):
    import openvino as ov

    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return torch.from_numpy(compiled([x.numpy()])[0])


def test_a_partition_converts_without_torch_export(monkeypatch):
    # The usual way: OpenVINO's FX decoder on the graph itself (no retrace, no
    # decompositions run again): the export way must not be reached.
    from arbiter.backends import _openvino_convert as oc

    def no_export(*a, **k):
        raise AssertionError("the export way was taken")

    monkeypatch.setattr(oc, "export_program", no_export)
    gm, x, ref = _linear_gelu_graph()
    model = oc.convert(gm, (x,), {torch.float32: "f32"})
    torch.testing.assert_close(_run_converted(model, x), ref, **TOL)


def test_a_partition_the_decoder_refuses_converts_by_torch_export(monkeypatch):
    from arbiter.backends import _openvino_convert as oc

    taken = []
    real = oc.export_program

    def refuse(gm, dynamic):
        raise RuntimeError("Conversion is failed for: aten.t.default")

    def export(*a, **k):
        taken.append(True)
        return real(*a, **k)

    monkeypatch.setattr(oc, "_convert_direct", refuse)
    monkeypatch.setattr(oc, "export_program", export)
    gm, x, ref = _linear_gelu_graph()
    model = oc.convert(gm, (x,), {torch.float32: "f32"})
    assert taken
    torch.testing.assert_close(_run_converted(model, x), ref, **TOL)


class _RopeAttention(torch.nn.Module):
    """Llama's attention in small: rotary embedding on query and key, then SDPA with an
    additive causal mask (OpenVINO 2026.4's CPU plugin fuses the two)."""

    def __init__(self, heads: int, length: int, dims: int):
        super().__init__()
        width = heads * dims
        self.shape = (heads, dims)
        self.q, self.k, self.v = (torch.nn.Linear(width, width, bias=False) for _ in range(3))
        self.register_buffer("mask", torch.triu(torch.full((1, 1, length, length), -1e9), 1))
        angle = torch.arange(length)[:, None] / 10000 ** (torch.arange(0, dims, 2) / dims)
        emb = torch.cat([angle, angle], -1)[None, None]
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def forward(self, x):
        b, s, _ = x.shape

        def heads(t):
            return t.view(b, s, *self.shape).transpose(1, 2)

        def rotary(t):
            half = t.shape[-1] // 2
            return t * self.cos + torch.cat((-t[..., half:], t[..., :half]), -1) * self.sin

        q, k, v = rotary(heads(self.q(x))), rotary(heads(self.k(x))), heads(self.v(x))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)
        return out.transpose(1, 2).reshape(b, s, -1)


@pytest.mark.parametrize("heads,length", [(4, 4), (4, 5)])
def test_rotary_attention_with_as_many_heads_as_tokens_matches_eager(heads, length,
                                                                    monkeypatch):
    # The CPU plugin's Snippets computed this wrongly when heads == length (errors of
    # 0.3 on activations of RMS 1, with or without arbiter): such a model is compiled
    # with Snippets off (backends/_openvino_plugin.py), any other keeps them.
    from arbiter.backends import openvino as ov_backend

    given = []

    def spy(model, properties):
        out = properties_for(model, properties)
        given.append(out.get("SNIPPETS_MODE"))
        return out

    properties_for = ov_backend.properties_for
    monkeypatch.setattr(ov_backend, "properties_for", spy)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _RopeAttention(heads, length, 16).eval()
    x = torch.randn(1, length, heads * 16)
    be = arbiter.Arbiter({"backends": ["openvino"], "min_block_size": 1,
                          "against_eager": "off", "verify": {"mode": "off"}})
    with torch.no_grad():
        out = torch.compile(model, backend=be)(x)
        ref = model(x)
    torch._dynamo.reset()
    torch.testing.assert_close(out, ref, **TOL)
    assert {p.backend for p in _parts(be.report())} == {"openvino"}, str(be.report())
    assert given == ["DISABLE" if heads == length else None]


def test_a_query_that_sees_no_key_gets_eagers_zeros():
    # transformers' static cache at batch 2 with left padding: the padded sequence's
    # first queries see no key (a float mask of -inf across the row). Eager's CPU kernel
    # returns 0 there; OpenVINO's attention returned NaN, which went into the cache and
    # that sequence's logits (arbiter/decompose/masked_rows.py, run before its conversion).
    class Attend(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    torch._dynamo.reset()
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 16) for _ in range(3))
    visible = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    visible[1, :, :, :3] = False  # the second sequence's 3 padding positions
    mask = torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))
    be = arbiter.Arbiter({"backends": ["openvino"], "min_block_size": 1,
                          "against_eager": "off", "verify": {"mode": "off"}})
    with torch.no_grad():
        ref = Attend()(q, k, v, mask)
        out = torch.compile(Attend(), backend=be)(q, k, v, mask)
    torch._dynamo.reset()
    assert torch.equal(ref[1, :, :3], torch.zeros_like(ref[1, :, :3]))  # eager's zeros
    torch.testing.assert_close(out, ref, **TOL)
    assert {p.backend for p in _parts(be.report())} == {"openvino"}, str(be.report())
