"""The ONNX export shared by ONNX Runtime and TensorRT, and what it computes unlike eager.

A partition is translated by PyTorch's own exporter (``torch.onnx.export(...,
dynamo=True)``, onnxscript's ATen library "torchlib"); ``export_onnx`` builds the
exporter's registry once per process (``_registry_once``) and hands the exporter the
translations of ``translations()`` in place of torchlib's (floating ``remainder``, as
ATen computes it: fmod and a sign fix-up); ``declared_ops`` lists the ATen ops it
translates, and PT2E's quantize/dequantize (QuantizeLinear, DequantizeLinear). What the
export gets wrong and no translation fixes is refused by ``EXPORT_VALIDATORS`` (training
batch norm, an embedding bag's auxiliary outputs, a mean over an empty extent, integer
division with a rounding mode, scatter_reduce's mean, logcumsumexp, a quantize to less
than its dtype's range), which both backends apply; docs/robustness.md ("Edge values")
gives each cause. ``EXPORT_REVISION`` changes whenever what the export produces changes: it keys
every cached ONNX model, so a model exported before a fix is not reused.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch

from arbiter.ops import declared_overloads, register_namespaces
from arbiter.plan.capability import used_outputs

from ._edge_values import MEANS, argument, empty_reduction
from ._export import export_program, quiet
from ._onnx_constants import refer_constants

#: Part of the cache key of every exported model (see the module docstring).
EXPORT_REVISION = 2


# -- translations ------------------------------------------------------------------------
def _translations() -> dict:
    """{ATen overload: onnxscript function} for ``custom_translation_table``; built on
    first use (onnxscript is imported only by an export)."""
    from onnxscript import ir
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.tensor_typing import TTensor

    def remainder(self: TTensor, other: TTensor) -> TTensor:
        if not self.dtype.is_floating_point():
            return op.Mod(self, other)  # Python's modulo, as eager's (torchlib's)
        narrow = self.dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
        a, b = (op.Cast(self, to=ir.DataType.FLOAT), op.Cast(other, to=ir.DataType.FLOAT)) \
            if narrow else (self, other)
        mod = op.Mod(a, b, fmod=1)
        zero = op.CastLike(0, mod)
        signs_differ = op.Xor(op.Less(mod, zero), op.Less(b, zero))
        adjust = op.And(signs_differ, op.Not(op.Equal(mod, zero)))
        out = op.Where(adjust, op.Add(mod, b), mod)
        return op.CastLike(out, self) if narrow else out

    def remainder_scalar(self: TTensor, other: float) -> TTensor:
        return remainder(self, ir.tensor(other, dtype=self.dtype))

    def remainder_scalar_tensor(self: float, other: TTensor) -> TTensor:
        return remainder(ir.tensor(self, dtype=other.dtype), other)

    aten = torch.ops.aten
    return {aten.remainder.Tensor: remainder, aten.remainder.Scalar: remainder_scalar,
            aten.remainder.Scalar_Tensor: remainder_scalar_tensor}


_TRANSLATIONS: Optional[dict] = None


def translations() -> dict:
    """The export's own translations (see the module docstring), built once."""
    global _TRANSLATIONS
    if _TRANSLATIONS is None:
        _TRANSLATIONS = _translations()
    return _TRANSLATIONS


# -- the export ---------------------------------------------------------------------------
#: (class, from_torchlib's arguments, ops registered with torch) -> the registry built
_REGISTRIES: dict = {}


