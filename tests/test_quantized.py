"""A model the user quantized (PyTorch's PT2E flow: quantize/dequantize nodes around the
compute): where no configured backend takes its quantize/dequantize ops, they run in
eager, and the report and the log say so with the backends' reasons: the user's int8 is
not what runs. Tiny models: ``against_eager: off``."""
from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import arbiter


class QDQLinear(nn.Module):
    """A linear layer fed through a quantize/dequantize pair, as PT2E's convert leaves it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        import torch.ao.quantization.fx._decomposed  # noqa: F401 - registers the ops

        qd = torch.ops.quantized_decomposed
        q = qd.quantize_per_tensor(x, 0.05, 0, -128, 127, torch.int8)
        return self.fc(qd.dequantize_per_tensor(q, 0.05, 0, -128, 127, torch.int8)).relu()


def test_quantize_ops_left_in_eager_are_warned(fresh_dynamo, caplog):
    pytest.importorskip("onnxruntime")
    import torch.ao.quantization.fx._decomposed  # noqa: F401

    torch.manual_seed(0)
    model, x = QDQLinear().eval(), torch.randn(4, 16)
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "against_eager": "off"})
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="arbiter"):
        out = torch.compile(model, backend=be)(x)
        torch.testing.assert_close(out, model(x))
    g = be.report().graphs[0]
    said = [w for w in g.warnings if "quantize/dequantize nodes" in w]
    assert len(said) == 1, g.warnings
    assert "quantized_decomposed.quantize_per_tensor.default x1" in said[0]
    assert "onnxruntime: quantized_decomposed." in said[0]  # the backend's reason
    assert any("quantize/dequantize nodes" in r.getMessage() for r in caplog.records)
    assert "quantize/dequantize nodes" in str(be.report())  # the text report shows it


def test_a_model_without_quantize_ops_gets_no_such_warning(fresh_dynamo):
    pytest.importorskip("onnxruntime")
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "against_eager": "off"})
    with torch.no_grad():
        torch.compile(nn.Linear(16, 16).eval(), backend=be)(torch.randn(4, 16))
    assert not any("quantize" in w for g in be.report().graphs for w in g.warnings)


def test_a_pt2e_quantized_cnn_says_its_int8_runs_in_eager(fresh_dynamo):
    """The standard flow (torchao's prepare_pt2e/convert_pt2e, X86InductorQuantizer)."""
    pytest.importorskip("torchao", reason="torchao (PT2E quantization) is not installed")
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 4)).eval()
    x = torch.randn(2, 3, 16, 16)
    quantizer = xiq.X86InductorQuantizer()
    quantizer.set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    prepared(x)
    converted = convert_pt2e(prepared)
    be = arbiter.Arbiter({"backends": ["onnxruntime", "openvino"], "against_eager": "off"})
    with torch.no_grad():
        out = torch.compile(converted, backend=be)(x)
        torch.testing.assert_close(out, converted(x))
    warnings = [w for g in be.report().graphs for w in g.warnings]
    assert any("quantize/dequantize nodes" in w and "dequantize_per_channel" in w
               for w in warnings), warnings
