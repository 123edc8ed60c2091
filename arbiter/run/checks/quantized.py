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
integer code where the output is a quantize's codes. In a deep model that is not enough:
a flipped code moves what the layers after compute by more than a step, and a LayerNorm
scales it up (BERT-base: Inductor's own PT2E path is 8 steps from eager at most). So an
output beyond one step is judged against the spread of int8 rounding: eager run again
with each quantize's input nudged by 16 float32 eps (what another order of the float ops
before it moves a value by; the largest of ``SPREAD_DRAWS`` draws), and the output passes
when its RMS error is at most 2x the nudged runs' and its max at most 4x theirs plus one
step (reference.py's factors). A graph that does not move under the nudge keeps the one-step allowance alone.
An output no quantization feeds is judged as any partition's (float32's tolerance, then
a float64 reference where that fails: reference.py), and a partition without
quantize/dequantize nodes is judged as before. Dynamic quantization's step is not known
ahead (``choose_qparams.tensor`` computes each scale on the call, for the ``.tensor``
overloads): an output such a quantization feeds gets no step, and anything beyond
float32's tolerance is judged against the spread alone. docs/precision.md ("A model you quantized
yourself").
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import torch
import torch.fx

from ...ops import is_quantization, is_quantize
from .reference import MAX_FACTOR, RMS_FACTOR, judge_against_float64
from .verify import Comparison, compare, dtype_name, tolerance


def _activation_scale(node: torch.fx.Node) -> Optional[float]:
    """The scale of a per-tensor quantize or dequantize given as a number; 0.0 where it is
    computed on the call (dynamic quantization: the step is not known, the spread judges);
    None for anything else (a weight's per-channel dequantize, ``choose_qparams``)."""
    name = getattr(node.target, "_opname", "")
    if name.startswith("choose_qparams"):
        return None
    scale = node.args[1] if len(node.args) > 1 else node.kwargs.get("scale")
    if isinstance(scale, (int, float)):
        return float(scale)
    return 0.0 if isinstance(scale, torch.fx.Node) and "per_tensor" in name else None


def output_steps(gm: torch.fx.GraphModule) -> Optional[list[Optional[float]]]:
    """Per output of ``gm``: its quantization step (module docstring), None where no
    quantization feeds it; None for a graph without quantize/dequantize nodes. One pass
    in graph order: a quantize or dequantize sets the step of its value (its scale, or
    none for a weight's per-channel one), any other node takes its inputs' largest."""
    step: dict[torch.fx.Node, Optional[float]] = {}
    quantized = False
    for n in gm.graph.nodes:
        if is_quantization(n):
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


#: ``_spread``'s relative nudge of each quantize's input: 16 float32 eps, what a backend's
#: other order of the float ops before a quantize (a blocked sum, a fused multiply-add)
#: moves a value by
NUDGE = 16 * torch.finfo(torch.float32).eps
#: ``_spread`` takes the largest of this many nudged runs (other draws): where few values
#: lie near a rounding boundary one draw may flip none (a two-layer model: RMS 0 to 2e-2
#: over eight draws)
SPREAD_DRAWS = 4


class _Nudged(torch.fx.Interpreter):
    """Runs a graph with each quantize's float input multiplied by ``1 + NUDGE * r``, r
    uniform in [-1, 1], drawn from a generator seeded by the node's position (the same
    nudge on every run)."""

    def __init__(self, gm: torch.fx.GraphModule, draw: int = 0):
        super().__init__(gm)
        self.position = {n: i + draw * 1_000_003 for i, n in enumerate(gm.graph.nodes)}

    def run_node(self, n: torch.fx.Node) -> Any:
        if not is_quantize(n):
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        x = args[0]
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            g = torch.Generator(device=x.device).manual_seed(self.position[n])
            r = torch.rand(x.shape, generator=g, device=x.device, dtype=x.dtype) * 2 - 1
            args = (x * (1 + NUDGE * r), *args[1:])
        return n.target(*args, **kwargs)


