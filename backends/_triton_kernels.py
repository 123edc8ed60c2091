"""Triton kernels for the pattern library's patterns (arbiter/plan/pattern_library.py).

``@triton.jit`` decides when it runs whether a kernel is compiled for the GPU or run by
Triton's interpreter (it reads ``TRITON_INTERPRET`` then), and so does ``triton.language``
for its own helpers (``tl.sum``...) when it is imported: the mode is the process's, fixed
when triton is first imported (Inductor imports it, even on CPU). The kernels are defined
lazily, on first use (``kernels()``), and ``mode()`` says which mode they get, or why
none works (the variable changed after ``triton.language`` was imported).

Every kernel computes in float32 and rounds where eager rounds (a float16 sum is stored
as float16 before it is normalized), one program per row for the row-wise ones (a row of
at most ``MAX_COLS`` elements in one block) and a 2-D grid for bias + GELU. Launchers take
and return torch tensors on the inputs' device, launch on torch's current stream (Triton's
default), and make inputs contiguous where they are not (a copy).
"""
from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Optional

import torch

#: the widest row the row-wise kernels take (one block per row)
MAX_COLS = 16384

_KERNELS: list[SimpleNamespace] = []
_LOCK = threading.Lock()


def mode() -> tuple[Optional[str], str]:
    """("interpreter" | the GPU backend ("cuda", "hip") | None, why or what)."""
    try:
        import triton
        import triton.language as tl
        from triton.runtime.jit import JITFunction
    except ImportError as exc:
        return None, f"triton is not installed ({exc})"
    interpret = bool(triton.knobs.runtime.interpret)
    if interpret == isinstance(tl.standard.sum, JITFunction):
        now, then = ("on", "off") if interpret else ("off", "on")
        return None, (f"TRITON_INTERPRET is {now} but was {then} when triton.language was "
                      "imported: set it before anything imports triton")
    if interpret:
        return "interpreter", (f"triton {triton.__version__} interpreter (TRITON_INTERPRET=1): "
                               "CPU tensors, 500-5000x slower than eager (for tests)")
    try:
        from triton.runtime import driver

        target = driver.active.get_current_target()
    except Exception as exc:  # noqa: BLE001 - "0 active drivers" without a GPU
        return None, (f"no GPU driver for triton {triton.__version__} "
                      f"({type(exc).__name__}: {str(exc)[:100]}); TRITON_INTERPRET=1, set "
                      "before triton is imported, runs its kernels in Triton's interpreter "
                      "on CPU tensors (slow: for tests)")
    return target.backend, f"triton {triton.__version__} on {target.backend}"


def kernels() -> SimpleNamespace:
    """The jitted kernels, defined on first use, in the process's mode (``mode()``)."""
    with _LOCK:
        if not _KERNELS:
            _KERNELS.append(_define())
        return _KERNELS[0]


