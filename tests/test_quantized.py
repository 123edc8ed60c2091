"""A model the user quantized (PyTorch's PT2E flow: quantize/dequantize nodes around the
compute): its quantize/dequantize ops are in the manifests of ONNX Runtime, OpenVINO and
Inductor (probed with arbiter/probe/quant_samples.py), a dequantize never leaves the op it
feeds (plan/quantized.py), a quantized partition is judged within one quantization step
(run/checks/quantized.py), the report says which partitions run quantized; where no
backend takes them they run in eager, and the report and the log say so."""
from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

import arbiter
from arbiter.ops import DATA_MOVES, is_dequantize, op_name, packet_name


def _qd():
    import torch.ao.quantization.fx._decomposed  # noqa: F401 - registers the ops

    return torch.ops.quantized_decomposed


class QDQLinear(nn.Module):
    """A linear layer fed through a quantize/dequantize pair, as PT2E's convert leaves it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        qd = _qd()
        q = qd.quantize_per_tensor(x, 0.05, 0, -128, 127, torch.int8)
        return self.fc(qd.dequantize_per_tensor(q, 0.05, 0, -128, 127, torch.int8)).relu()


def test_quantize_ops_left_in_eager_are_warned(fresh_dynamo, caplog, make_backend):
    """A backend whose manifest lacks the quantize/dequantize ops leaves them in eager."""
    make_backend("floatonly", ["aten.addmm", "aten.t", "aten.relu"])
    torch.manual_seed(0)
    model, x = QDQLinear().eval(), torch.randn(4, 16)
    be = arbiter.Arbiter({"backends": ["floatonly"], "against_eager": "off",
                          "min_block_size": 1})
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="arbiter"):
        out = torch.compile(model, backend=be)(x)
        torch.testing.assert_close(out, model(x))
    g = be.report().graphs[0]
    said = [w for w in g.warnings if "quantize/dequantize nodes" in w]
    assert len(said) == 1, g.warnings
    assert "quantized_decomposed.quantize_per_tensor.default x1" in said[0]
    assert "floatonly: quantized_decomposed." in said[0]  # the backend's reason
    assert any("quantize/dequantize nodes" in r.getMessage() for r in caplog.records)
    assert "quantize/dequantize nodes" in str(be.report())  # the text report shows it
    # the dequantize's linear stays with it, in eager: no partition holds a dequantize
    # apart from what it feeds, and none runs quantized
    assert all(not p.quantized for p in g.partitions)


def test_a_model_without_quantize_ops_gets_no_such_warning(fresh_dynamo):
    pytest.importorskip("onnxruntime")
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "against_eager": "off"})
    with torch.no_grad():
        torch.compile(nn.Linear(16, 16).eval(), backend=be)(torch.randn(4, 16))
    assert not any("quantize" in w for g in be.report().graphs for w in g.warnings)


# -- PT2E's own flow ------------------------------------------------------------------------
class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1)
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def _mlp():
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def pt2e(model: nn.Module, x: torch.Tensor, dynamic: bool = False) -> nn.Module:
    """``model`` quantized the standard way: torchao's prepare_pt2e / convert_pt2e with
    X86InductorQuantizer, calibrated on four batches; ``dynamic``: activations quantized
    with parameters chosen at run time (``is_dynamic=True``)."""
    pytest.importorskip("torchao", reason="torchao (PT2E quantization) is not installed")
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq

    quantizer = xiq.X86InductorQuantizer()
    quantizer.set_global(xiq.get_default_x86_inductor_quantization_config(is_dynamic=dynamic))
    prepared = prepare_pt2e(torch.export.export(model.eval(), (x,)).module(), quantizer)
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        prepared(torch.randn(x.shape, generator=g))
    return convert_pt2e(prepared)


@pytest.fixture(scope="module")
def pt2e_models():
    torch.manual_seed(0)
    out = {}
    for name, model, x in (("cnn", CNN(), torch.randn(8, 3, 32, 32)),
                           ("mlp", _mlp(), torch.randn(8, 64))):
        out[name] = (pt2e(model, x), x)
    out["mlp_dynamic"] = (pt2e(_mlp(), torch.randn(8, 64), dynamic=True), torch.randn(8, 64))
    return out


def _last_step(converted: nn.Module) -> float:
    """The scale of the converted model's last activation quantization."""
    qs = [n for n in converted.graph.nodes if n.op == "call_function"
          and op_name(n.target) == "quantized_decomposed.quantize_per_tensor.default"]
    return float(qs[-1].args[1])


