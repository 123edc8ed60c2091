"""PyTorch's transformer inference fast path, decomposed for the backends
(arbiter/decompose/fused.py).

In eval mode under ``torch.no_grad()``, ``nn.TransformerEncoderLayer`` with
``batch_first=True`` computes each layer with one fused kernel,
``aten._transformer_encoder_layer_fwd``, which no manifest lists: the whole model ran
in eager. Here:

* which fused ops Dynamo and AOTAutograd actually produce for the ``torch.nn``
  transformer modules (``test_fused_ops_traced``): only the encoder layer's, and only
  with ``batch_first=True``; ``nn.MultiheadAttention`` and ``nn.TransformerDecoder`` trace
  their ordinary path under torch.compile;
* each decomposition equals the fused CPU kernel on random inputs across its arguments
  (masks of every type, boolean and floating, a row with every key masked; weights or
  not; gelu or relu; norm first or not), and traces for symbolic sizes;
* the modules compiled with ``backend="arbiter"`` under the shipped ``default`` and
  ``cpu_all`` configs (``against_eager: off``, so nothing is timed against eager and the
  backends take what they can): outputs equal to eager's, at three batch sizes and
  sequence lengths (a static graph, then a symbolic one), and no compute node in eager
  (only size arithmetic on SymInts, ``_operator.mul``, runs there), no fused op left.

With a key-padding mask, uncompiled eager ``nn.TransformerEncoder`` runs its layers on a
nested tensor and returns zeros at the padded positions; under torch.compile, with any
backend, that path is skipped (transformer.py: "mask_check enabled with torch.compile")
and the fused kernel computes the padded positions too. So the compiled output is
compared with eager's where nothing is padded, and with Dynamo's own ``eager`` backend
(the fused kernel on the same graph) everywhere.

The compiled matrix is ``slow``; a few cases run by default.
"""
from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import arbiter
from arbiter.decompose.fused import (native_multi_head_attention, table,
                                     transformer_encoder_layer_fwd)

aten = torch.ops.aten
MHA = aten._native_multi_head_attention.default
LAYER = aten._transformer_encoder_layer_fwd.default
FUSED = ("_transformer_encoder_layer_fwd", "_native_multi_head_attention")
TOL = {"rtol": 1e-5, "atol": 1e-5, "equal_nan": True}
D, H = 32, 4
#: (batch, length) per call: a static graph, then one symbolic graph for the other two
SIZES = [(2, 5), (3, 7), (4, 9)]


def _padding(batch: int, length: int) -> torch.Tensor:
    """True where padded: the first row loses 2 positions, the second 1."""
    m = torch.zeros(batch, length, dtype=torch.bool)
    m[0, -2:] = True
    m[1:2, -1:] = True
    return m


def _causal(length: int) -> torch.Tensor:
    return torch.triu(torch.ones(length, length, dtype=torch.bool), 1)


# -- the decompositions against the kernels ---------------------------------------------
def _mha_weights(g: torch.Generator, d: int = D):
    return (torch.randn(3 * d, d, generator=g) * d ** -0.5, torch.randn(3 * d, generator=g),
            torch.randn(d, d, generator=g) * d ** -0.5, torch.randn(d, generator=g))


def _masks(batch: int, length: int, g: torch.Generator) -> dict:
    """name -> (mask, mask_type) as the kernels take them."""
    padded = _padding(batch, length)
    padded[-1] = True  # a row whose keys are all masked: NaN, as the kernel's
    return {
        "none": (None, None),
        "padding": (padded, 1),
        "padding float -inf": (torch.zeros(batch, length).masked_fill(padded, float("-inf")), 1),
        "padding float -1": (torch.zeros(batch, length).masked_fill(padded, -1.0), 1),
        "attention": (_causal(length), 0),
        "attention float": (torch.zeros(length, length).masked_fill(_causal(length),
                                                                     float("-inf")), 0),
        "merged": (torch.rand(batch, H, length, length, generator=g) > 0.7, 2),
        "merged, no type": (torch.rand(batch, H, length, length, generator=g) > 0.7, None),
    }


