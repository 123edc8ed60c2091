"""What OpenVINO (2026.4, CPU plugin) computes unlike eager on finite values, refused.

The OpenVINO backend's validators refuse these whatever its ``exact_nonfinite`` says
(the NaN and inf differences are its ``_NONFINITE`` table, backends/openvino.py). Each
was measured (docs/robustness.md, "Edge values").
"""
from __future__ import annotations

from typing import Optional

import torch

from arbiter.ops import is_dequantize
from arbiter.plan.capability import used_outputs

from ._edge_values import MEANS, POWS, VARIANCES, Validator, argument, empty_reduction, \
    integer_pow
from ._openvino_convert import of_codes


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


def _floating_remainder(node) -> Optional[str]:
    # OpenVINO computes remainder and fmod through a quotient (a - floor(a / b) * b,
    # a - trunc(a / b) * b), which loses the remainder once a / b outgrows the mantissa:
    # 1e8 % 3 is 0 in float32, eager (an exact fmod, then the sign) says 1.
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and val.is_floating_point():
        return ("floating remainder/fmod through a quotient (a - floor(a / b) * b): "
                "wrong once |a / b| outgrows the mantissa (1e8 % 3 is 0, eager 1)")
    return None


def _embedding_bag(node) -> Optional[str]:
    # Measured against eager (every mode, offsets with an empty bag, include_last_offset,
    # per_sample_weights, padding_idx): the frontend ignores padding_idx (the padded rows
    # are summed: error 4.6 on the result); it converts only output 0 (with offset2bag,
    # bag_size or max_indices returned, conversion fails); max mode and
    # include_last_offset do not convert either (loud, left to fail).
    if argument(node, "padding_idx", -1) not in (None, -1):
        return "embedding_bag with padding_idx: OpenVINO counts the padded rows"
    used = used_outputs(node) - {0}
    if used:
        return (f"embedding_bag outputs {sorted(used)} (offset2bag, bag_size, max_indices) "
                "are read here: OpenVINO converts only output 0")
    return None


def _first_of(*checks: Validator) -> Validator:
    """A validator giving the first refusal of ``checks``."""
    def check(node) -> Optional[str]:
        for c in checks:
            why = c(node)
            if why is not None:
                return why
        return None
    return check


_EMPTY = empty_reduction("OpenVINO")
_POW = integer_pow("OpenVINO's CPU plugin computes integers in 32 bits (3**39 is "
                   "-2147483647)")

def _quantize_into_dequantize(node) -> Optional[str]:
    """OpenVINO's frontend makes a quantize and the dequantize reading it one FakeQuantize:
    a quantize whose integer codes leave it otherwise fails at run ("infer_request"),
    found by ``arbiter probe openvino --ops quantized_decomposed``."""
    if node.users and all(is_dequantize(u) for u in node.users):
        return None
    return "a quantize runs only into dequantize nodes (OpenVINO makes the pair a FakeQuantize)"


def _dequantize_of_quantized(node) -> Optional[str]:
    """A dequantize of the quantize before it is half of a FakeQuantize. Any other (a
    constant int8 weight, PT2E's; codes read from an input) the frontend skipped, handing
    the codes on undequantized: they become eager's arithmetic before conversion
    (``_openvino_convert._dequantize_codes``), in float32 only."""
    if not of_codes(node):
        return None
    if node.kwargs.get("out_dtype") not in (None, torch.float32):
        return "a dequantize of integer codes to other than float32"
    scales = node.args[1] if len(node.args) > 1 else None
    val = scales.meta.get("val") if isinstance(scales, torch.fx.Node) else None
    if val is not None and val.dtype != torch.float32:
        return (f"a dequantize of integer codes with {val.dtype} scales (its arithmetic "
                "is written for float32 scales)")
    return None


VALIDATORS = {
    "aten.cat.default": _cat_of_legacy_empty, "aten.concat.default": _cat_of_legacy_empty,
    "aten.concatenate.default": _cat_of_legacy_empty,
    **{name: _EMPTY for name in MEANS},
    **{name: _first_of(_full_variance, _EMPTY) for name in VARIANCES},
    **{name: _POW for name in POWS},
    "aten.remainder": _floating_remainder, "aten.fmod": _floating_remainder,
    "aten._embedding_bag": _embedding_bag, "aten._embedding_bag_forward_only": _embedding_bag,
    "aten.embedding_bag": _embedding_bag,
    **{f"quantized_decomposed.quantize_per_{k}": _quantize_into_dequantize
       for k in ("tensor", "channel")},
    **{f"quantized_decomposed.dequantize_per_{k}": _dequantize_of_quantized
       for k in ("tensor", "channel")},
}