@pytest.mark.parametrize("config", ["default", "cpu_all"])
@pytest.mark.parametrize("name", ["cnn", "mlp"])
def test_pt2e_models_run_with_no_quantize_node_in_eager(fresh_dynamo, pt2e_models, name,
                                                        config):
    pytest.importorskip("onnxruntime")
    converted, x = pt2e_models[name]
    with torch.no_grad():
        expected = converted(x)
        compiled = torch.compile(converted, backend="arbiter", options={"config": config})
        out = compiled(x)
        out = compiled(x)  # after a timed first call: the installed placement
    torch.testing.assert_close(out, expected, rtol=0, atol=_last_step(converted))
    report = arbiter.report_for(compiled)
    g = report.graphs[0]
    assert not [w for w in g.warnings if "quantize/dequantize" in w], g.warnings
    for p in g.partitions:
        qdq = {op for op in p.ops if op.startswith("quantized_decomposed")}
        assert not (qdq and (p.backend or p.planned_backend) == "eager"), (p.id, p.ops)
    # nothing demoted: the int8 layers' rounding is within one step (run/checks/quantized.py)
    assert not [f for p in g.partitions for f in p.fallbacks], str(report)
    quantized = [p for p in g.partitions if p.quantized]
    assert quantized and all(p.quantized == ["int8", "uint8"] for p in quantized)
    assert f"quantized (int8, uint8): {quantized[0].backend} runs" in str(report)


# -- the plan: a dequantize stays with what it feeds -----------------------------------------
#: the dtypes a test backend's manifest allows for quantized graphs
QDTYPES = "float32, int64, int8, uint8, bool"


def _qdq_linear_graph():
    """A PT2E linear layer: an activation quantized and dequantized (uint8), an int8
    weight dequantized per channel, transposed, and an addmm. Inputs: x, the weight's
    codes, its scales and zero points (a model's constants, as graph inputs here)."""
    qd = _qd()

    def f(x, w, scales, zps):
        q = qd.quantize_per_tensor.default(x, 0.05, 128, 0, 255, torch.uint8)
        a = qd.dequantize_per_tensor.default(q, 0.05, 128, 0, 255, torch.uint8)
        wd = qd.dequantize_per_channel.default(w, scales, zps, 0, -128, 127, torch.int8)
        return torch.ops.aten.addmm.default(scales, a, torch.ops.aten.t.default(wd))

    return make_fx(f, tracing_mode="fake")(*_qdq_inputs())


def _qdq_inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(4, 16, generator=g),
            torch.randint(-128, 128, (8, 16), generator=g).to(torch.int8),
            torch.rand(8, generator=g) * 0.01 + 0.001, torch.zeros(8, dtype=torch.int64)]


def _feeds(node):
    """The nodes ``node``'s values reach through data moves, and the first compute ones."""
    out, todo = [], [node]
    while todo:
        for u in todo.pop().users:
            if u.op == "call_function":
                out.append(u)
                if packet_name(op_name(u.target)) in DATA_MOVES:
                    todo.append(u)
    return out


def test_a_dequantize_is_never_cut_from_the_op_it_feeds(make_backend):
    """Backend ``qa`` takes the quantize/dequantize ops and addmm but not the transpose
    between the weight's dequantize and the addmm: the plan keeps the dequantize, the
    transpose and the addmm together (in eager, the one place all of them run)."""
    qd = ["quantized_decomposed.quantize_per_tensor.default",
          "quantized_decomposed.dequantize_per_tensor.default",
          "quantized_decomposed.dequantize_per_channel.default"]
    make_backend("qa", [*qd, "aten.addmm.default"], dtypes=QDTYPES)
    gm = _qdq_linear_graph()
    plan = arbiter.partition(gm, {"backends": ["qa"], "min_block_size": 1})
    owner = {n: p.id for p in plan.partitions for n in p.nodes}
    deq = [n for n in gm.graph.nodes if is_dequantize(n)]
    assert len(deq) == 2
    for n in deq:
        assert all(owner[u] == owner[n] for u in _feeds(n)), plan.as_lists()


# -- the checks: one quantization step ------------------------------------------------------
def test_quantized_outputs_are_judged_within_one_step():
    from arbiter.run.checks.quantized import judge_outputs, output_steps

    gm = _qdq_linear_graph()
    assert output_steps(gm) == [0.05]
    args = _qdq_inputs()
    expected = [gm(*args)]  # one output
    near = [expected[0] + 0.04]  # under one step of the activation's scale (0.05)
    far = [expected[0] + 0.2]
    assert judge_outputs(gm, args, expected, near).ok
    bad = judge_outputs(gm, args, expected, far)
    assert not bad.ok and "quantization step" in bad.detail
    # a graph without quantization keeps float32's tolerance
    x = args[0]
    plain = make_fx(lambda t: t * 2.0, tracing_mode="fake")(x)
    assert output_steps(plain) is None
    assert not judge_outputs(plain, [x], [x * 2], [x * 2 + 0.04]).ok


