"""Dropout split apart from its random draw (arbiter.decompose.split_dropout, config
`random: eager`): the mask is drawn by a node reading nothing, in eager, in the order of
the graph's random ops; the multiplications go to backends. Checked bit for bit against
eager (outputs, masks, gradients, torch's RNG state after the step)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import arbiter
from arbiter.decompose import dropout_mask_op, split_dropout
from arbiter.ops import is_random

aten = torch.ops.aten


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` as integers of its width: equal bits, NaN and -0.0 included."""
    return t.view({torch.float32: torch.int32, torch.float64: torch.int64,
                   torch.float16: torch.int16, torch.bfloat16: torch.int16}.get(t.dtype, t.dtype))


def _bit_equal(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_bit_equal(x, y) for x, y in zip(a, b))
    return (a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and torch.equal(_bits(a), _bits(b)))


def _run(fn, *args, seed=0):
    torch.manual_seed(seed)
    out = fn(*args)
    return out, torch.get_rng_state()


def _x(dtype=torch.float32, layout="contiguous"):
    x = torch.randn(24, 33, 5, dtype=dtype)
    x[0, 0, 0], x[0, 1, 0], x[0, 2, 0], x[1, 0, 0] = float("inf"), float("nan"), -1.0, -0.0
    return {"contiguous": x, "transposed": x.transpose(0, 1),
            "permuted": x.permute(2, 0, 1)}[layout]


def _dropouts(gm):
    return [n for n in gm.graph.nodes if n.target is aten.native_dropout.default]


def _masks(gm):
    return [n for n in gm.graph.nodes if n.target is dropout_mask_op()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "permuted"])
def test_split_dropout_is_bit_equal_to_eager(dtype, p, layout):
    x = _x(dtype, layout)

    def fn(x):
        return aten.native_dropout.default(x, p, True)

    gm = make_fx(fn, tracing_mode="fake")(x)
    assert split_dropout(gm) == 1
    assert not _dropouts(gm)
    (mask,) = _masks(gm)
    assert not mask.all_input_nodes  # the draw reads no data
    assert [n for n in gm.graph.nodes if n.op == "call_function" and is_random(n)] == [mask]
    want, want_rng = _run(fn, x)
    got, got_rng = _run(gm, x)
    assert _bit_equal(got, want)
    assert torch.equal(got_rng, want_rng)
    if 0 < p < 1:  # the draws are not trivial
        assert 0 < want[1].float().mean().item() < 1


def test_split_dropout_gives_each_graph_values_of_its_own_fake_mode():
    """The traced split is kept between graphs (keyed by the dropout's signature); a
    second graph of the same shapes gets its mask and products as values of its own fake
    mode, not the first graph's (Inductor refused partitions holding two modes: two
    BERT-style models compiled in one process fell back to eager)."""
    from torch._subclasses.fake_tensor import FakeTensor

    def fn(x):
        return aten.native_dropout.default(torch.relu(x), 0.1, True)

    x = torch.randn(6, 7)
    for _ in range(2):
        gm = make_fx(fn, tracing_mode="fake")(x)
        mode = next(n.meta["val"].fake_mode for n in gm.graph.nodes if n.op == "placeholder")
        assert split_dropout(gm) == 1
        for n in gm.graph.nodes:
            for v in torch.utils._pytree.tree_leaves(n.meta.get("val")):
                if isinstance(v, FakeTensor):
                    assert v.fake_mode is mode, n.format_node()


@pytest.mark.parametrize("case", ["float16", "bfloat16", "not dense", "eval", "symbolic"])
def test_split_dropout_leaves_what_it_cannot_match(case):
    """Dropouts whose split would not be bit-equal (float16/bfloat16: eager's mul_(scale)
    rounds otherwise), or that it does not handle, stay whole."""
    x = {"float16": _x(torch.float16), "bfloat16": _x(torch.bfloat16),
         "not dense": _x()[:, ::2]}.get(case, _x())
    train = case != "eval"

    def fn(x):
        return aten.native_dropout.default(x, 0.3, train)

    gm = make_fx(fn, tracing_mode="symbolic" if case == "symbolic" else "fake")(x)
    assert split_dropout(gm) == 0
    assert len(_dropouts(gm)) == 1 and not _masks(gm)
    if case != "symbolic":
        assert _bit_equal(_run(gm, x)[0], _run(fn, x)[0])