def _define() -> SimpleNamespace:
    import triton
    import triton.language as tl

    @triton.jit
    def rms_norm(X, W, Y, C, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < C
        x = tl.load(X + row * C + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / C + eps)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + row * C + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def add_layer_norm(X, R, W, B, Y, S, C, eps, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                       BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < C
        s = (tl.load(X + row * C + cols, mask=mask, other=0.0).to(tl.float32)
             + tl.load(R + row * C + cols, mask=mask, other=0.0).to(tl.float32))
        s = s.to(S.dtype.element_ty)  # eager stores the sum in the inputs' dtype
        tl.store(S + row * C + cols, s, mask=mask)
        s = s.to(tl.float32)
        mean = tl.sum(s, axis=0) / C
        d = tl.where(mask, s - mean, 0.0)
        y = d * tl.rsqrt(tl.sum(d * d, axis=0) / C + eps)
        if HAS_W:
            y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_B:
            y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + row * C + cols, y.to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def bias_gelu(X, B, Y, C, TANH: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < C
        v = (tl.load(X + row * C + cols, mask=mask, other=0.0).to(tl.float32)
             + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32))
        v = v.to(Y.dtype.element_ty).to(tl.float32)  # eager rounds the sum
        if TANH:
            inner = 0.7978845608028654 * (v + 0.044715 * v * v * v)
            t = 2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0  # tanh(inner)
            y = 0.5 * v * (1.0 + t)
        else:
            y = 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))
        tl.store(Y + row * C + cols, y.to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def scale_mask_softmax(X, M, Y, C, D1, D2, ms0, ms1, ms2, ms3, scale,
                           BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        i2 = row % D2
        i1 = (row // D2) % D1
        i0 = row // (D2 * D1)
        cols = tl.arange(0, BLOCK)
        mask = cols < C
        x = tl.load(X + row * C + cols, mask=mask, other=0.0).to(tl.float32)
        m = tl.load(M + i0 * ms0 + i1 * ms1 + i2 * ms2 + cols * ms3, mask=mask,
                    other=0.0).to(tl.float32)
        z = (x * scale).to(Y.dtype.element_ty).to(tl.float32)  # eager rounds each step
        z = (z + m).to(Y.dtype.element_ty).to(tl.float32)
        z = tl.where(mask, z, -float("inf"))
        e = tl.where(mask, tl.exp(z - tl.max(z, axis=0)), 0.0)
        tl.store(Y + row * C + cols, (e / tl.sum(e, axis=0)).to(Y.dtype.element_ty),
                 mask=mask)

    return SimpleNamespace(triton=triton, rms_norm=rms_norm, add_layer_norm=add_layer_norm,
                           bias_gelu=bias_gelu, scale_mask_softmax=scale_mask_softmax)


# -- launchers: torch tensors in, torch tensors out ------------------------------------------
def _rows(x: torch.Tensor) -> tuple[int, int]:
    cols = x.shape[-1] if x.dim() else 1
    return (x.numel() // cols if cols else 0), cols


def _warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


def launch_rms_norm(x, w, *, eps: float, out_dtype: torch.dtype):
    k = kernels()
    x, w = x.contiguous(), w.contiguous()
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    rows, cols = _rows(x)
    if rows and cols:
        block = k.triton.next_power_of_2(cols)
        k.rms_norm[(rows,)](x, w, y, cols, eps, BLOCK=block, num_warps=_warps(block))
    return (y,)


def launch_add_layer_norm(x, r, w: Optional[torch.Tensor], b: Optional[torch.Tensor], *,
                          eps: float):
    k = kernels()
    x, r = x.contiguous(), r.contiguous()
    y = torch.empty_like(x)
    s = torch.empty_like(x)
    rows, cols = _rows(x)
    if rows and cols:
        block = k.triton.next_power_of_2(cols)
        k.add_layer_norm[(rows,)](
            x, r, w.contiguous() if w is not None else x, b.contiguous() if b is not None else x,
            y, s, cols, eps, HAS_W=w is not None, HAS_B=b is not None, BLOCK=block,
            num_warps=_warps(block))
    return y, s


def launch_bias_gelu(a, c, *, approximate: str, bias_first: bool):
    k = kernels()
    x, b = (c, a) if bias_first else (a, c)
    x, b = x.contiguous(), b.contiguous()
    y = torch.empty_like(x)
    rows, cols = _rows(x)
    if rows and cols:
        block = min(1024, k.triton.next_power_of_2(cols))
        grid = (rows, k.triton.cdiv(cols, block))
        k.bias_gelu[grid](x, b, y, cols, TANH=approximate == "tanh", BLOCK=block)
    return (y,)


def launch_scale_mask_softmax(x, mask, *, scale: float):
    k = kernels()
    x = x.contiguous()
    y = torch.empty_like(x)
    rows, cols = _rows(x)
    if rows and cols:
        shape4 = (1,) * (4 - x.dim()) + tuple(x.shape)
        # the mask broadcast to x by strides (0 along broadcast dims): no copy
        ms = mask.expand(x.shape)[(None,) * (4 - x.dim())]
        strides = ms.stride()
        block = k.triton.next_power_of_2(cols)
        k.scale_mask_softmax[(rows,)](x, ms, y, cols, shape4[1], shape4[2], *strides, scale,
                                      BLOCK=block, num_warps=_warps(block))
    return (y,)


#: pattern name -> launcher(*pattern inputs, **params): a tuple of its outputs
LAUNCHERS = {
    "rms_norm": launch_rms_norm,
    "add_layer_norm": launch_add_layer_norm,
    "bias_gelu": launch_bias_gelu,
    "scale_mask_softmax": launch_scale_mask_softmax,
}