def _close(got, want) -> None:
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want, **TOL)
    else:  # need_weights=False: the kernel returns no weights, the decomposition the
        # empty tensor of the op's fake kernel (the graph's metadata)
        assert want is None and got.shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_multi_head_attention_equals_kernel(dtype):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for batch, length in [(3, 6), (1, 4)]:
            x = torch.randn(batch, length, D, generator=g, dtype=torch.float64).to(dtype)
            weights = [w.to(dtype) for w in _mha_weights(g)]
            masks = _masks(batch, length, g)
            if batch == 1:  # "padding" masks every key of the only row: all NaN
                masks = {k: v for k, v in masks.items() if not k.startswith("padding")}
            for (name, (mask, kind)), need, average in itertools.product(
                    masks.items(), (True, False), (True, False)):
                if mask is not None and mask.is_floating_point():
                    mask = mask.to(dtype)
                args = (x, x, x, D, H, *weights, mask, need, average, kind)
                want = MHA(*args)
                got = native_multi_head_attention(*args)
                _close(got[0], want[0])
                _close(got[1], want[1])
            # attention between other tensors (the op's key and value arguments)
            key, value = torch.randn_like(x), torch.randn_like(x)
            args = (x, key, value, D, H, *weights, None, True, False, None)
            for got, want in zip(native_multi_head_attention(*args), MHA(*args)):
                _close(got, want)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("use_gelu", [False, True])
def test_encoder_layer_equals_kernel(norm_first, use_gelu):
    g = torch.Generator().manual_seed(1)
    batch, length, ffn = 3, 6, 64
    x = torch.randn(batch, length, D, generator=g)
    ffn_w = (torch.randn(ffn, D, generator=g) * D ** -0.5, torch.randn(ffn, generator=g),
             torch.randn(D, ffn, generator=g) * ffn ** -0.5, torch.randn(D, generator=g))
    norms = [torch.randn(D, generator=g) for _ in range(4)]
    with torch.no_grad():
        for name, (mask, kind) in _masks(batch, length, g).items():
            args = (x, D, H, *_mha_weights(g), use_gelu, norm_first, 1e-5, *norms, *ffn_w,
                    mask, kind)
            torch.testing.assert_close(transformer_encoder_layer_fwd(*args), LAYER(*args),
                                       **TOL, msg=lambda m, name=name: f"{name}: {m}")