def test_split_dropout_keeps_the_order_of_random_ops():
    """A mask moves up to just after the previous random op, never past it: the RNG
    stream is eager's (a rand_like between two dropouts draws what it draws in eager)."""
    def fn(x, w):
        a = aten.native_dropout.default(torch.tanh(x @ w), 0.2, True)[0]
        r = torch.rand_like(a)
        b = aten.native_dropout.default(a + r, 0.4, True)[0]
        c = aten.native_dropout.default(torch.relu(b), 0.5, True)[0]
        return c, r

    x, w = torch.randn(16, 8), torch.randn(8, 12)
    gm = make_fx(fn, tracing_mode="fake")(x, w)
    assert split_dropout(gm) == 3
    random = [n for n in gm.graph.nodes if n.op == "call_function" and is_random(n)]
    masks = _masks(gm)
    assert [n.target for n in random] == [dropout_mask_op(), aten.rand_like.default,
                                          dropout_mask_op(), dropout_mask_op()]
    # the first mask is drawn before any compute, the later ones right after rand_like
    first = next(n for n in gm.graph.nodes if n.op == "call_function")
    assert first is masks[0] and random[1].next is masks[1] and masks[1].next is masks[2]
    want, want_rng = _run(fn, x, w)
    got, got_rng = _run(gm, x, w)
    assert _bit_equal(got, want) and torch.equal(got_rng, want_rng)


# -- through arbiter ----------------------------------------------------------------------
class MLP(nn.Module):
    """Three dropouts of different rates, one on the input."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 8)
        self.d1, self.d2, self.d3 = nn.Dropout(0.1), nn.Dropout(0.5), nn.Dropout(0.3)

    def forward(self, x):
        return self.c(self.d3(torch.tanh(self.b(self.d2(F.gelu(self.a(self.d1(x))))))))


def _aten_backend(make_backend):
    """A backend that runs the ATen graph it is given (every op): what it computes is
    eager's, so a stitched step can be compared bit for bit."""
    make_backend("aten_all", ["'*'"])
    return "aten_all"


def _train(model, x, steps, compiled=None):
    """Losses, gradients and RNG states of ``steps`` SGD steps (seeded per step)."""
    run = model if compiled is None else compiled
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for step in range(steps):
        torch.manual_seed(step)
        opt.zero_grad()
        y = run(*x)
        y = getattr(y, "last_hidden_state", y)
        loss = y.float().pow(2).mean()
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        out.append((loss.detach(), grads, torch.get_rng_state()))
        opt.step()
    return out


def _assert_bit_equal_steps(got, want):
    for (gl, gg, gr), (wl, wg, wr) in zip(got, want, strict=True):
        assert _bit_equal(gl, wl)
        assert len(gg) == len(wg) and all(_bit_equal(a, b) for a, b in zip(gg, wg))
        assert torch.equal(gr, wr)


def _partitions(be, kind):
    return [(p.backend, p.ops) for g in be.report(advice=False).graphs if g.kind == kind
            for p in g.partitions]


def test_mlp_training_bit_equal_and_forward_whole(make_backend, fresh_dynamo):
    name = _aten_backend(make_backend)
    torch.manual_seed(0)
    model, x = MLP(), (torch.randn(16, 32),)
    ref = copy.deepcopy(model)
    be = arbiter.Arbiter({"backends": [name], "min_block_size": 1,
                          "against_eager": "off"})
    got = _train(model, x, 3, torch.compile(model, backend=be))
    _assert_bit_equal_steps(got, _train(ref, x, 3))
    fwd = _partitions(be, "forward")
    # the three masks in one eager partition, all compute in one other
    assert [b for b, _ in fwd] == ["eager", name]
    assert set(fwd[0][1]) == {"arbiter.dropout_mask.default"}
    assert "aten.native_dropout.default" not in fwd[1][1]
    assert [b for b, _ in _partitions(be, "backward")] == [name]


def test_mlp_dropout_on_onnxruntime(fresh_dynamo):
    """ONNX Runtime takes the multiplications and the backward's
    native_dropout_backward (its decomposition); the masks are eager's."""
    torch.manual_seed(0)
    model, x = MLP(), (torch.randn(16, 32),)
    ref = copy.deepcopy(model)
    # the plan under test, untimed (eager may win the timing against it: against_eager)
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "min_block_size": 1,
                          "against_eager": "off"})
    got = _train(model, x, 2, torch.compile(model, backend=be))
    want = _train(ref, x, 2)
    for (gl, gg, gr), (wl, wg, wr) in zip(got, want):
        torch.testing.assert_close(gl, wl)
        for a, b in zip(gg, wg):
            torch.testing.assert_close(a, b)
        assert torch.equal(gr, wr)
    assert [b for b, _ in _partitions(be, "forward")] == ["eager", "onnxruntime"]
    assert [b for b, _ in _partitions(be, "backward")] == ["onnxruntime"]


