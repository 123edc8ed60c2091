"""A float64 reference for judging a difference from eager that its tolerance rejects.

Eager's own result carries rounding error (a float16 encoder of a few layers differs from
its float64 value by more than float16's tolerance), and a backend that computes inside
in float32 can be closer to the true value than eager while differing from eager by more
than the tolerance. So a failed elementwise comparison is judged again, as PyTorch's
``torch._dynamo.utils.same`` judges with an fp64 reference: the partition's ATen graph
runs in float64 on the same inputs (an interpreter casting floating inputs, weights and
dtype arguments; no copy of the module), and a failed floating output passes when its
error against it is one that rounding explains: its RMS error at most ``RMS_FACTOR``
times eager's or at most what the dtype's rounding explains for that output (its scale
and the length of the reductions computing it, error_bound.py), and its largest error
at most ``MAX_FACTOR`` times eager's or that bound at the output's largest value (plus
the dtype's atol). Eager's own error is a float32 result's whose arithmetic can be
exact by luck (a sum of few terms, values exactly representable): the bound keeps a
backend that rounds in another order from being refused for that. If the reference
cannot run, the failure stands and says so. docs/verify.md.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

import torch
import torch.fx

from ...ops import all_finite
from .error_bound import ROUNDING_FACTOR, arithmetic_rms, reduction_lengths
from .verify import Comparison, compare, dtype_name, tolerance

RMS_FACTOR = 2.0
MAX_FACTOR = 4.0


def _up(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype != torch.float64:
        return v.to(torch.float64)
    if isinstance(v, torch.dtype) and v.is_floating_point and v != torch.float64:
        return torch.float64
    return v


class _Float64(torch.fx.Interpreter):
    def placeholder(self, target, args, kwargs):
        return _up(super().placeholder(target, args, kwargs))

    def get_attr(self, target, args, kwargs):
        return _up(super().get_attr(target, args, kwargs))

    def call_function(self, target, args, kwargs):
        # a model's own quantize/dequantize ops (PT2E) take float32, as the model runs
        # them: its quantization is its rounding, and the float64 reference computes
        # between its steps
        cast = _down if (isinstance(target, torch._ops.OpOverload)
                         and target.namespace == "quantized_decomposed") else _up
        args = torch.fx.node.map_aggregate(args, cast)
        kwargs = torch.fx.node.map_aggregate(kwargs, cast)
        return super().call_function(target, args, kwargs)


def _down(x: Any) -> Any:
    return x.to(torch.float32) if isinstance(x, torch.Tensor) and x.dtype == torch.float64 \
        else x


def float64_outputs(gm: torch.fx.GraphModule, args: Sequence[Any]) -> list:
    """``gm``'s outputs computed in float64 (floating inputs, weights, dtypes cast)."""
    with torch.no_grad():
        out = _Float64(gm).run(*args)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _rms(d: torch.Tensor) -> float:
    return float(d.pow(2).mean().sqrt())


def judge_against_float64(gm: torch.fx.GraphModule, args: Sequence[Any],
                          expected: Sequence[Any], got: Sequence[Any],
                          overrides: Optional[Mapping[str, Any]] = None) -> Comparison:
    """``compare(expected, got)``; where it fails on floating outputs only, each such
    output judged against a float64 reference instead (module docstring)."""
    first = compare(expected, got, overrides)
    if first.ok or len(expected) != len(got):
        return first
    failed = [k for k, (e, g) in enumerate(zip(expected, got))
              if not compare([e], [g], overrides).ok]
    if any(not (isinstance(expected[k], torch.Tensor) and expected[k].is_floating_point()
                and isinstance(got[k], torch.Tensor) and got[k].shape == expected[k].shape
                and got[k].dtype == expected[k].dtype
                and all_finite([expected[k], got[k]])) for k in failed):
        return first
    try:
        ref = float64_outputs(gm, args)
    except Exception as exc:  # noqa: BLE001 - the elementwise failure stands
        return Comparison(False, first.max_error, f"{first.detail}; no float64 reference "
                          f"({type(exc).__name__}: {str(exc)[:120]})")
    if len(ref) != len(expected):
        return first
    try:
        lengths = reduction_lengths(gm) or []
    except Exception:  # noqa: BLE001 - unknown lengths: eager's error alone is the bound
        lengths = []
    for k in failed:
        r = ref[k]
        if not isinstance(r, torch.Tensor) or r.shape != expected[k].shape \
                or not all_finite([r]):
            return first
        e_err = expected[k].to(r.device, torch.float64) - r
        g_err = got[k].to(r.device, torch.float64) - r
        e_rms, g_rms = _rms(e_err), _rms(g_err)
        e_max, g_max = float(e_err.abs().max()), float(g_err.abs().max())
        atol = tolerance(expected[k].dtype, overrides)[1]
        length = lengths[k] if k < len(lengths) else None
        rounding = arithmetic_rms(expected[k].dtype, length, _rms(r))
        rounding_max = arithmetic_rms(expected[k].dtype, length, float(r.abs().max()))
        if not (g_rms <= max(RMS_FACTOR * e_rms, rounding) + atol / 10
                and g_max <= max(MAX_FACTOR * e_max, rounding_max) + atol):
            return Comparison(False, first.max_error, (
                f"output {k} ({dtype_name(expected[k].dtype)}): against a float64 "
                f"reference its error is RMS {g_rms:.3g}, max {g_max:.3g}; eager's RMS "
                f"{e_rms:.3g}, max {e_max:.3g}; rounding explains RMS {rounding:.3g}, max "
                f"{rounding_max:.3g} ({ROUNDING_FACTOR:g} eps sqrt(K) x scale, reductions "
                f"of length K={length or 0:.0f}; allowed the larger of that and "
                f"{RMS_FACTOR:g}x eager's RMS, {MAX_FACTOR:g}x eager's max); against "
                f"eager: {first.detail}"))
    return Comparison(True, first.max_error, f"within rounding error against a float64 "
                      f"reference (outputs {', '.join(map(str, failed))}; against eager: "
                      f"{first.detail})")