def test_refused_arguments_keep_the_op():
    """A mask whose rank its ``mask_type`` does not allow (the kernel raises): the
    decomposition declines, so the op stays whole and eager raises as before."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, D, generator=g)
    weights = _mha_weights(g)
    for mask, kind in [(_padding(2, 5), 0), (_causal(5), 1), (_causal(5), 2), (_causal(5), None),
                       (_padding(2, 4), 1), (_causal(5), 3)]:
        assert native_multi_head_attention(x, x, x, D, H, *weights, mask, True, True,
                                           kind) is NotImplemented


def test_traces_for_symbolic_sizes():
    """Traced with symbolic batch and length (make_fx, the table as AOTAutograd applies
    it): no fused op left, and the one graph serves other sizes."""
    from torch.fx.experimental.proxy_tensor import make_fx

    layer = nn.TransformerEncoderLayer(D, H, 64, batch_first=True, activation="gelu").eval()
    weights = [p.detach() for p in (
        layer.self_attn.in_proj_weight, layer.self_attn.in_proj_bias,
        layer.self_attn.out_proj.weight, layer.self_attn.out_proj.bias,
        layer.norm1.weight, layer.norm1.bias, layer.norm2.weight, layer.norm2.bias,
        layer.linear1.weight, layer.linear1.bias, layer.linear2.weight, layer.linear2.bias)]

    def fn(x, padded, *w):
        mask = torch.zeros_like(padded, dtype=x.dtype).masked_fill(padded, float("-inf"))
        return LAYER(x, D, H, *w[:4], True, False, 1e-5, *w[4:], mask, 1)

    with torch.no_grad():
        gm = make_fx(fn, tracing_mode="symbolic", decomposition_table=table())(
            torch.randn(2, 5, D), _padding(2, 5), *weights)
        targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
        assert not any(f in t for f in FUSED for t in targets), sorted(targets)
        symbolic = [n for n in gm.graph.nodes if n.op == "placeholder"][0].meta["val"].shape
        assert not any(isinstance(s, int) for s in symbolic[:2]), symbolic
        for batch, length in [(3, 7), (4, 12)]:
            x, padded = torch.randn(batch, length, D), _padding(batch, length)
            torch.testing.assert_close(gm(x, padded, *weights), fn(x, padded, *weights), **TOL)


# -- what Dynamo and AOTAutograd produce ----------------------------------------------------
def _traced_ops(model: nn.Module, calls: list) -> list[set[str]]:
    """The ATen ops of each inference graph AOTAutograd makes of ``model`` (no
    decomposition), over ``calls`` [(args, kwargs)]."""
    from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

    graphs: list[set[str]] = []

    def backend(gm, example_inputs):
        def keep(fx_g, _):
            graphs.append({str(n.target) for n in fx_g.graph.nodes if n.op == "call_function"})
            return make_boxed_func(fx_g.forward)
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep,
                                     inference_compiler=keep)

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for args, kwargs in calls:
            compiled(*args, **kwargs)
    torch._dynamo.reset()
    return graphs


class Decoder(nn.Module):
    """``nn.TransformerDecoder`` with its masks. ``tgt_is_causal`` is given: left None,
    ``_detect_is_causal_mask`` compares the mask with a causal one (``bool(tensor)``), a
    graph break after which Dynamo compiles nothing of torch.nn's frame (the model runs in
    eager and no backend is called)."""

    def __init__(self, batch_first: bool = True):
        super().__init__()
        self.decoder = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(D, H, 64, batch_first=batch_first), 2)

    def forward(self, tgt, memory, tgt_mask, tgt_padding, memory_padding):
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, tgt_key_padding_mask=tgt_padding,
                            memory_key_padding_mask=memory_padding, tgt_is_causal=False)


def _encoder(norm_first=False, activation="relu", batch_first=True) -> nn.Module:
    return nn.TransformerEncoder(nn.TransformerEncoderLayer(
        D, H, 64, activation=activation, norm_first=norm_first, batch_first=batch_first),
        2, enable_nested_tensor=False).eval()


def _encoder_calls(padding: bool, batch_first: bool = True) -> list:
    calls = []
    for batch, length in SIZES:
        x = torch.randn(batch, length, D)
        if not batch_first:
            x = x.transpose(0, 1).contiguous()
        calls.append(((x,), {"src_key_padding_mask": _padding(batch, length)} if padding
                      else {}))
    return calls


def _mha_calls(masks: bool, need_weights: bool = True) -> list:
    calls = []
    for batch, length in SIZES:
        x = torch.randn(batch, length, D)
        kwargs = {"need_weights": need_weights}
        if masks:
            kwargs.update(key_padding_mask=_padding(batch, length), attn_mask=_causal(length))
        calls.append(((x, x, x), kwargs))
    return calls


def _decoder_calls() -> list:
    return [((torch.randn(b, n, D), torch.randn(b, n + 2, D), _causal(n), _padding(b, n),
              _padding(b, n + 2)), {}) for b, n in SIZES]


@pytest.mark.parametrize("case,fused", [
    ("encoder", "aten._transformer_encoder_layer_fwd.default"),
    ("encoder, padding mask, norm first, gelu", "aten._transformer_encoder_layer_fwd.default"),
    ("encoder, batch second", None),
    ("multi-head attention, masks", None),
    ("decoder, masks", None),
])
def test_fused_ops_traced(case, fused):
    """Which fused op each module's compiled graphs hold (torch 2.13): the encoder
    layer's fast path with ``batch_first=True`` only; ``nn.MultiheadAttention`` takes its
    ordinary path under Dynamo (bmm and softmax, SDPA without weights), and so does the
    decoder (it has no fast path of its own)."""
    torch.manual_seed(0)
    model, calls = {
        "encoder": lambda: (_encoder(), _encoder_calls(False)),
        "encoder, padding mask, norm first, gelu": lambda: (
            _encoder(True, "gelu"), _encoder_calls(True)),
        "encoder, batch second": lambda: (_encoder(batch_first=False),
                                          _encoder_calls(False, batch_first=False)),
        "multi-head attention, masks": lambda: (
            nn.MultiheadAttention(D, H, batch_first=True).eval(), _mha_calls(True)),
        "decoder, masks": lambda: (Decoder().eval(), _decoder_calls()),
    }[case]()
    graphs = _traced_ops(model, calls)
    assert len(graphs) == 2  # static, then symbolic
    for ops in graphs:
        held = {o for o in ops if any(f in o for f in FUSED)}
        assert held == ({fused} if fused else set()), sorted(ops)


# -- compiled with arbiter -------------------------------------------------------------------
def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _check_report(compiled, per_shape: bool = False) -> None:
    rep = arbiter.report_for(compiled)
    assert len(rep.graphs) == 2, rep.summary()
    assert [bool(g.symbols) for g in rep.graphs] == [False, True], rep.summary()
    for g in rep.graphs:
        assert not any(f in o.op for o in g.ops for f in FUSED), str(rep)
        assert g.shape_eager_share == 0.0, str(rep)
        for p in g.partitions:
            if p.backend == "eager":  # size arithmetic only (operator.mul on SymInts)
                assert not any(op.startswith(("aten.", "prims.")) for op in p.ops), str(rep)
            else:
                assert p.compiled and p.nonfinite_eager_calls == 0, str(rep)
                assert not any(f.to_backend == "eager" for f in p.fallbacks), str(rep)
                if g.symbols:
                    allowed = ("symbolic", "static") + (("per shape",) if per_shape else ())
                    assert p.shapes in allowed, str(rep)


def _compile_and_check(model: nn.Module, calls: list, config: str, padded=None,
                       per_shape: bool = False) -> None:
    """``model`` compiled with arbiter equals eager at every call; ``padded(args,
    kwargs)``: positions eager's nested-tensor path zeroes, compared with Dynamo's
    ``eager`` backend instead. ``per_shape``: a symbolic partition may be compiled per
    shape (not in eager either)."""
    if config == "cpu_all":
        pytest.importorskip("openvino")
    compiled = torch.compile(model, backend="arbiter",
                             options={"config": config, "against_eager": "off"})
    dynamo_eager = torch.compile(model, backend="eager")
    with torch.no_grad():
        for args, kwargs in calls:
            got = compiled(*args, **kwargs)
            want = model(*args, **kwargs)
            if isinstance(got, tuple):  # multi-head attention's weights
                torch.testing.assert_close(got[1], want[1], **TOL)
            got, want = _first(got), _first(want)
            if padded is None:
                torch.testing.assert_close(got, want, **TOL)
                continue
            keep = ~padded(args, kwargs)
            torch.testing.assert_close(got[keep], want[keep], **TOL)
            torch.testing.assert_close(got, dynamo_eager(*args, **kwargs), **TOL)
    _check_report(compiled, per_shape)


def _encoder_cases():
    fast = {("default", False, "relu", True), ("cpu_all", True, "gelu", True)}
    for config, norm_first, activation, padding in itertools.product(
            ("default", "cpu_all"), (False, True), ("relu", "gelu"), (False, True)):
        key = (config, norm_first, activation, padding)
        yield pytest.param(*key, marks=() if key in fast else (pytest.mark.slow,),
                           id=f"{config}-norm_first={norm_first}-{activation}"
                              f"{'-padding' if padding else ''}")


@pytest.mark.parametrize("config,norm_first,activation,padding", list(_encoder_cases()))
def test_encoder_compiled(config, norm_first, activation, padding, fresh_dynamo):
    torch.manual_seed(0)
    model = _encoder(norm_first, activation)
    padded = (lambda args, kwargs: kwargs["src_key_padding_mask"]) if padding else None
    _compile_and_check(model, _encoder_calls(padding), config, padded)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["default", "cpu_all"])
def test_encoder_layer_with_both_masks_compiled(config, fresh_dynamo):
    """An attention mask and a padding mask: the layer merges them (mask_type 2)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D, H, 64, batch_first=True).eval()
    calls = [((torch.randn(b, n, D),), {"src_mask": _causal(n),
                                         "src_key_padding_mask": _padding(b, n)})
             for b, n in SIZES]
    _compile_and_check(layer, calls, config)


