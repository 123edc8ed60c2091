"""A quantized partition judged against eager within one quantization step of its outputs.

A partition holding PT2E's quantize/dequantize nodes computes a quantized model, and a
backend that runs it in int8 (ONNX Runtime's QLinearConv and QGemm, OpenVINO's
FakeQuantize) rounds where eager's float emulation rounds too, but not always to the
same neighbour: a value at a rounding boundary lands one step away, and the layers after
it carry that step on. float32's tolerance (1e-5) calls that wrong (an MLP of three int8
layers: 7.6e-4 from eager on ONNX Runtime, the last activation's step 3.9e-3). So each
output of such a partition is allowed one *step* more than float32's tolerance: the
largest scale of the activation quantizations nearest above it in the graph
(``quantize_per_tensor``/``dequantize_per_tensor`` with a number for scale; a weight's
per-channel dequantize reads constant codes, which do not round differently), or one
integer code where the output is a quantize's codes. An output no quantization feeds
keeps float32's tolerance, and a partition without quantize/dequantize nodes is judged as
before (reference.py). docs/precision.md ("A model you quantized yourself").
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import torch
import torch.fx

from ...ops import is_quantization_op, is_quantize, op_name
from .reference import judge_against_float64
from .verify import Comparison, compare, dtype_name, tolerance


def _activation_scale(node: torch.fx.Node) -> Optional[float]:
    """The scale of a per-tensor quantize or dequantize given as a number, or None."""
    scale = node.args[1] if len(node.args) > 1 else node.kwargs.get("scale")
    return float(scale) if isinstance(scale, (int, float)) else None


def output_steps(gm: torch.fx.GraphModule) -> Optional[list[Optional[float]]]:
    """Per output of ``gm``: its quantization step (module docstring), None where no
    quantization feeds it; None for a graph without quantize/dequantize nodes. One pass
    in graph order: a quantize or dequantize sets the step of its value (its scale, or
    none for a weight's per-channel one), any other node takes its inputs' largest."""
    step: dict[torch.fx.Node, Optional[float]] = {}
    quantized = False
    for n in gm.graph.nodes:
        if n.op == "call_function" and is_quantization_op(op_name(n.target)):
            quantized = True
            step[n] = _activation_scale(n)
        else:
            ups = [step[i] for i in n.all_input_nodes if step.get(i) is not None]
            step[n] = max(ups) if ups else None
    if not quantized:
        return None
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    return [None if not isinstance(a, torch.fx.Node) else 1.0 if is_quantize(a) else step[a]
            for a in (out if isinstance(out, (list, tuple)) else [out])]


def judge_outputs(gm: torch.fx.GraphModule, args: Sequence[Any], expected: Sequence[Any],
                  got: Sequence[Any], overrides: Optional[Mapping[str, Any]] = None
                  ) -> Comparison:
    """``got`` against eager's ``expected`` for the partition ``gm``: within one
    quantization step per output where quantization feeds it, else as
    ``reference.judge_against_float64`` judges."""
    steps = output_steps(gm)
    if steps is None or len(steps) != len(expected) or len(expected) != len(got):
        return judge_against_float64(gm, args, expected, got, overrides)
    worst, detail = 0.0, ""
    for k, (e, g, s) in enumerate(zip(expected, got, steps)):
        if s is None or not isinstance(e, torch.Tensor) or not isinstance(g, torch.Tensor) \
                or g.shape != e.shape or g.dtype != e.dtype:
            cmp = compare([e], [g], overrides)
            worst = max(worst, cmp.max_error)
            if not cmp.ok:
                return Comparison(False, worst, cmp.detail.replace("output 0", f"output {k}", 1))
            continue
        rtol, atol = tolerance(e.dtype, overrides)
        e64, g64 = e.detach().to(torch.float64), g.detach().to(e.device, torch.float64)
        diff = (e64 - g64).abs()
        err = float(diff.max()) if diff.numel() else 0.0
        worst = max(worst, err)
        if not math.isfinite(err) or bool((diff > s + atol + rtol * e64.abs()).any()):
            return Comparison(False, worst, (
                f"output {k} ({dtype_name(e.dtype)}): max abs error {err:.3g}, more than one "
                f"quantization step ({s:.3g}) beyond rtol {rtol:g}, atol {atol:g}"))
        if err > atol + rtol * float(e64.abs().max()):
            detail = f"within one quantization step (output {k}: error {err:.3g}, step {s:.3g})"
    return Comparison(True, worst, detail)
