"""Samples of PT2E's quantize/dequantize ops, which no OpInfo of PyTorch's op_db holds.

A model quantized with torchao's ``prepare_pt2e``/``convert_pt2e`` holds
``quantized_decomposed.quantize_per_tensor`` and ``dequantize_per_tensor`` around its
activations (uint8, 0..255, as ``X86InductorQuantizer`` makes them) and
``dequantize_per_channel`` on its int8 weights (-128..127, one scale per output channel,
float32 scales, int64 zero points). Each sample here calls one of those ops, or a quantize
then its dequantize (the pair a backend sees between two layers), on float32 inputs
with the argument sets a converted model holds, in uint8 and int8; they go through the
same probe as an OpInfo sample (``arbiter probe BACKEND --ops quantized_decomposed``),
crediting every dtype a node reads or writes (float32, uint8, int8, int64). Inputs are
drawn away from rounding ties (``x / scale`` within 0.05 of a half), where eager's
``round(x * (1 / scale))`` and a runtime's ``round(x / scale)`` may pick neighbours.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..ops import register_namespaces

NAMESPACE = "quantized_decomposed"


def _ops() -> Any:
    register_namespaces()
    return getattr(torch.ops, NAMESPACE)


def _away_from_ties(x: torch.Tensor, scale: Any) -> torch.Tensor:
    """``x`` nudged so that ``x / scale`` is at least 0.05 from a half-integer."""
    s = scale if isinstance(scale, float) else scale.reshape(-1, *[1] * (x.dim() - 1))
    frac = torch.frac((x / s).abs())
    near = (frac - 0.5).abs() < 0.05
    return torch.where(near, x + 0.1 * s * torch.sign(x + 1e-12), x)


class QuantSample:
    """One quantize/dequantize op (or a pair) on one argument set: quacks like an OpInfo
    (``name``, ``aten_name``, ``variant_test_name``, ``op``, ``supported_dtypes``,
    ``sample_inputs``)."""

    has_nondeterministic_output = False
    skip_correctness_check_compile_vs_eager = False
    force = True  # chosen for its arguments: run even where its (op, dtype) pairs passed

    def __init__(self, op: str, variant: str, make: Callable[[torch.Generator], tuple],
                 call: Callable, overload: str = "default"):
        self.name = f"{NAMESPACE}.{op}"
        self.overload = overload
        self.aten_name = op
        self.variant_test_name = variant
        self._make = make
        self.op = call

    def supported_dtypes(self, device: str) -> set:
        return {torch.float32}

    def sample_inputs(self, device: str, dtype: torch.dtype, requires_grad: bool = False):
        from torch.testing._internal.opinfo.core import SampleInput

        inp, args = self._make(torch.Generator().manual_seed(0))
        yield SampleInput(inp, args=args)


#: (dtype, quant_min, quant_max, scale, zero point) of the argument sets PT2E writes:
#: X86InductorQuantizer's uint8 activations, and symmetric-range int8 ones
_PER_TENSOR = {"uint8": (torch.uint8, 0, 255, 0.05, 128), "int8": (torch.int8, -128, 127, 0.03, 3)}


def _float(g: torch.Generator, shape: tuple, scale: Any) -> torch.Tensor:
    return _away_from_ties(torch.randn(shape, generator=g) * 2.0, scale)


def _per_tensor(variant: str) -> list[QuantSample]:
    dt, lo, hi, scale, zp = _PER_TENSOR[variant]
    qd = _ops()
    shape = (4, 8, 6)

    def quantize(g):
        return _float(g, shape, scale), (scale, zp, lo, hi, dt)

    def codes(g):
        return torch.randint(lo, hi + 1, shape, generator=g).to(dt), (scale, zp, lo, hi, dt)

    def pair(x, s, z, a, b, d):
        return qd.dequantize_per_tensor.default(qd.quantize_per_tensor.default(x, s, z, a, b, d),
                                                s, z, a, b, d)

    return [QuantSample("quantize_per_tensor", variant, quantize, qd.quantize_per_tensor.default),
            QuantSample("dequantize_per_tensor", variant, codes,
                        qd.dequantize_per_tensor.default),
            QuantSample("quantize_per_tensor", f"{variant}_dequantized", quantize, pair)]


def _per_channel(axis: int) -> list[QuantSample]:
    """int8 weights, one scale per channel of ``axis`` (0: a conv's or a linear's output
    channels, as PT2E quantizes them)."""
    qd = _ops()
    shape = (8, 4, 3, 3)
    n = shape[axis]

    def params(g):
        scales = torch.rand(n, generator=g) * 0.02 + 0.005
        return scales, torch.zeros(n, dtype=torch.int64)

    def quantize(g):
        scales, zps = params(g)
        x = torch.randn(shape, generator=g) * 0.5
        moved = x.movedim(axis, 0)
        x = _away_from_ties(moved, scales).movedim(0, axis).contiguous()
        return x, (scales, zps, axis, -128, 127, torch.int8)

    def codes(g):
        scales, zps = params(g)
        q = torch.randint(-128, 128, shape, generator=g).to(torch.int8)
        return q, (scales, zps, axis, -128, 127, torch.int8)

    def pair(x, s, z, a, lo, hi, d):
        return qd.dequantize_per_channel.default(
            qd.quantize_per_channel.default(x, s, z, a, lo, hi, d), s, z, a, lo, hi, d)

    return [QuantSample("quantize_per_channel", f"int8_axis{axis}", quantize,
                        qd.quantize_per_channel.default),
            QuantSample("quantize_per_channel", f"int8_axis{axis}_dequantized", quantize, pair),
            QuantSample("dequantize_per_channel", f"int8_axis{axis}", codes,
                        qd.dequantize_per_channel.default)]


#: choose_qparams' eps in the graphs X86InductorQuantizer(is_dynamic=True) makes: 2**-12
_DYNAMIC_EPS = 2.0 ** -12


def _dynamic(variant: str) -> list[QuantSample]:
    """uint8 activations quantized with parameters computed at run time, as
    ``X86InductorQuantizer`` makes them with ``is_dynamic=True``: ``choose_qparams.tensor``
    (a float64 scale and an int64 zero point, one-element tensors), then the ``.tensor``
    overloads of quantize and dequantize. ``variant``: ``signed`` inputs span both signs;
    ``positive`` ones (a ReLU's output) do not, where eager still counts 0 into the range.
    Each input holds its range's two ends exactly, so the scale is known while the other
    values are moved away from rounding ties."""
    qd = _ops()
    shape = (4, 8, 6)
    lo_val, hi_val = (-4.0, 4.5) if variant == "signed" else (0.5, 6.0)
    qargs = (0, 255, _DYNAMIC_EPS, torch.uint8)

    def activations(g):
        x = (torch.rand(shape, generator=g) * (hi_val - lo_val) + lo_val).clamp(
            lo_val + 0.05, hi_val - 0.05)
        scale = (max(hi_val, 0.0) - min(lo_val, 0.0)) / 255.0
        x = _away_from_ties(x, scale).clamp(lo_val + 0.01, hi_val - 0.01)
        flat = x.reshape(-1)
        flat[0], flat[-1] = lo_val, hi_val
        return x

    def chosen(g):
        x = activations(g)
        return x, qargs

    def quantize(g):
        x = activations(g)
        scale, zp = qd.choose_qparams.tensor(x, *qargs)
        return x, (scale, zp, 0, 255, torch.uint8)

    def codes(g):
        x = activations(g)
        scale, zp = qd.choose_qparams.tensor(x, *qargs)
        q = torch.randint(0, 256, shape, generator=g).to(torch.uint8)
        return q, (scale, zp, 0, 255, torch.uint8)

    def chain(x, lo, hi, eps, dtype):
        scale, zp = qd.choose_qparams.tensor(x, lo, hi, eps, dtype)
        q = qd.quantize_per_tensor.tensor(x, scale, zp, lo, hi, dtype)
        return qd.dequantize_per_tensor.tensor(q, scale, zp, lo, hi, dtype)

    return [QuantSample("choose_qparams", f"uint8_{variant}", chosen, qd.choose_qparams.tensor,
                        "tensor"),
            QuantSample("quantize_per_tensor", f"uint8_{variant}_dynamic", quantize,
                        qd.quantize_per_tensor.tensor, "tensor"),
            QuantSample("dequantize_per_tensor", f"uint8_{variant}_dynamic", codes,
                        qd.dequantize_per_tensor.tensor, "tensor"),
            QuantSample("choose_qparams", f"uint8_{variant}_chain", chosen, chain, "tensor")]


def quant_samples() -> list[QuantSample]:
    """Every sample, per tensor (uint8, int8), per channel (axis 0, 1), then dynamic
    (parameters chosen at run time, on signed and on positive activations)."""
    return [*_per_tensor("uint8"), *_per_tensor("int8"), *_per_channel(0), *_per_channel(1),
            *_dynamic("signed"), *_dynamic("positive")]


def samples_for(names: Any) -> list[QuantSample]:
    """The samples ``names`` selects: ``quantized_decomposed`` (all), an op
    (``quantized_decomposed.dequantize_per_tensor``, with or without an overload); none
    for None (a whole probe of OpInfos names no op)."""
    if names is None:
        return quant_samples()
    out = []
    for s in quant_samples():
        full = f"{s.name}.{s.overload}"
        if any(n in (NAMESPACE, s.name, full) for n in names):
            out.append(s)
    return out