def _two_int8_layers(dynamic: bool = False):
    """Two int8 layers, each a LayerNorm after it, the output scaled up: a value at a
    rounding boundary flipped to the other code moves the output by more than a step.
    ``dynamic``: each activation's scale and zero point chosen on the call (uint8)."""
    qd = _qd()
    g = torch.Generator().manual_seed(0)
    w1, w2 = torch.randn(256, 256, generator=g) / 16, torch.randn(256, 256, generator=g) / 16

    def qdq(t, scale):
        if dynamic:
            scale, zp = qd.choose_qparams.tensor(t, 0, 255, 2.0 ** -12, torch.uint8)
            return qd.dequantize_per_tensor.tensor(
                qd.quantize_per_tensor.tensor(t, scale, zp, 0, 255, torch.uint8),
                scale, zp, 0, 255, torch.uint8)
        return qd.dequantize_per_tensor.default(
            qd.quantize_per_tensor.default(t, scale, 0, -128, 127, torch.int8),
            scale, 0, -128, 127, torch.int8)

    def f(x):
        h = torch.nn.functional.layer_norm(qdq(x, 0.02) @ w1, (256,))
        return (torch.nn.functional.layer_norm(qdq(h, 0.05) @ w2, (256,)) * 20,)

    x = torch.randn(64, 256, generator=g)
    return make_fx(f)(x), x


def _other_order(gm, x, offset: int = 1000) -> list:
    """``gm`` run nudged as ``_spread`` nudges it, with other draws (another backend's
    order of the float ops before each quantize)."""
    from arbiter.run.checks.quantized import _Nudged

    class OtherOrder(_Nudged):
        def __init__(self, g):
            super().__init__(g)
            self.position = {n: i + offset for n, i in self.position.items()}
    return list(OtherOrder(gm).run(x))


def test_a_deep_int8_output_is_judged_by_the_spread_of_rounding():
    """Beyond one step: another backend's rounding at the boundaries (eager nudged with
    other draws) passes as within the spread of int8 rounding; 2% off, or noise of twice
    that spread, does not (run/checks/quantized.py, ``_spread``)."""
    from arbiter.run.checks.quantized import judge_outputs

    gm, x = _two_int8_layers()
    expected = list(gm(x))
    got = _other_order(gm, x)
    assert float((got[0] - expected[0]).abs().max()) > 0.05  # more than one step
    ok = judge_outputs(gm, [x], expected, got)
    assert ok.ok and "within the spread of int8 rounding" in ok.detail, ok.detail
    off = judge_outputs(gm, [x], expected, [got[0] * 1.02])
    assert not off.ok and "beyond the spread of int8 rounding" in off.detail, off.detail
    noise = torch.randn(expected[0].shape, generator=torch.Generator().manual_seed(3))
    assert not judge_outputs(gm, [x], expected, [expected[0] + 0.04 * noise]).ok


def test_a_dynamically_quantized_output_is_judged_by_the_spread():
    """Dynamic quantization's step is chosen on the call (``choose_qparams.tensor``): an
    output it feeds has step 0 (not None: no float32-only judging), so another rounding
    at the boundaries passes by the spread, and 2% off does not."""
    from arbiter.run.checks.quantized import judge_outputs, output_steps

    gm, x = _two_int8_layers(dynamic=True)
    assert output_steps(gm) == [0.0]
    expected = list(gm(x))

    # few values lie near a boundary here: one draw of the spread flipped none of them
    # where another draw flipped several (the spread takes the largest of SPREAD_DRAWS)
    for offset in range(1000, 6000, 1000):
        got = _other_order(gm, x, offset)
        ok = judge_outputs(gm, [x], expected, got)
        assert ok.ok, (offset, ok.detail)
    got = _other_order(gm, x)
    assert float((got[0] - expected[0]).abs().max()) > 1e-3  # beyond float32's tolerance
    ok = judge_outputs(gm, [x], expected, got)
    assert "within the spread of int8 rounding" in ok.detail, ok.detail
    off = judge_outputs(gm, [x], expected, [got[0] * 1.02])
    assert not off.ok and "chosen on the call" in off.detail, off.detail