@pytest.mark.parametrize("config,masks,need_weights", [
    ("default", True, True),
    pytest.param("default", False, True, marks=pytest.mark.slow),
    pytest.param("default", True, False, marks=pytest.mark.slow),
    pytest.param("cpu_all", False, True, marks=pytest.mark.slow),
    pytest.param("cpu_all", True, True, marks=pytest.mark.slow),
    pytest.param("cpu_all", True, False, marks=pytest.mark.slow),
])
def test_multi_head_attention_compiled(config, masks, need_weights, fresh_dynamo):
    torch.manual_seed(0)
    model = nn.MultiheadAttention(D, H, batch_first=True).eval()
    _compile_and_check(model, _mha_calls(masks, need_weights), config)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["default", "cpu_all"])
def test_decoder_compiled(config, fresh_dynamo):
    """No fused op (test_fused_ops_traced), nothing in eager. Its symbolic partition is
    compiled per shape: the memory's batch is a symbol of its own, equal to the target's
    at run time, and arbiter's check at a second shape (run/dynamic.py) finds no sizes
    that satisfy the graph's guards ("no second shape of this partition's symbols")."""
    torch.manual_seed(0)
    _compile_and_check(Decoder().eval(), _decoder_calls(), config, per_shape=True)


def test_every_graph_gets_them():
    """The lowering table (every graph) holds them, with the config's list; so a pin
    or exclude naming a fused op is told it is decomposed before partitioning."""
    from arbiter.ops import op_name
    from arbiter.run.lower import decomposition_table

    for names in ([], ["aten.silu"]):
        ops = {op_name(op) for op in decomposition_table(names)}
        assert {"aten._transformer_encoder_layer_fwd.default",
                "aten._native_multi_head_attention.default"} <= ops
    assert "aten.silu.default" in ops


def test_gelu_follows_the_device():
    """``_addmm_activation``'s gelu: exact on CPU (checked against the kernel above),
    tanh-approximated by CUDA's GEMM epilogue; traced on fake tensors that claim CUDA."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def layer(x, *ts):
        return transformer_encoder_layer_fwd(x, D, H, *ts[:4], True, False, 1e-5, *ts[4:])

    shapes = [(2, 5, D), (3 * D, D), (3 * D,), (D, D), (D,), (D,), (D,), (D,), (D,),
              (64, D), (64,), (D, 64), (D,)]
    for device, approximate in [("cpu", "none"), ("cuda", "tanh")]:
        with FakeTensorMode():
            tensors = [torch.empty(s, device=device) for s in shapes]
        gm = make_fx(layer, tracing_mode="fake")(*tensors)
        gelus = [n for n in gm.graph.nodes if n.target is aten.gelu.default]
        assert len(gelus) == 1
        assert gelus[0].kwargs.get("approximate", "none") == approximate
