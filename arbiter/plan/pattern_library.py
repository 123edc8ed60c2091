"""Named patterns that matter in transformers, for manifests' ``patterns:`` to claim.

Each is a function of tensors, the shapes it is traced with (patterns.py), a ``check`` of
a match (its literals, eps, dims, scale, alpha, are wildcards when matching, so ``check``
refuses, with the reason, a match that does not mean what the pattern means) and the
``params`` a kernel reads from the matched nodes (eps, scale, the GELU approximation).

* ``rms_norm``: ``F.rms_norm(x, (C,), w, eps)``: y, as x's dtype (16-bit inputs are
  computed in float32 and cast back, as eager does).
* ``add_layer_norm``: ``s = x + r; y = F.layer_norm(s, (C,), w, b, eps)``: (y, s); w and
  b may be None.
* ``bias_gelu``: ``F.gelu(x + b)``, b a bias over the last dim (exact or tanh GELU).
* ``scale_mask_softmax``: ``softmax(x * scale + mask, -1)``, attention's scores with an
  additive mask broadcast to x (rank <= 4).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.fx
import torch.nn.functional as F

aten = torch.ops.aten


@dataclass(frozen=True)
class LibraryPattern:
    name: str
    fn: Callable
    shapes: tuple[tuple[int, ...], ...]
    check: Callable[[Any], Optional[str]]
    params: Callable[[Any], dict]


# -- helpers reading a match (arbiter.plan.patterns.Match) ---------------------------------
def _arg(node: torch.fx.Node, name: str) -> Any:
    """Argument ``name`` of an ATen node, positional, keyword or the schema's default."""
    schema = node.target._schema
    for i, a in enumerate(schema.arguments):
        if a.name == name:
            if a.name in node.kwargs:
                return node.kwargs[a.name]
            if not a.kwarg_only and i < len(node.args):
                return node.args[i]
            return a.default_value
    raise KeyError(name)


def _val(x: Any) -> Any:
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else x


def _tensor(x: Any) -> Optional[torch.Tensor]:
    v = _val(x)
    return v if isinstance(v, torch.Tensor) else None


def _last_dim(dims: Any, rank: int) -> bool:
    return isinstance(dims, (list, tuple)) and len(dims) == 1 and dims[0] in (-1, rank - 1)


def _unit_alpha(m: Any) -> Optional[str]:
    for n in m.find(aten.add.Tensor):
        if _arg(n, "alpha") not in (1, None):
            return f"add with alpha={_arg(n, 'alpha')}"
    return None


def _vector_of(t: Optional[torch.Tensor], cols: int) -> bool:
    return t is not None and t.dim() == 1 and t.shape[0] == cols


def _casts_ok(m: Any, out: torch.Tensor) -> Optional[str]:
    """The float16/bfloat16 form: x cast to float32 in, the result cast back to x's dtype."""
    casts = m.find(aten._to_copy.default)
    if not casts:
        return None
    first, last = _arg(casts[0], "dtype"), _arg(casts[-1], "dtype")
    if len(casts) != 2 or first is not torch.float32 or last is not out.dtype:
        return "casts other than float32 and back to the input's dtype"
    return None


# -- rms_norm ------------------------------------------------------------------------------
def rms_norm(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, 1e-6)


def _rms_check(m) -> Optional[str]:
    x, w = _tensor(m.inputs[0]), _tensor(m.inputs[1])
    out = _tensor(m.outputs[0])
    if x is None or out is None:
        return "x is not a tensor"
    if not _vector_of(w, x.shape[-1]):
        return "the weight is not a vector over the last dim"
    (pw,), (mean,) = m.find(aten.pow.Tensor_Scalar), m.find(aten.mean.dim)
    if _arg(pw, "exponent") != 2:
        return f"pow exponent {_arg(pw, 'exponent')} is not 2"
    if not _last_dim(_arg(mean, "dim"), x.dim()) or _arg(mean, "keepdim") is not True:
        return "the mean is not over the last dim with keepdim"
    if not isinstance(_arg(m.find(aten.add.Scalar)[0], "other"), (int, float)):
        return "eps is not a number"
    return _casts_ok(m, out)


def _rms_params(m) -> dict:
    return {"eps": float(_arg(m.find(aten.add.Scalar)[0], "other"))}


# -- add_layer_norm --------------------------------------------------------------------------
def add_layer_norm(x, r, w, b):
    s = x + r
    return F.layer_norm(s, (s.shape[-1],), w, b, 1e-5), s