def test_an_output_no_quantization_feeds_gets_the_float64_rejudge():
    """In a quantized partition, an output outside the quantized layers is judged as any
    partition's: a float32 row sum of 8192 terms in another order (beyond float32's
    elementwise tolerance, within its rounding) passes against float64; 1% off fails."""
    from arbiter.run.checks.quantized import judge_outputs

    qd = _qd()

    def f(x, y):
        a = qd.dequantize_per_tensor.default(
            qd.quantize_per_tensor.default(x, 0.05, 0, -128, 127, torch.int8),
            0.05, 0, -128, 127, torch.int8)
        return a.relu(), y.sum(1)

    torch.manual_seed(0)
    x, y = torch.randn(4, 16), torch.randn(256, 8192) * 10
    gm = make_fx(f, tracing_mode="fake")(x, y)
    expected = list(gm(x, y))
    acc = torch.zeros(256, 2)
    for part in y.view(256, 4096, 2).unbind(1):  # the columns summed in another order
        acc = acc + part
    reordered = acc.sum(1)
    assert not torch.allclose(reordered, expected[1], rtol=1.3e-6, atol=1e-5)
    ok = judge_outputs(gm, [x, y], expected, [expected[0] + 0.04, reordered])
    assert ok.ok and "within rounding error" in ok.detail, ok.detail
    assert not judge_outputs(gm, [x, y], expected, [expected[0], reordered * 1.01]).ok
    assert not judge_outputs(gm, [x, y], expected, [expected[0] + 0.2, reordered]).ok


# -- the backends: validators ---------------------------------------------------------------
def test_onnx_refuses_a_quantize_narrower_than_its_dtype():
    """QuantizeLinear saturates to the dtype's range; eager clamps to quant_min..quant_max."""
    pytest.importorskip("onnxruntime")
    qd = _qd()

    def f(x):
        return qd.dequantize_per_tensor.default(
            qd.quantize_per_tensor.default(x, 0.01, 0, -127, 127, torch.int8),
            0.01, 0, -127, 127, torch.int8)

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4, 8))
    plan = arbiter.partition(gm, {"backends": ["onnxruntime"], "min_block_size": 1})
    q = next(n for n in gm.graph.nodes if "quantize_per_tensor" in str(n.target)
             and not is_dequantize(n))
    assert plan.backend_of(q) == "eager"
    assert "saturates" in plan.support[q].refusals["onnxruntime"]


def test_openvino_takes_a_quantize_only_into_its_dequantize():
    """OpenVINO's frontend makes the pair one FakeQuantize; alone, a quantize failed at run.
    A dequantize of codes it did not quantize (a PT2E weight's) it takes: its arithmetic
    is written out before conversion (backends/_openvino_convert.py)."""
    pytest.importorskip("openvino")
    qd = _qd()

    def f(x):
        q = qd.quantize_per_tensor.default(x, 0.05, 128, 0, 255, torch.uint8)
        return q, qd.dequantize_per_tensor.default(q, 0.05, 128, 0, 255, torch.uint8)

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4, 8))
    plan = arbiter.partition(gm, {"backends": ["openvino"], "min_block_size": 1})
    q = next(n for n in gm.graph.nodes if n.op == "call_function" and not is_dequantize(n))
    assert "FakeQuantize" in plan.support[q].refusals["openvino"]
    plan = arbiter.partition(_qdq_linear_graph(), {"backends": ["openvino"],
                                                   "min_block_size": 1})
    assert {p.backend for p in plan.partitions} == {"openvino"}, plan.as_lists()


def test_openvino_dequantizes_codes_as_eager_does():
    """A PT2E linear whose int8 weight (and its scales, zero points) come in as inputs:
    on OpenVINO the same numbers as the graph in eager, to float32's last bit at most
    (the weight's dequantize is exact; the addmm's sums are OpenVINO's)."""
    pytest.importorskip("openvino")
    from arbiter.registry import get_backend_class

    gm = _qdq_linear_graph()
    out = gm.graph.output_node()
    out.args = ((out.args[0],),)  # a partition returns a tuple
    gm.recompile()
    inputs = _qdq_inputs()
    inputs[3] = torch.randint(-3, 4, (8,), generator=torch.Generator().manual_seed(1))
    run = get_backend_class("openvino")().compile(gm, inputs)
    torch.testing.assert_close(run(*inputs)[0], gm(*inputs)[0], rtol=1e-6, atol=1e-6)


