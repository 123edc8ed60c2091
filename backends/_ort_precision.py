"""ONNX Runtime's lower precisions (docs/precision.md): its variants, and the conversions.

Which variants the providers' kernels make worth offering, and a float32 ONNX model
converted to float16 or dynamically quantized to int8.
"""
from __future__ import annotations

import contextlib
import functools
import logging
from pathlib import Path

from ._export import quiet

log = logging.getLogger("arbiter.backends.onnxruntime")  # the backend's own log

#: ONNX ops whose float16 kernels make a float16 model worth running (the heavy ones)
_FP16_COMPUTE = ("MatMul", "Gemm")
#: ONNX ops dynamic int8 quantization turns MatMul/Gemm into
_INT8_OPS = ("MatMulInteger", "DynamicQuantizeMatMul")


def kernel_types(providers: list[str]) -> dict[str, set[str]]:
    """{op type: tensor types} of the kernels the providers register (default ONNX and
    com.microsoft domains), from onnxruntime's own kernel registry."""
    from onnxruntime.capi import _pybind_state as C

    out: dict[str, set[str]] = {}
    for d in C.get_all_opkernel_def():
        if d.provider in providers:
            types = out.setdefault(d.op_name, set())
            for allowed in d.type_constraints.values():
                types.update(allowed)
    return out


def fp16_converter():
    """onnxruntime's float16 converter, else onnxconverter-common's; None without both."""
    try:
        from onnxruntime.transformers.float16 import convert_float_to_float16
        return convert_float_to_float16
    except ImportError:
        pass
    try:
        from onnxconverter_common.float16 import convert_float_to_float16
        return convert_float_to_float16
    except ImportError:
        return None


def variant_support(label: str, providers: list[str], native: bool = True) -> str:
    """Why variant ``label`` cannot be offered with these providers ("" when it can);
    ``native``: also require the providers' kernels to compute it (see OrtOptions)."""
    try:
        kernels = kernel_types(providers)
    except Exception as exc:  # noqa: BLE001 - an onnxruntime without the registry
        return f"onnxruntime's kernel registry is not readable ({type(exc).__name__})"
    if label == "fp16":
        if fp16_converter() is None:
            return ("no float16 converter (onnxruntime.transformers.float16 or "
                    "onnxconverter-common)")
        if native and not any("tensor(float16)" in kernels.get(op, ())
                              for op in _FP16_COMPUTE):
            return (f"providers {', '.join(providers)} have no float16 MatMul or Gemm "
                    "kernel (float16 would run float32 kernels between casts: slower)")
        return ""
    try:
        import onnxruntime.quantization  # noqa: F401
    except ImportError as exc:
        return f"onnxruntime.quantization is not importable ({exc})"
    if not any(op in kernels for op in _INT8_OPS):
        return f"providers {', '.join(providers)} have no MatMulInteger kernel"
    return ""


def to_fp16(model, providers: list[str]):
    """float16 for the ops the providers have a float16 kernel for; other ops, and the
    converter's own block list, stay float32 between casts (the converter's)."""
    convert = fp16_converter()
    if convert is None:
        raise RuntimeError("precision fp16: " + variant_support("fp16", providers, False))
    kernels = kernel_types(providers)
    ops = {n.op_type for n in model.graph.node}
    block = sorted(op for op in ops if "tensor(float16)" not in kernels.get(op, ()))
    try:
        from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST
        block = sorted(set(block) | set(DEFAULT_OP_BLOCK_LIST))
    except ImportError:
        pass
    log.debug("fp16: ops kept float32 (no float16 kernel): %s", ", ".join(block))
    with quiet():
        return convert(model, keep_io_types=True, op_block_list=block)


NO_CONSTANT_WEIGHTS = (
    "precision int8: nothing to quantize ({what}): dynamic quantization quantizes "
    "constant weights only, and this partition's weights are inputs. Weights are "
    "constants in inference graphs with `freeze_weights: true` (the default)")


def to_int8(model, per_channel: bool):
    """Dynamic quantization of the MatMul/Gemm nodes whose weights are constants."""
    import os
    import tempfile

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    inits = {i.name for i in model.graph.initializer}
    inits |= {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    mms = [n for n in model.graph.node if n.op_type in ("MatMul", "Gemm")]
    if not any(len(n.input) > 1 and n.input[1] in inits for n in mms):
        raise RuntimeError(NO_CONSTANT_WEIGHTS.format(
            what=f"none of its {len(mms)} MatMul/Gemm has an initializer as weights"))
    with tempfile.TemporaryDirectory(prefix="arbiter-int8-") as tmp, quiet(), \
            _no_root_warnings():
        out = os.path.join(tmp, "int8.onnx")
        # Without VNNI (AVX2 only) the u8 x s8 kernels add pairs of products in int16,
        # which saturates: 7-bit weights avoid it (onnxruntime.quantization's
        # reduce_range). Seen here on an AVX2-only AMD EPYC: error 0.21 against 0.03.
        quantize_dynamic(model, out, op_types_to_quantize=["MatMul", "Gemm"],
                         per_channel=per_channel, weight_type=QuantType.QInt8,
                         reduce_range=not _has_vnni())
        quantized = onnx.load(out)
    if not any(n.op_type in _INT8_OPS for n in quantized.graph.node):
        raise RuntimeError("precision int8: quantize_dynamic quantized no MatMul/Gemm")
    return quantized


@functools.lru_cache(maxsize=None)
def _has_vnni() -> bool:
    """Whether this x86 CPU has VNNI (int8 dot products without int16 saturation);
    True elsewhere (ARM's int8 dot products do not saturate either)."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return True
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace").split()
    except OSError:
        return False  # unknown: 7-bit weights are safe everywhere
    return any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8"))


@contextlib.contextmanager
def _no_root_warnings():
    """onnxruntime.quantization logs its advice ("consider pre-processing") on the root
    logger: kept out of the user's way while it runs."""
    root = logging.getLogger()

    def drop(record: logging.LogRecord) -> bool:
        return "quantization" not in record.pathname

    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)