class Exact(nn.Module):
    """Ops ONNX Runtime computes exactly as eager does (relu, add, multiplications)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 48))

    def forward(self, x):
        return F.dropout(torch.relu(x * self.w) + 1, 0.3, training=True) * 3


def test_exact_ops_on_onnxruntime_bit_equal(fresh_dynamo):
    torch.manual_seed(0)
    model, x = Exact(), (torch.randn(64, 48),)
    ref = copy.deepcopy(model)
    # the plan under test, untimed (eager may win the timing against it: against_eager)
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "min_block_size": 1,
                          "against_eager": "off"})
    _assert_bit_equal_steps(_train(model, x, 3, torch.compile(model, backend=be)),
                            _train(ref, x, 3))
    assert [b for b, _ in _partitions(be, "forward")] == ["eager", "onnxruntime"]


def test_dynamic_shapes_leave_dropout_whole(make_backend, fresh_dynamo):
    name = _aten_backend(make_backend)
    torch.manual_seed(0)
    model = MLP()
    ref = copy.deepcopy(model)
    be = arbiter.Arbiter({"backends": [name], "min_block_size": 1})
    compiled = torch.compile(model, backend=be, dynamic=True)
    for rows in (8, 13):
        x = (torch.randn(rows, 32),)
        _assert_bit_equal_steps(_train(model, x, 1, compiled), _train(ref, x, 1))
    ops = [op for _, ops in _partitions(be, "forward") for op in ops]
    assert "aten.native_dropout.default" in ops and "arbiter.dropout_mask.default" not in ops


def test_random_backend_leaves_dropout_whole(make_backend, fresh_dynamo):
    name = _aten_backend(make_backend)
    be = arbiter.Arbiter({"backends": [name], "min_block_size": 1, "random": "backend"})
    torch.compile(MLP(), backend=be)(torch.randn(4, 32)).sum().backward()
    ops = [op for _, ops in _partitions(be, "forward") for op in ops]
    assert "aten.native_dropout.default" in ops and "arbiter.dropout_mask.default" not in ops


def test_a_rule_naming_the_dropout_leaves_it_whole(make_backend, fresh_dynamo):
    """`exclude_ops: [aten.native_dropout]`: the user's rule sees the op it names."""
    name = _aten_backend(make_backend)
    be = arbiter.Arbiter({"backends": [name], "min_block_size": 1,
                          "exclude_ops": ["aten.native_dropout"]})
    torch.compile(MLP(), backend=be)(torch.randn(4, 32)).sum().backward()
    ops = [op for _, ops in _partitions(be, "forward") for op in ops]
    assert "aten.native_dropout.default" in ops and "arbiter.dropout_mask.default" not in ops


# -- transformers ---------------------------------------------------------------------------
def _bert():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, vocab_size=200, max_position_embeddings=64,
                     hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    return BertModel(cfg, add_pooling_layer=False), (torch.randint(0, 200, (4, 32)),)


def _gpt2():
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=200,
                     resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    return GPT2Model(cfg), (torch.randint(0, 200, (4, 32)),)


@pytest.mark.parametrize("build", [_bert, _gpt2], ids=["bert", "gpt2"])
def test_transformers_training_bit_equal(build, make_backend, fresh_dynamo):
    pytest.importorskip("transformers")
    name = _aten_backend(make_backend)
    torch.manual_seed(0)
    model, x = build()
    model.train()
    ref = copy.deepcopy(model)
    be = arbiter.Arbiter({"backends": [name], "min_block_size": 1,
                          "against_eager": "off"})
    _assert_bit_equal_steps(_train(model, x, 2, torch.compile(model, backend=be)),
                            _train(ref, x, 2))
    fwd = _partitions(be, "forward")
    assert [b for b, _ in fwd] == ["eager", name]
    assert set(fwd[0][1]) == {"arbiter.dropout_mask.default"}


@pytest.mark.slow
@pytest.mark.parametrize("build", [_bert, _gpt2], ids=["bert", "gpt2"])
def test_transformers_training_on_the_default_config(build, fresh_dynamo):
    """The shipped `default` (ONNX Runtime, Inductor): one eager partition of masks, the
    forward's compute in one ONNX Runtime partition; eager's draws (RNG state equal)."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model, x = build()
    model.train()
    ref = copy.deepcopy(model)
    # the default's plan, untimed (eager may win the timing against it: against_eager)
    be = arbiter.Arbiter(arbiter.load_config("default").model_copy(
        update={"against_eager": "off"}))
    got = _train(model, x, 2, torch.compile(model, backend=be))
    want = _train(ref, x, 2)
    for (gl, gg, gr), (wl, wg, wr) in zip(got, want):
        torch.testing.assert_close(gl, wl, rtol=1e-5, atol=1e-6)
        for a, b in zip(gg, wg):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        assert torch.equal(gr, wr)
    fwd = _partitions(be, "forward")
    assert [b for b, _ in fwd] == ["eager", "onnxruntime"]
    assert set(fwd[0][1]) == {"arbiter.dropout_mask.default"}