def test_openvino_runs_pt2e_models_in_int8(fresh_dynamo, pt2e_models, monkeypatch):
    """OpenVINO alone takes the PT2E CNN and MLP whole (before, every weight's dequantize
    stayed in eager, and so did all of the model), within one quantization step of the
    converted model, and its CPU plugin runs the layers in 8 bits (its runtime model:
    int8 weights, u8 activations)."""
    ov = pytest.importorskip("openvino")
    compiled_models = []
    compile_model = ov.Core.compile_model

    def keep(self, *args, **kwargs):
        compiled_models.append(compile_model(self, *args, **kwargs))
        return compiled_models[-1]

    monkeypatch.setattr(ov.Core, "compile_model", keep)
    # converted the direct way (the FX decoder), never by torch.export: a rewrite the
    # decoder has no rule for (aten.reshape) sent BERT-base's partition the export way,
    # 18 s of its first call against 1
    import importlib

    from arbiter.registry import get_backend_class

    package = get_backend_class("openvino").__module__.rsplit(".", 1)[0]
    conversion = importlib.import_module(f"{package}._openvino_convert")

    def no_export(*args, **kwargs):
        raise AssertionError("the partition went the export way")

    monkeypatch.setattr(conversion, "export_program", no_export)
    for name, layers in (("cnn", 3), ("mlp", 3)):
        converted, x = pt2e_models[name]
        compiled_models.clear()
        be = arbiter.Arbiter({"backends": ["openvino"], "against_eager": "off"})
        with torch.no_grad():
            out = torch.compile(converted, backend=be)(x)
            expected = converted(x)
        torch.testing.assert_close(out, expected, rtol=0, atol=_last_step(converted))
        g = be.report().graphs[0]
        assert [(p.backend, p.quantized) for p in g.partitions] == \
            [("openvino", ["int8", "uint8"])], (name, g.partitions)
        ran = [(info["layerType"].astype(str), info["runtimePrecision"].astype(str))
               for c in compiled_models for op in c.get_runtime_model().get_ordered_ops()
               for info in (op.get_rt_info(),)]
        # each weight stays int8 (none folded into a float32 constant), and each layer
        # the plugin kept apart runs on u8 activations (it may fuse small ones into a
        # Subgraph of its own)
        assert ran.count(("Const", "i8")) == layers, (name, ran)
        computed = [p for t, p in ran if t in ("Convolution", "FullyConnected", "MatMul")]
        assert computed and set(computed) == {"u8"}, (name, ran)


# -- quantization-aware training: the converted model ----------------------------------------
class BNCNN(nn.Module):
    """A convolution with batch norm (folded into it by the QAT flow's convert)."""

    def __init__(self):
        super().__init__()
        self.c1, self.bn = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.c2, self.fc = nn.Conv2d(16, 32, 3, padding=1), nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.c2(torch.relu(self.bn(self.c1(x)))))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