def _spread(gm: torch.fx.GraphModule, args: Sequence[Any],
            expected: Sequence[Any]) -> list[Optional[tuple[float, float]]]:
    """Per output: (RMS, max) of eager nudged (``_Nudged``) against eager, the largest of
    ``SPREAD_DRAWS`` draws, None where it cannot be had. A value at a rounding boundary
    goes to the other code under the nudge, as under a backend's int8 kernel, and the
    layers after carry it: in a deep model the output moves by far more than one step
    (BERT-base, 12 int8 layers and their LayerNorms: RMS 1.7e-2, max 7.8e-2 where the
    last step is 9e-3; Inductor's own PT2E path with freezing: 1.7e-2, 7.3e-2)."""
    spread: list[Optional[tuple[float, float]]] = [None] * len(expected)
    for draw in range(SPREAD_DRAWS):
        try:
            with torch.no_grad():
                out = _Nudged(gm, draw).run(*args)
        except Exception:  # noqa: BLE001 - no spread: one step is the allowance
            return [None] * len(expected)
        out = list(out) if isinstance(out, (list, tuple)) else [out]
        for k, (e, o) in enumerate(zip(expected, out)):
            if not (isinstance(e, torch.Tensor) and isinstance(o, torch.Tensor)
                    and o.shape == e.shape and e.is_floating_point() and e.numel()):
                continue
            d = (o.detach().to(torch.float64) - e.detach().to(o.device, torch.float64)).abs()
            rms, top = float(d.pow(2).mean().sqrt()), float(d.max())
            had = spread[k]
            spread[k] = (rms, top) if had is None else (max(had[0], rms), max(had[1], top))
    return spread


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
    spread: Optional[list] = None  # _spread's, computed when one step is not enough
    plain: list[int] = []  # outputs no quantization feeds: float32's rules
    for k, (e, g, s) in enumerate(zip(expected, got, steps)):
        if s is None or not isinstance(e, torch.Tensor) or not isinstance(g, torch.Tensor) \
                or g.shape != e.shape or g.dtype != e.dtype:
            plain.append(k)
            continue
        rtol, atol = tolerance(e.dtype, overrides)
        e64, g64 = e.detach().to(torch.float64), g.detach().to(e.device, torch.float64)
        diff = (e64 - g64).abs()
        err = float(diff.max()) if diff.numel() else 0.0
        worst = max(worst, err)
        if not math.isfinite(err):
            return Comparison(False, worst, f"output {k} ({dtype_name(e.dtype)}): its error "
                              f"against eager is not finite ({err})")
        if bool((diff > s + atol + rtol * e64.abs()).any()):
            if spread is None:
                spread = _spread(gm, args, expected)
            rms, sp = float(diff.pow(2).mean().sqrt()), spread[k]
            if sp is None or not (rms <= RMS_FACTOR * sp[0] + atol
                                  and err <= MAX_FACTOR * sp[1] + s + atol):
                beyond = (f"more than one quantization step ({s:.3g})" if s else
                          "its quantization's step chosen on the call (dynamic)")
                return Comparison(False, worst, (
                    f"output {k} ({dtype_name(e.dtype)}): max abs error {err:.3g}, {beyond} "
                    f"beyond rtol {rtol:g}, atol {atol:g}, "
                    f"and RMS {rms:.3g}, beyond the spread of int8 rounding (eager with "
                    f"its quantize inputs moved by {NUDGE:.2g}: "
                    + (f"RMS {sp[0]:.3g}, max {sp[1]:.3g}; allowed {RMS_FACTOR:g}x its RMS, "
                       f"{MAX_FACTOR:g}x its max + one step)" if sp else "not computed)")))
            detail = (f"within the spread of int8 rounding (output {k}: RMS {rms:.3g}, max "
                      f"{err:.3g}; eager nudged: RMS {sp[0]:.3g}, max {sp[1]:.3g})")
        elif err > atol + rtol * float(e64.abs().max()):
            detail = detail or (f"within one quantization step (output {k}: error "
                                f"{err:.3g}, step {s:.3g})")
    if plain:
        # judged as any partition's outputs (float64's re-judge included), the quantized
        # ones, within their step above, handed over as eager's own values
        mixed = [got[k] if k in plain else expected[k] for k in range(len(got))]
        cmp = judge_against_float64(gm, args, expected, mixed, overrides)
        if not cmp.ok or cmp.detail:
            return Comparison(cmp.ok, max(worst, cmp.max_error),
                              "; ".join(x for x in (cmp.detail, detail) if x))
        worst = max(worst, cmp.max_error)
    return Comparison(True, worst, detail)
