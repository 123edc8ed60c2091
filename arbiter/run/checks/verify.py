"""Checking a compiled partition's outputs: their metadata, and their numbers against eager.

Two checks, used by ``runtime.Piece`` and by ``arbiter probe``:

* ``check_meta(outputs, specs)``: count, shape, dtype and device of what a backend
  returned, against what the partition's ATen graph was traced to return. It is a few
  attribute comparisons per output, cheap enough for every call.
* ``compare(expected, got, tolerances)``: the numbers, with a tolerance per dtype. Floats
  pass when ``|got - expected| <= atol + rtol * |expected|`` elementwise (NaN equal to
  NaN, infinities equal in sign), integers and bools must be equal. The answer carries the
  largest absolute error, which the report shows.

The default tolerances are looser than ``torch.testing.assert_close``'s (float32: rtol
1.3e-6, atol 1e-5) because a backend that fuses or reorders reductions legitimately
differs from eager by more than one rounding step; they are tight enough to catch a wrong
kernel (an error of 1e-3 on values of order 1 fails float32).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ...ops import output_values

#: dtype name -> (rtol, atol). Integer and bool dtypes compare exactly.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
    "complex64": (1e-4, 1e-5),
    "complex128": (1e-7, 1e-7),
    "float8_e4m3fn": (1.25e-1, 1e-1),
    "float8_e5m2": (2.5e-1, 1e-1),
}


def uniform_tolerances(rtol: float, atol: float) -> dict[str, tuple[float, float]]:
    """The same (rtol, atol) for every floating dtype (config `accuracy`): overrides for
    ``compare``; integers and bools stay exact."""
    return {name: (float(rtol), float(atol)) for name in DEFAULT_TOLERANCES}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class OutputSpec:
    """What one output of a partition must be; ``shape`` is None when symbolic."""

    shape: Optional[tuple[int, ...]]
    rank: int
    dtype: torch.dtype
    device: str


def output_specs(gm: torch.fx.GraphModule) -> Optional[list[Optional[OutputSpec]]]:
    """The traced output metadata of an ATen graph returning a tuple; None if unknown.

    An entry is None for an output that is not a tensor (nothing to check there).
    """
    out = next((n for n in reversed(gm.graph.nodes) if n.op == "output"), None)
    vals = output_values(gm)
    if vals is None:
        return None
    specs: list[Optional[OutputSpec]] = []
    for arg, val in zip(out.args[0], vals):
        if not isinstance(val, torch.Tensor):
            if isinstance(arg, torch.fx.Node) and "val" not in arg.meta:
                return None  # traced without metadata: nothing reliable to check against
            specs.append(None)
            continue
        static = all(isinstance(s, int) for s in val.shape)
        specs.append(OutputSpec(torch.Size(val.shape) if static else None, val.dim(),
                                val.dtype, val.device.type))
    return specs


def check_meta(outputs: Any, specs: Sequence[Optional[OutputSpec]],
               devices: bool = True) -> Optional[str]:
    """Why ``outputs`` do not match ``specs`` (count, shape, dtype, device), or None.

    ``devices=False`` skips the device check (``Tensor.device`` builds an object per
    call; a backend does not move its outputs between calls, so the runtime checks
    devices on the first calls only).
    """
    if not isinstance(outputs, (tuple, list)):
        return f"returned a {type(outputs).__name__}, not a tuple or list of outputs"
    if len(outputs) != len(specs):
        return f"returned {len(outputs)} outputs, traced graph has {len(specs)}"
    for k, (t, spec) in enumerate(zip(outputs, specs)):
        if spec is None:
            continue
        if not isinstance(t, torch.Tensor):
            return f"output {k} is a {type(t).__name__}, traced as a tensor"
        if t.dtype != spec.dtype:
            return f"output {k} has dtype {dtype_name(t.dtype)}, traced {dtype_name(spec.dtype)}"
        if spec.shape is not None:
            if t.shape != spec.shape:
                return f"output {k} has shape {tuple(t.shape)}, traced {tuple(spec.shape)}"
        elif t.dim() != spec.rank:
            return f"output {k} has rank {t.dim()}, traced {spec.rank}"
        if devices and t.device.type != spec.device:
            return f"output {k} is on {t.device.type}, traced on {spec.device}"
    return None


@dataclass(frozen=True)
class Comparison:
    """The result of ``compare``: ``ok``, the largest absolute error, and why not ok."""

    ok: bool
    max_error: float
    detail: str = ""


def tolerance(dtype: torch.dtype, overrides: Optional[Mapping[str, Any]] = None) -> tuple[float, float]:
    """(rtol, atol) for ``dtype``; (0, 0) for integers and bools."""
    name = dtype_name(dtype)
    if overrides and name in overrides:
        tol = overrides[name]
        return (float(tol.rtol), float(tol.atol)) if hasattr(tol, "rtol") else tuple(tol)
    if dtype.is_floating_point or dtype.is_complex:
        return DEFAULT_TOLERANCES.get(name, (1e-4, 1e-5))
    return (0.0, 0.0)


def compare(expected: Sequence[Any], got: Sequence[Any],
            overrides: Optional[Mapping[str, Any]] = None) -> Comparison:
    """Compare two output lists elementwise with per-dtype tolerances."""
    if len(expected) != len(got):
        return Comparison(False, math.inf, f"{len(got)} outputs, expected {len(expected)}")
    worst = 0.0
    for k, (e, g) in enumerate(zip(expected, got)):
        if not isinstance(e, torch.Tensor):
            if e != g and not (isinstance(e, float) and math.isnan(e) and math.isnan(g)):
                return Comparison(False, math.inf, f"output {k}: {g!r}, expected {e!r}")
            continue
        if not isinstance(g, torch.Tensor) or g.shape != e.shape or g.dtype != e.dtype:
            what = (f"{dtype_name(g.dtype)}{tuple(g.shape)}" if isinstance(g, torch.Tensor)
                    else type(g).__name__)
            return Comparison(False, math.inf, f"output {k}: {what}, expected "
                              f"{dtype_name(e.dtype)}{tuple(e.shape)}")
        if e.numel() == 0:
            continue
        err, bad = _error(e.detach(), g.detach().to(e.device), *tolerance(e.dtype, overrides))
        worst = max(worst, err)
        if bad:
            rtol, atol = tolerance(e.dtype, overrides)
            return Comparison(False, worst, f"output {k} ({dtype_name(e.dtype)}): max abs "
                              f"error {err:.3g} (rtol {rtol:g}, atol {atol:g})")
    return Comparison(True, worst)


def _error(e: torch.Tensor, g: torch.Tensor, rtol: float, atol: float) -> tuple[float, bool]:
    if not (e.dtype.is_floating_point or e.dtype.is_complex):
        diff = (e != g)
        if not bool(diff.any()):
            return 0.0, False
        if e.dtype == torch.bool:
            return 1.0, True
        return float((e.long() - g.long()).abs().max()), True
    e64 = e.to(torch.complex128 if e.is_complex() else torch.float64)
    g64 = g.to(e64.dtype)
    same = (e64 == g64) | (torch.isnan(e64) & torch.isnan(g64))  # inf == inf, nan == nan
    diff = (e64 - g64).abs()
    diff = torch.where(same, torch.zeros_like(diff), diff)
    finite = torch.isfinite(diff)
    err = float(diff[finite].max()) if bool(finite.any()) else 0.0
    if not bool(finite.all()):
        return math.inf, True
    bad = bool((diff > atol + rtol * e64.abs()).any())
    return err, bad