@pytest.mark.slow  # convert_pt2e folds the QAT batch norm by pattern matching: 31-54 s here
def test_a_qat_model_runs_on_a_backend(fresh_dynamo):
    """torchao's QAT flow (prepare_qat_pt2e, a few training steps, convert_pt2e) leaves the
    same quantize/dequantize ops as the post-training one: the converted model runs whole
    on a backend, int8, within one quantization step of itself in eager (OpenVINO here;
    `default` ran it on Inductor, `cpu_all` on OpenVINO, 1.7e-5 steps apart).
    ``pytest.importorskip`` names what is missing."""
    pytest.importorskip("torchao", reason="torchao (PT2E quantization) is not installed")
    from torchao.quantization.pt2e import move_exported_model_to_eval
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq

    torch.manual_seed(0)
    x = torch.randn(8, 3, 32, 32)
    quantizer = xiq.X86InductorQuantizer()
    quantizer.set_global(xiq.get_default_x86_inductor_quantization_config(is_qat=True))
    prepared = prepare_qat_pt2e(torch.export.export(BNCNN().train(), (x,)).module(), quantizer)
    opt = torch.optim.SGD(prepared.parameters(), lr=0.01)
    for _ in range(3):
        loss = prepared(torch.randn(8, 3, 32, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    move_exported_model_to_eval(prepared)
    converted = convert_pt2e(prepared)
    with torch.no_grad():
        expected = converted(x)
        compiled = torch.compile(converted, backend="arbiter",
                                 options={"config": {"backends": ["openvino"],
                                                     "against_eager": "off"}})
        compiled(x)
        out = compiled(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=_last_step(converted))
    g = arbiter.report_for(compiled).graphs[0]
    assert not [w for w in g.warnings if "quantize/dequantize" in w], g.warnings
    assert [(p.backend, p.quantized) for p in g.partitions] == \
        [("openvino", ["int8", "uint8"])], g.partitions


# -- dynamic quantization: parameters chosen at run time -------------------------------------
@pytest.mark.parametrize("config", ["default", "cpu_all"])
def test_a_dynamically_quantized_model_runs_on_a_backend(fresh_dynamo, pt2e_models, config):
    """X86InductorQuantizer(is_dynamic=True): each activation's scale and zero point come
    from ``choose_qparams.tensor`` at run time, into the ``.tensor`` overloads of quantize
    and dequantize. Inductor takes all three (its int8 linear fused: packed weights), so
    no quantization node runs in eager (all of them did, 8x slower than Inductor)."""
    from torch._dynamo.utils import counters

    converted, x = pt2e_models["mlp_dynamic"]
    counters.clear()
    with torch.no_grad():
        expected = converted(x)
        compiled = torch.compile(converted, backend="arbiter", options={"config": config})
        compiled(x)
        out = compiled(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5 * float(expected.abs().max()))
    g = arbiter.report_for(compiled).graphs[0]
    assert not [w for w in g.warnings if "quantize/dequantize" in w], g.warnings
    for p in g.partitions:
        qdq = {op for op in p.ops if op.startswith("quantized_decomposed")}
        assert not (qdq and p.backend == "eager"), (p.id, p.backend, p.ops)
    assert counters["inductor"]["qlinear_weight_prepack_matcher_count"] == 3


@pytest.mark.parametrize("positive", [False, True])
def test_choose_qparams_decomposes_as_eager_computes_it(positive):
    """arbiter's decomposition of ``choose_qparams.tensor`` (Inductor's manifest asks for
    it) gives eager's scale and zero point bit for bit, on activations of both signs and
    on all-positive ones, where Inductor's own leaves 0 out of the range."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401 - registers the ops
    from torch._inductor.decomposition import choose_qparams_tensor as inductors

    from arbiter.decompose.own import extra

    choose = torch.ops.quantized_decomposed.choose_qparams.tensor
    ours = extra()[choose]
    g = torch.Generator().manual_seed(0)
    x = torch.rand(64, 32, generator=g) * 5 + (0.3 if positive else -2.0)
    args = (0, 255, 2.0 ** -12, torch.uint8)
    want = choose(x, *args)
    got = ours(x, *args)
    for w, o in zip(want, got):
        assert w.dtype == o.dtype and w.shape == o.shape
        assert torch.equal(w, o), (w, o)
    theirs = inductors(x, *args)
    assert torch.equal(theirs[0], want[0]) != positive  # what the decomposition is for


# -- the probe and the manifests ------------------------------------------------------------
def test_the_probe_runs_quantized_samples():
    pytest.importorskip("onnxruntime")
    from arbiter.probe.opinfo import probe
    from arbiter.registry import get_backend_class

    result = probe(get_backend_class("onnxruntime")(),
                   ops=["quantized_decomposed.quantize_per_tensor"], dtypes=["float32"])
    assert result.counts()["passed"] == 4, [(s.opinfo, s.status, s.reason)
                                            for s in result.samples]
    assert result.passed["quantized_decomposed.quantize_per_tensor.default"] >= \
        {"float32", "uint8", "int8"}


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino", "inductor"])
def test_the_manifests_hold_the_probed_quantize_ops(backend):
    from arbiter.registry import get_backend_class

    manifest = get_backend_class(backend).manifest()
    for op, dtypes in (("quantize_per_tensor", {"float32", "uint8", "int8"}),
                       ("dequantize_per_tensor", {"float32", "uint8", "int8"}),
                       ("dequantize_per_channel", {"float32", "int8", "int64"})):
        entry = manifest.entry(f"quantized_decomposed.{op}.default")
        assert entry is not None and entry.verified == "probed", (backend, op)
        assert {str(d).removeprefix("torch.") for d in entry.probed_dtypes} >= dtypes
    if backend == "inductor":  # dynamic quantization's ops: Inductor's alone
        for op in ("choose_qparams", "quantize_per_tensor", "dequantize_per_tensor"):
            entry = manifest.entry(f"quantized_decomposed.{op}.tensor")
            assert entry is not None and entry.verified == "probed", op


# -- the int8 paths: Inductor's freezing, a plan that runs the units timed ------------------
@pytest.mark.parametrize("freeze", [True, False])
def test_inductor_folds_int8_weights_into_its_int8_kernels(fresh_dynamo, pt2e_models, freeze):
    """Option ``freeze_quantized`` (on by default): a partition that dequantizes its int8
    weights is compiled with Inductor's freezing passes, which pack them for oneDNN's int8
    convolution (counted by Inductor's pattern matcher); off, they stay float compute."""
    from torch._dynamo.utils import counters

    converted, x = pt2e_models["cnn"]
    counters.clear()
    be = arbiter.Arbiter({"backends": [{"name": "inductor",
                                        "options": {"freeze_quantized": freeze}}],
                          "against_eager": "off"})
    with torch.no_grad():
        out = torch.compile(converted, backend=be)(x)
        expected = converted(x)
    packed = counters["inductor"]["qconv_weight_prepack_matcher_count"]
    assert (packed == 2) if freeze else (packed == 0), dict(counters["inductor"])
    assert be.report().graphs[0].partitions[0].backend == "inductor"
    torch.testing.assert_close(out, expected, rtol=0, atol=_last_step(converted))


def test_the_users_global_freezing_keeps_the_weights_frozen(fresh_dynamo, pt2e_models):
    """The PT2E X86 recipe sets ``torch._inductor.config.freezing`` for the whole process.
    Under it (grad off) Dynamo makes the weights graph attributes, which AOTAutograd lifts
    into inputs ahead of the model's own: they are frozen all the same (``lifted_weights``),
    and Inductor packs them (it failed to compile, on the weights as fake inputs, before)."""
    from torch._dynamo.utils import counters

    converted, x = pt2e_models["cnn"]
    counters.clear()
    be = arbiter.Arbiter({"backends": ["inductor"], "against_eager": "off"})
    # config.patch, not monkeypatch: undoing a monkeypatch of a config module deletes
    # the option (every later compile in the process failed: "freezing does not exist")
    with torch.no_grad(), torch._inductor.config.patch(freezing=True):
        out = torch.compile(converted, backend=be)(x)
        expected = converted(x)
    (part,) = be.report().graphs[0].partitions
    assert part.backend == "inductor", part
    assert counters["inductor"]["qconv_weight_prepack_matcher_count"] == 2
    torch.testing.assert_close(out, expected, rtol=0, atol=_last_step(converted))


# -- int8 in the calibration ---------------------------------------------------------------
def test_int8_layers_are_their_own_op_classes():
    """A linear or convolution whose weight is dequantized from int8 codes (through a
    view) is of class ``qlinear``/``qconv``; the same layers in float keep theirs."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from arbiter.measure.calibration_cells import CELLS
    from arbiter.plan.predict import op_class

    cells = {name: build for name, _, build in CELLS}
    for name, want in (("int8 linear 128x768x768", "qlinear"), ("int8 conv 64ch 56x56", "qconv"),
                       ("linear 16x256x256", "linear"), ("conv 16ch 28x28", "conv")):
        fn, args = cells[name]()
        gm = make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*args)
        got = {op_class(n) for n in gm.graph.nodes if n.op == "call_function"}
        assert want in got, (name, got)
        assert not ({"qlinear", "qconv"} & got) or want.startswith("q"), (name, got)


def test_an_int8_layer_is_priced_by_its_cell_else_as_float():
    from arbiter.plan.predict import BackendCalibration

    floats = BackendCalibration(0, 0, {"linear": ((1e6, 100.0),)})
    assert floats.op_us("qlinear", 1e6, True) == pytest.approx(100.0)  # no int8 cell
    both = BackendCalibration(0, 0, {"linear": ((1e6, 100.0),), "qlinear": ((1e6, 25.0),)})
    assert both.op_us("qlinear", 1e6, True) == pytest.approx(25.0)
    assert both.op_us("linear", 1e6, True) == pytest.approx(100.0)


def test_the_calibration_measures_the_int8_cells(make_backend):
    """``arbiter calibrate`` times an int8 linear and convolution per backend (PT2E's
    quantize/dequantize around them): Inductor compiles them to its int8 kernels."""
    from torch._dynamo.utils import counters

    from arbiter.measure.calibration_cells import CELLS, Calibrator, Measured

    be = arbiter.Arbiter({"backends": ["inductor"], "against_eager": "off"})
    int8 = {name for name, cls, _ in CELLS if cls in ("qlinear", "qconv")}
    have = Measured({}, {}, {name: "not this test's" for name, _, _ in CELLS
                             if name not in int8})
    counters.clear()
    got = Calibrator(be.planner, None, progress=False).run(["inductor"], {"inductor": have})
    m = got["inductor"]
    assert set(m.times_us) == int8 and not (set(m.refused) & int8), m.refused
    assert counters["inductor"]["qlinear_weight_prepack_matcher_count"] == 1
    assert counters["inductor"]["qconv_weight_prepack_matcher_count"] == 1


def test_plans_running_int8_units_are_timed(make_backend):
    """The calibration has no int8 cells: in a quantized graph every candidate that runs
    int8 units on a backend, leaving no more of them in eager than the predicted best,
    is timed beside it (plan/quantized.int8_rivals); one that runs none is not."""
    from types import SimpleNamespace

    from arbiter.plan.quantized import in_eager, int8_rivals

    qdq = ["quantized_decomposed.quantize_per_tensor.default",
           "quantized_decomposed.dequantize_per_tensor.default",
           "quantized_decomposed.dequantize_per_channel.default",
           "aten.addmm.default", "aten.t.default"]
    make_backend("qa", qdq, dtypes=QDTYPES)
    make_backend("qc", qdq, dtypes=QDTYPES)
    make_backend("qb", ["aten.addmm.default", "aten.t.default"], dtypes=QDTYPES)
    gm = _qdq_linear_graph()

    def cand(backend, ms):
        return SimpleNamespace(plan=arbiter.partition(gm, {"backends": [backend],
                                                           "min_block_size": 1}),
                               estimate_ms=ms)

    qa, qc, floats = cand("qa", 2.0), cand("qc", 3.0), cand("qb", 1.0)
    assert in_eager(qa.plan, {"eager"}) == (0, 3)
    assert in_eager(floats.plan, {"eager"}) == (3, 3)
    assert int8_rivals(floats, [qc, qa], {"eager"}) == [qa, qc]
    assert int8_rivals(qa, [floats, qc], {"eager"}) == [qc]
    plain = make_fx(lambda t: t * 2.0, tracing_mode="fake")(torch.randn(4))
    assert int8_rivals(SimpleNamespace(plan=arbiter.partition(plain, {"backends": ["qa"]})),
                       [qa], {"eager"}) == []


def test_the_warning_says_when_eager_was_timed_faster():
    from types import SimpleNamespace

    from arbiter.plan.policy import PolicyOutcome
    from arbiter.report.from_record import _eager_timed_faster

    eager = {"eager": SimpleNamespace(inline_aten=True),
             "onnxruntime": SimpleNamespace(inline_aten=False)}
    timed = SimpleNamespace(outcome=PolicyOutcome(
        policy="calibrated", chosen="only eager",
        candidates_ms={"only eager": 1.95, "only onnxruntime": 2.98, "priority": None}))
    assert _eager_timed_faster(timed, eager) == \
        "1.95 ms against 2.98 ms for only onnxruntime"
    predicted = SimpleNamespace(outcome=PolicyOutcome(policy="calibrated",
                                                      chosen="only onnxruntime"))
    assert _eager_timed_faster(predicted, eager) == ""


# -- saved programs ---------------------------------------------------------------------------
def test_a_quantized_program_saves_and_loads_its_qdq_model(pt2e_models, tmp_path):
    """``arbiter.export`` takes convert_pt2e's GraphModule (which says training=True and
    refuses .eval()); the saved ONNX is the QDQ model ONNX Runtime fuses, and the loaded
    program (quantized_decomposed ops allowed in program.json) gives the same numbers."""
    pytest.importorskip("onnxruntime")
    import zipfile

    import onnx

    converted, x = pt2e_models["mlp"]
    with torch.no_grad():
        program = arbiter.export(converted, (x,), config={"backends": ["onnxruntime"],
                                                          "against_eager": "off"})
        got = program(x)
        program.save(tmp_path / "mlp.arbiter")
        loaded = arbiter.load(tmp_path / "mlp.arbiter")
        torch.testing.assert_close(loaded(x), got, rtol=0, atol=0)
        torch.testing.assert_close(got, converted(x), rtol=0, atol=_last_step(converted))
    names = zipfile.ZipFile(tmp_path / "mlp.arbiter").namelist()
    model = onnx.load_from_string(zipfile.ZipFile(tmp_path / "mlp.arbiter").read(
        next(n for n in names if n.endswith(".onnx"))))
    ops = {n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops, ops
    assert loaded.report().graphs[0].partitions[0].quantized == ["int8", "uint8"]


def test_a_quantized_program_saves_and_loads_its_int8_openvino_ir(pt2e_models, tmp_path):
    """On OpenVINO the saved IR holds the int8 weights (i8 constants, not float32 ones),
    and the loaded program gives the saved one's numbers."""
    pytest.importorskip("openvino")
    import zipfile

    converted, x = pt2e_models["cnn"]
    with torch.no_grad():
        program = arbiter.export(converted, (x,), config={"backends": ["openvino"],
                                                          "against_eager": "off"})
        got = program(x)
        program.save(tmp_path / "cnn.arbiter")
        loaded = arbiter.load(tmp_path / "cnn.arbiter")
        torch.testing.assert_close(loaded(x), got, rtol=0, atol=0)
        torch.testing.assert_close(got, converted(x), rtol=0, atol=_last_step(converted))
    archive = zipfile.ZipFile(tmp_path / "cnn.arbiter")
    xml = archive.read(next(n for n in archive.namelist() if n.endswith("model.xml")))
    assert xml.count(b'element_type="i8"') == 3, xml.count(b'element_type="i8"')
    assert b"FakeQuantize" in xml
    assert loaded.report().graphs[0].partitions[0].quantized == ["int8", "uint8"]
