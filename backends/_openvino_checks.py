"""What OpenVINO (2026.4, CPU plugin) computes unlike eager on finite values, refused by
the OpenVINO backend's validators whatever its ``exact_nonfinite`` says (the NaN and inf
differences are its ``_NONFINITE`` table, backends/openvino.py). Each was measured.
"""
from __future__ import annotations

from typing import Optional

import torch


def _cat_of_legacy_empty(node) -> Optional[str]:
    # torch.cat skips 1-D empty tensors whatever the other inputs' rank (a legacy rule
    # transformers' DynamicCache relies on: GPT-2's first key/value cat); OpenVINO's
    # Concat rejects them: "Axis -2 out of the tensor rank range [-1, 0]".
    tensors = node.args[0] if node.args else node.kwargs.get("tensors", ())
    vals = [t.meta.get("val") if isinstance(t, torch.fx.Node) else None for t in tensors]
    ranks = {v.dim() for v in vals if isinstance(v, torch.Tensor)}
    if len(ranks) > 1 and any(isinstance(v, torch.Tensor) and tuple(v.shape) == (0,)
                              for v in vals):
        return "cat of a 1-D empty tensor with tensors of higher rank (OpenVINO's Concat rejects it)"
    return None


def _full_variance(node) -> Optional[str]:
    # Measured (openvino 2026.4, `arbiter probe openvino --ops var std`): a variance over
    # every dimension with a correction is wrong (error 0.007 on a 5x5x5 tensor, 0.195 on
    # OpInfo's sample); over given dimensions, and with correction 0, it is right.
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    correction = node.kwargs.get("correction", 1)
    if dim in (None, []) and correction != 0:
        return "variance over all dimensions with a correction is computed wrongly"
    return None


VALIDATORS = {
    "aten.cat.default": _cat_of_legacy_empty, "aten.concat.default": _cat_of_legacy_empty,
    "aten.concatenate.default": _cat_of_legacy_empty,
    "aten.var.correction": _full_variance, "aten.std.correction": _full_variance,
    "aten.var_mean.correction": _full_variance,
}