def _aln_check(m) -> Optional[str]:
    x, r = _tensor(m.inputs[0]), _tensor(m.inputs[1])
    if x is None or r is None or x.shape != r.shape or x.dtype != r.dtype:
        return "x and the residual are not tensors of one shape and dtype"
    cols = x.shape[-1] if x.dim() else 0
    (ln,) = m.find(aten.native_layer_norm.default)
    if list(_arg(ln, "normalized_shape")) != [cols]:
        return f"normalized over {list(_arg(ln, 'normalized_shape'))}, not the last dim"
    for k, what in ((2, "weight"), (3, "bias")):
        v = m.inputs[k]
        if v is not None and not _vector_of(_tensor(v), cols):
            return f"the {what} is not a vector over the last dim"
    if not isinstance(_arg(ln, "eps"), (int, float)):
        return "eps is not a number"
    return _unit_alpha(m)


def _aln_params(m) -> dict:
    return {"eps": float(_arg(m.find(aten.native_layer_norm.default)[0], "eps"))}


# -- bias_gelu -------------------------------------------------------------------------------
def bias_gelu(x, b):
    return F.gelu(x + b)


def _bias_side(m) -> Optional[int]:
    """Which input of the add is the bias (0 or 1), or None."""
    a, b = _tensor(m.inputs[0]), _tensor(m.inputs[1])
    out = _tensor(m.outputs[0])
    if a is None or b is None or out is None or out.dim() == 0:
        return None
    for side, (full, bias) in enumerate(((a, b), (b, a))):
        if full.shape == out.shape and _vector_of(bias, out.shape[-1]) \
                and full.dtype == bias.dtype == out.dtype:
            return 1 - side
    return None


def _bg_check(m) -> Optional[str]:
    if _bias_side(m) is None:
        return "not a tensor plus a bias vector over its last dim, of one dtype"
    approx = _arg(m.find(aten.gelu.default)[0], "approximate")
    if approx not in ("none", "tanh"):
        return f"gelu approximate={approx!r}"
    return _unit_alpha(m)


def _bg_params(m) -> dict:
    return {"approximate": _arg(m.find(aten.gelu.default)[0], "approximate"),
            "bias_first": _bias_side(m) == 0}


# -- scale_mask_softmax ------------------------------------------------------------------
def scale_mask_softmax(x, mask):
    return torch.softmax(x * 0.125 + mask, -1)


def _sms_check(m) -> Optional[str]:
    x, mask = _tensor(m.inputs[0]), _tensor(m.inputs[1])
    out = _tensor(m.outputs[0])
    if x is None or mask is None or out is None:
        return "x or the mask is not a tensor"
    if not 1 <= x.dim() <= 4 or mask.dim() > x.dim():
        return f"rank {x.dim()} scores or a mask of higher rank (1 to 4 supported)"
    try:
        shape = torch.broadcast_shapes(x.shape, mask.shape)
    except RuntimeError:
        return "the mask does not broadcast to the scores"
    if tuple(shape) != tuple(x.shape) or not (x.dtype == mask.dtype == out.dtype):
        return "the mask does not broadcast to the scores' shape and dtype"
    (mul,) = m.find(aten.mul.Tensor)
    if mul.args[0] is not m.inputs[0] or not isinstance(mul.args[1], (int, float)) \
            or isinstance(mul.args[1], bool):
        return "the scale is not a number multiplying the scores"
    (sm,) = m.find(aten._softmax.default)
    if _arg(sm, "dim") not in (-1, x.dim() - 1) or _arg(sm, "half_to_float"):
        return "softmax not over the last dim (or half_to_float)"
    return _unit_alpha(m)


def _sms_params(m) -> dict:
    return {"scale": float(m.find(aten.mul.Tensor)[0].args[1])}


PATTERNS: dict[str, LibraryPattern] = {p.name: p for p in (
    LibraryPattern("rms_norm", rms_norm, ((2, 3, 8), (8,)), _rms_check, _rms_params),
    LibraryPattern("add_layer_norm", add_layer_norm, ((2, 3, 8), (2, 3, 8), (8,), (8,)),
                   _aln_check, _aln_params),
    LibraryPattern("bias_gelu", bias_gelu, ((2, 3, 8), (8,)), _bg_check, _bg_params),
    LibraryPattern("scale_mask_softmax", scale_mask_softmax, ((2, 3, 8), (2, 3, 8)),
                   _sms_check, _sms_params),
)}