@contextlib.contextmanager
def _registry_once():
    """``torch.onnx.export`` builds its registry of ATen -> ONNX translations afresh on
    every call (about 1 s: onnxscript's torchlib walked, every op looked up), and arbiter
    exports once per partition and per candidate. Within this block the registry is built
    once per process and every export gets its own copy of it (a dict of lists: an
    exporter that adds custom translations changes only its copy). Key: the arguments and
    the number of operators registered with torch (a library loaded since, with ops
    torchlib translates, gets a new registry, as it would have). Where the registry holds
    more than the two fields copied (another torch), nothing is cached."""
    try:
        from torch.onnx._internal.exporter import _registration
        real = _registration.ONNXRegistry.__dict__["from_torchlib"]
        # another thread's export inside this block (a compile left running past
        # compile_timeout_s): restore torch's own method, not that thread's stand-in
        real = getattr(real.__func__, "_arbiter_real", real)
        build = real.__func__
    except Exception:  # noqa: BLE001 - another torch: its own registry every time
        yield
        return
    ops = len(torch._C._dispatch_get_all_op_names())

    def from_torchlib(cls, *args, **kwargs):
        key = (cls, args, tuple(sorted(kwargs.items())), ops)
        base = _REGISTRIES.get(key)
        if base is None:
            base = build(cls, *args, **kwargs)
            if set(vars(base)) != {"_opset_version", "functions"}:
                return base
            _REGISTRIES.clear()  # one kept: the ops count only grows
            _REGISTRIES[key] = base
        copy = cls.__new__(cls)
        copy._opset_version = base._opset_version
        copy.functions = {k: list(v) for k, v in base.functions.items()}
        return copy

    from_torchlib._arbiter_real = real
    _registration.ONNXRegistry.from_torchlib = classmethod(from_torchlib)
    try:
        yield
    finally:
        _registration.ONNXRegistry.from_torchlib = real


def export_onnx(gm: torch.fx.GraphModule, args: tuple, optimize: bool = True,
                dynamic: bool = False, by_reference: bool = False):
    """An ATen FX graph -> onnx.ModelProto, through torch.onnx's dynamo exporter with the
    translations above; ``dynamic``: symbolic dimensions from the graph's symbols
    (backends/_export.py); ``by_reference``: the initializers that are ``gm``'s
    constants refer to them instead of holding a copy (backends/_onnx_constants.py)."""
    with quiet(), _registry_once():
        # non-strict only (backends/_export.py); torch.onnx.export's own fallback to
        # strict export would run Dynamo inside the user's compiled call
        exported = export_program(gm, args, dynamic=dynamic)
        program = torch.onnx.export(exported, args, dynamo=True, optimize=optimize,
                                    verbose=False, report=False,
                                    custom_translation_table=translations())
    if by_reference:
        refer_constants(program.model, gm)
    return program.model_proto


def declared_ops() -> dict:
    """Ops PyTorch's ONNX exporter translates (onnxscript's torchlib): ATen's, and PT2E's
    quantize/dequantize (QuantizeLinear, DequantizeLinear); the ops ONNX Runtime and
    TensorRT declare (``Backend.declared_ops``)."""
    from torch.onnx._internal.exporter import _registration

    register_namespaces()  # the registry translates only the ops torch has now
    with quiet():
        registry = _registration.ONNXRegistry.from_torchlib()
    out = {}
    for key in registry.functions:
        if not isinstance(key, str) or "::" not in key:
            continue
        namespace, _, rest = key.partition("::")
        base, _, overload = rest.partition(".")
        for op in declared_overloads(namespace, base, overload):
            out[op] = {}
    return out


# -- what the export gets wrong: refused -------------------------------------------------
def _batch_norm_training(node) -> Optional[str]:
    # The exporter translates training-mode batch norm with ONNX's BatchNormalization,
    # which normalizes with the running statistics: measured wrong by 0.24 on the small CNN.
    if argument(node, "training", False):
        return "training-mode batch norm (batch statistics) is exported with running statistics"
    return None


_BAG_OUTPUTS = {1: "offset2bag", 2: "bag_size", 3: "max_indices"}


def _embedding_bag(node) -> Optional[str]:
    """torchlib computes an embedding bag's result (output 0) right, but returns its
    other outputs as zeros of the right shape, "only the shape" (onnxscript 0.7.2),
    where eager computes them and the backward reads them (mean and max: error 3.8 and
    7.7 on the weight's gradient). Measured against eager (CPU), every mode, offsets
    with an empty bag, include_last_offset, per_sample_weights, padding_idx:

    * mean and max: offset2bag, bag_size and max_indices are all wrong;
    * sum: eager's bag_size and max_indices are zeros too; its offset2bag is empty on
      its fast path (as the export's) and filled otherwise (padding_idx, float64),
      where the export's zeros are wrong; with include_last_offset the export's
      bag_size and max_indices have one element too many (the run fails: loud).

    Refused when a node reads one of those wrong outputs (a training graph's forward
    returns them for the backward); inference graphs read output 0 only."""
    used = used_outputs(node) - {0}
    if not used:
        return None
    mode = argument(node, "mode", 0)
    if mode == 0:
        val = node.meta.get("val")
        wrong = set()
        if 1 in used and isinstance(val, (tuple, list)) and \
                tuple(val[1].shape) != (0,):
            wrong.add(1)
        if argument(node, "include_last_offset", False):
            wrong |= used & {2, 3}
        if not wrong:
            return None
    else:
        wrong = used
    names = ", ".join(f"{k} ({_BAG_OUTPUTS[k]})" for k in sorted(wrong))
    return (f"output{'s' if len(wrong) > 1 else ''} {names} read here, and the ONNX "
            f"export returns {'them' if len(wrong) > 1 else 'it'} as zeros where eager "
            f"computes {'them' if len(wrong) > 1 else 'it'} (the backward reads "
            f"{'them' if len(wrong) > 1 else 'it'}: wrong weight gradients)")


