"""NaN, +-inf, -0.0 and huge values through a compiled sample, against eager.

A sample that passed is run again once per kind of special value (``NONFINITE_KINDS``)
written into its first floating input (``nonfinite_inputs``); ``probe_nonfinite`` says how
the backend's outputs then differ from eager's. A NaN that vanishes or appears fails the
sample; the other kinds are reported (docs/robustness.md, "Non-finite values").
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Sequence
from typing import Optional

import torch
import torch.fx

from ..ops import is_quantize, op_name, reads_floating
from ..run.checks.verify import compare
from .sampling import quiet_warnings

log = logging.getLogger(__name__)


#: The special values ``nonfinite_inputs`` writes, by kind.
NONFINITE_KINDS = ("nan", "inf", "zero", "huge")


def _specials(kind: str, dtype: torch.dtype) -> list[float]:
    if kind == "nan":
        return [math.nan]
    if kind == "inf":
        return [math.inf, -math.inf]
    if kind == "zero":
        return [-0.0]
    huge = float(torch.finfo(dtype).max) / 4
    return [huge, -huge]


def nonfinite_inputs(inputs: Sequence[torch.Tensor],
                     kinds: Sequence[str] = NONFINITE_KINDS,
                     first_only: bool = False) -> Optional[list]:
    """Copies of ``inputs`` whose floating tensors hold special values of ``kinds``: NaN,
    +-inf, -0.0, and huge values of both signs (a quarter of the dtype's largest),
    spread over the elements (so that a reduction's rows get different ones) and
    shifted from one input to the next (so that a binary op meets NaN against a
    number); None when no input gets any. ``first_only``: only the first floating
    tensor (an OpInfo sample's input, not its weights). Deterministic."""
    out, changed = [], False
    for i, t in enumerate(inputs):
        t = t.clone()
        if t.is_floating_point() and t.numel() and not (first_only and changed):
            specials = [v for k in kinds for v in _specials(k, t.dtype)]
            r = i % len(specials)
            specials = specials[r:] + specials[:r]
            n = t.numel()
            step = max(1, n // len(specials))
            flat = t.detach().flatten().clone()
            for k, v in enumerate(specials[:n]):
                flat[(k * step + i) % n] = v
            with torch.no_grad():
                t.copy_(flat.view(t.shape))
            changed = True
        out.append(t)
    return out if changed else None


def probe_nonfinite(fn: Callable, gm: torch.fx.GraphModule, inputs: Sequence[torch.Tensor],
                    tolerances: Optional[dict] = None,
                    ignore: Collection[int] = ()) -> dict[str, str]:
    """{kind: how ``fn`` (the backend's compiled ``gm``) differs from eager} when its
    first floating input (the op's input, not its weights: a NaN weight at a padded
    position is NaN in eager's convolution only) holds values of that kind
    (``NONFINITE_KINDS``: NaN, +-inf, -0.0, huge; one kind at a time, so the reason says
    which); empty when it does not. Eager failing on
    them, or the backend raising, is not judged: a raise is loud at run time too (the
    piece falls back); only a silent difference is (OpenVINO's exp(NaN) is inf,
    maximum(NaN, 0) is 0: eager says NaN). Float -> integer conversions are not judged:
    undefined for such values in eager too. ``ignore``: output positions left out (found
    wrong on finite inputs already: a training forward's saved outputs)."""
    if _converts_float_to_int(gm):
        return {}
    found: dict[str, str] = {}
    for kind in NONFINITE_KINDS:
        special = nonfinite_inputs(inputs, (kind,), first_only=True)
        if special is None:
            return {}
        try:
            with quiet_warnings():
                expected = list(gm(*[t.clone() for t in special]))
        except Exception:  # noqa: BLE001 - eager refuses such inputs: nothing to compare
            continue
        try:
            with quiet_warnings():
                got = list(fn(*[t.clone() for t in special]))
        except Exception:  # noqa: BLE001 - loud at run time too
            log.debug("non-finite inputs: the backend raised", exc_info=True)
            continue
        if len(expected) == len(got):  # ignored outputs: eager's own, positions kept
            got = [e if k in ignore else g for k, (e, g) in enumerate(zip(expected, got))]
        cmp = compare(expected, got, tolerances)
        if not cmp.ok:
            found[kind] = f"with {_KIND_NAMES[kind]} inputs: {cmp.detail}"
    return found


_KIND_NAMES = {"nan": "NaN", "inf": "+-inf", "zero": "-0.0", "huge": "huge"}


def _converts_float_to_int(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` casts floats to integers (a conversion, or a quantize op)."""
    for n in gm.graph.nodes:
        if is_quantize(n) and reads_floating(n):
            return True
        val = n.meta.get("val")
        if isinstance(n.target, torch._ops.OpOverload) and isinstance(val, torch.Tensor) \
                and not val.is_floating_point() and not val.is_complex() \
                and val.dtype != torch.bool and reads_floating(n) \
                and op_name(n.target).split(".")[1] in ("_to_copy", "to", "convert_element_type"):
            return True
    return False
