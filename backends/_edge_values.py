"""Validators for values at the edge of what a runtime defines, where eager ATen defines them.

Shared by the backends whose runtimes were measured to differ there (docs/robustness.md,
"Edge values"). ``empty_reduction``: a mean (or variance) over no element is NaN in
eager; ONNX's ReduceMean leaves it undefined, and ONNX Runtime and OpenVINO return 0.
``integer_pow``: an integer power wraps around in eager (two's complement); ONNX Runtime
computes it through float64 (it saturates past the dtype's range and rounds past 2**53)
and OpenVINO's CPU plugin in 32 bits. ``integer_reduction``: an integer sum or product
is exact in eager (it wraps around past the dtype's range); ONNX Runtime reduces integers
through float64. A node is judged from its metadata (shapes and dtypes traced in
``meta["val"]``), so only the nodes that can meet the edge are refused: a mean over a
non-empty extent stays.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.fx

from arbiter.ops import op_name
from arbiter.shapes import bounds, expr

Validator = Callable[[torch.fx.Node], Optional[str]]


def argument(node: torch.fx.Node, name: str, default: Any = None) -> Any:
    """The node's argument ``name`` (by its op's schema), or its default."""
    for i, a in enumerate(node.target._schema.arguments):
        if a.name == name:
            if i < len(node.args):
                return node.args[i]
            if name in node.kwargs:
                return node.kwargs[name]
            return a.default_value if a.has_default_value() else default
    return default


def may_be_zero(size: Any) -> bool:
    """Whether a size can be 0: a static 0, or a symbol whose range reaches 0 (a
    data-dependent one; Dynamo never hands a backed symbol 0)."""
    if isinstance(size, int):
        return size == 0
    e = expr(size)
    if e.is_number:
        return int(e) == 0
    lo, _ = bounds(e, size.node.shape_env)
    return lo <= 0


def reduced_sizes(node: torch.fx.Node) -> Optional[list]:
    """The sizes a reduction node reduces over (every dimension when ``dim`` is None or
    empty), or None when its input's shape is unknown."""
    src = node.args[0] if node.args else None
    val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    dims = argument(node, "dim")
    if dims is None or dims == []:
        return list(val.shape)
    if isinstance(dims, int):
        dims = [dims]
    rank = max(val.dim(), 1)
    return [val.shape[d % rank] for d in dims] if val.dim() else []


def empty_reduction(runtime: str) -> Validator:
    """A validator refusing a mean or variance whose reduced extent is or may be empty
    (``runtime`` names who returns 0 there)."""
    def check(node: torch.fx.Node) -> Optional[str]:
        sizes = reduced_sizes(node)
        if sizes is None or not any(may_be_zero(s) for s in sizes):
            return None
        return (f"reduces over an empty extent: eager says NaN there, {runtime} says 0")
    return check


def integer_pow(runtime: str) -> Validator:
    """A validator refusing ``pow`` with an integer result (``runtime`` says how it
    computes one)."""
    def check(node: torch.fx.Node) -> Optional[str]:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and not val.is_floating_point() \
                and not val.is_complex():
            return (f"integer pow ({str(val.dtype).removeprefix('torch.')}): {runtime}; "
                    "eager wraps around past the dtype's range")
        return None
    return check


def integer_reduction(runtime: str) -> Validator:
    """A validator refusing a sum or product with an integer result (``runtime`` says how
    it computes one), unless it counts booleans (exact: a count never nears 2**53)."""
    def check(node: torch.fx.Node) -> Optional[str]:
        val = node.meta.get("val")
        src = node.args[0].meta.get("val") if node.args and \
            isinstance(node.args[0], torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or val.is_floating_point() or val.is_complex() \
                or (isinstance(src, torch.Tensor) and src.dtype == torch.bool):
            return None
        return (f"integer {op_name(node.target).split('.')[1]} "
                f"({str(val.dtype).removeprefix('torch.')}): {runtime}")
    return check


#: Reductions whose result over no element is NaN in eager.
MEANS = ("aten.mean.default", "aten.mean.dim")
VARIANCES = ("aten.var.correction", "aten.std.correction", "aten.var_mean.correction",
             "aten.std_mean.correction")
#: The overloads of pow.
POWS = ("aten.pow.Tensor_Tensor", "aten.pow.Tensor_Scalar", "aten.pow.Scalar")
#: Integer sums and products.
SUMS = ("aten.sum.default", "aten.sum.dim_IntList", "aten.prod.default", "aten.prod.dim_int")