def _integer_division(node) -> Optional[str]:
    # torchlib divides integers with a rounding mode in float32 (Cast, Div, Floor or
    # Trunc, Cast back): exact only below 2**24 ((2**53 + 1) // 3 was off by 9e7)
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and not val.is_floating_point() and \
            argument(node, "rounding_mode") is not None:
        return ("integer division with a rounding mode: the ONNX export divides in "
                "float32 (exact below 2**24 only)")
    return None


def _scatter_mean(node) -> Optional[str]:
    # torchlib exports scatter_reduce(reduce="mean") as ScatterElements with reduction
    # "none": the last write wins, no mean (off by 1.95 against eager; sum, prod, amax and
    # amin, with include_self or not, are eager-equal: measured on ONNX Runtime, CPU).
    # The probe's sum sample credited the op's dtype (tests/test_corpus.py found it).
    if argument(node, "reduce") == "mean":
        return ("scatter_reduce with reduce='mean': the ONNX export keeps the last write "
                "(ScatterElements reduction 'none'), not the mean")
    return None


def _logcumsumexp(node) -> Optional[str]:
    # torchlib computes log(cumsum(exp(x - rowmax))) + rowmax: a prefix more than ~88
    # below its row's maximum underflows to log(0) = -inf where eager is finite (and the
    # backward's gradients become NaN). The probe's samples are of ordinary range and
    # pass; the values a graph will see are unknown when it is planned.
    return ("logcumsumexp: the ONNX export shifts by the row's maximum, so a prefix far "
            "below it (about 88 in float32) becomes -inf where eager is finite")


def _narrow_quantize(node) -> Optional[str]:
    # torchlib exports quantize_per_tensor as QuantizeLinear alone, which saturates to its
    # dtype's whole range; eager clamps to quant_min..quant_max (quantize_per_channel's
    # export adds the Clip)
    lo, hi, dtype = argument(node, "quant_min"), argument(node, "quant_max"), \
        argument(node, "dtype")
    if isinstance(dtype, torch.dtype) and not dtype.is_floating_point and \
            (lo, hi) != (torch.iinfo(dtype).min, torch.iinfo(dtype).max):
        return (f"quantize to {lo}..{hi}, not all of {str(dtype).removeprefix('torch.')}: "
                "the ONNX export's QuantizeLinear saturates to the dtype's range")
    return None


_EMPTY_MEAN = empty_reduction("ONNX leaves it undefined, ONNX Runtime")

#: Validators of the nodes the export computes unlike eager (see the module docstring).
EXPORT_VALIDATORS = {
    "aten._native_batch_norm_legit_functional": _batch_norm_training,
    "aten._native_batch_norm_legit": _batch_norm_training,
    "aten.native_batch_norm": _batch_norm_training,
    "aten._batch_norm_with_update_functional": _batch_norm_training,
    "aten.batch_norm": _batch_norm_training,
    "aten._embedding_bag": _embedding_bag,
    "aten._embedding_bag_forward_only": _embedding_bag,
    "aten.embedding_bag": _embedding_bag,
    **{name: _EMPTY_MEAN for name in MEANS},
    "aten.div.Tensor_mode": _integer_division, "aten.div.Scalar_mode": _integer_division,
    "aten.scatter_reduce": _scatter_mean, "aten.scatter_reduce_": _scatter_mean,
    "aten.logcumsumexp": _logcumsumexp,
    "quantized_decomposed.quantize_per_tensor": _narrow_quantize,
}
