"""Samples for ATen overloads that PyTorch's OpInfos never produce on their own.

Graphs from Dynamo and AOTAutograd hold overloads that no OpInfo sample traces to:
``pow.Tensor_Scalar`` (only inside ``local_response_norm``), ``div.Scalar`` (from
decompositions), ``ge.Scalar`` and the other comparisons with a number (OpInfo's
comparison samples compare tensors), ``_unsafe_view`` (from ``matmul``'s), ``arange`` of
a symbolic length (GPT-2's positions: OpInfo's ``arange`` samples take no tensor, so
nothing varies), ``alias`` and ``bitwise_and`` of two masks (a decoder's rotary tables and
causal mask under ``torch.export``). A model full of them (GPT-2's ``gelu_new``) would
find those ops never probed with symbols. Each sample here calls one overload directly,
with sizes computed from its inputs (a fixed target size would pin the symbols), and
goes through the same probe as an OpInfo sample (``arbiter.probe.dynamic``): it quacks
like an OpInfo (``name``, ``aten_name``, ``sample_inputs``, ``supported_dtypes``,
``op``). Used by the dynamic probe only.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

aten = torch.ops.aten


class OpSample:
    """One ATen overload's samples: ``op(*tensors, *args)`` on tensors of ``shapes``."""

    variant_test_name = ""
    has_nondeterministic_output = False
    skip_correctness_check_compile_vs_eager = False

    def __init__(self, overload: str, op: Callable, shapes: Sequence[Sequence[tuple]],
                 args: tuple = (), positive: bool = False, masks: bool = False):
        self.name = f"aten.{overload}"
        self.aten_name = overload.split(".")[0]
        self.overload = overload
        self.op = lambda *a, **k: op(*a, **k)
        self._shapes = [list(s) for s in shapes]
        self._args = args
        self._positive = positive
        self._masks = masks

    def supported_dtypes(self, device: str) -> set:
        return {torch.bool} if self._masks else {torch.float32, torch.float64}

    def sample_inputs(self, device: str, dtype: torch.dtype, requires_grad: bool = False):
        from torch.testing._internal.opinfo.core import SampleInput

        g = torch.Generator().manual_seed(0)
        for shapes in self._shapes:
            ts = [torch.randn(s, generator=g, device=device) for s in shapes]
            ts = [t > 0 if self._masks else t.to(dtype) for t in ts]
            if self._positive:
                ts = [t.abs() + 0.5 for t in ts]
            yield SampleInput(ts[0], args=(*ts[1:], *self._args))


def _arange(x: torch.Tensor) -> torch.Tensor:
    return aten.arange.default(x.shape[0], dtype=x.dtype) + x[:, 0]


def _arange_start(x: torch.Tensor) -> torch.Tensor:
    return aten.arange.start(1, x.shape[0] + 1, dtype=x.dtype) * x[:, 0]


def _arange_start_step(x: torch.Tensor) -> torch.Tensor:
    return aten.arange.start_step(0, 2 * x.shape[0], 2, dtype=x.dtype) - x[:, 0]


def _unsafe_view(x: torch.Tensor) -> torch.Tensor:
    return aten._unsafe_view.default(x.clone(), [x.shape[0] * x.shape[1], x.shape[2]])


def _gelu_backward(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return aten.gelu_backward.default(g, x)


def _threshold_backward(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return aten.threshold_backward.default(g, x, 0.0)


def _softmax_backward(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    out = aten._softmax.default(x, -1, False)
    return aten._softmax_backward_data.default(g, out, -1, x.dtype)


def _layer_norm_backward(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                         b: torch.Tensor) -> Any:
    d = x.shape[-1]
    _, mean, rstd = aten.native_layer_norm.default(x, [d], w, b, 1e-5)
    return aten.native_layer_norm_backward.default(g, x, [d], mean, rstd, w, b,
                                                   [True, True, True])


#: overload -> its sample source
SAMPLES: dict[str, OpSample] = {s.overload: s for s in (
    OpSample("pow.Tensor_Scalar", aten.pow.Tensor_Scalar, [[(4, 5, 6)], [(3, 7)]], (3.0,)),
    OpSample("div.Scalar", aten.div.Scalar, [[(4, 5, 6)], [(3, 7)]], (2.0,)),
    OpSample("mul.Scalar", aten.mul.Scalar, [[(4, 5, 6)]], (0.5,)),
    OpSample("add.Scalar", aten.add.Scalar, [[(4, 5, 6)]], (1.5,)),
    # comparisons with a number (a mask from positions: transformers' under torch.export)
    *(OpSample(f"{c}.Scalar", getattr(aten, c).Scalar, [[(4, 5, 6)]], (0.25,))
      for c in ("ge", "gt", "le", "lt", "eq", "ne")),
    OpSample("_unsafe_view.default", _unsafe_view, [[(4, 5, 6)], [(3, 7, 2)]]),
    # a decoder's rotary tables and causal masks (Llama under torch.export)
    OpSample("alias.default", aten.alias.default, [[(4, 5, 6)]]),
    OpSample("bitwise_and.Tensor", aten.bitwise_and.Tensor, [[(4, 5, 6), (4, 5, 6)]],
             masks=True),
    # sizes that are ints of the graph (a position index up to the sequence length)
    OpSample("arange.default", _arange, [[(5, 3)]]),
    OpSample("arange.start", _arange_start, [[(5, 3)]]),
    OpSample("arange.start_step", _arange_start_step, [[(5, 3)]]),
    OpSample("gelu_backward.default", _gelu_backward, [[(4, 5, 6), (4, 5, 6)]]),
    OpSample("threshold_backward.default", _threshold_backward, [[(4, 5, 6), (4, 5, 6)]]),
    OpSample("_softmax_backward_data.default", _softmax_backward, [[(4, 5, 6), (4, 5, 6)]]),
    OpSample("native_layer_norm_backward.default", _layer_norm_backward,
             [[(4, 5, 6), (4, 5, 6), (6,), (6,)]]),
)}


def samples_for(names: Sequence[str] | None) -> list[OpSample]:
    """The samples of the overloads ``names`` selects (``aten.pow`` selects every
    overload of ``pow`` here; None: all)."""
    if not names:
        return list(SAMPLES.values())
    out = []
    for s in SAMPLES.values():
        full = f"aten.{s.overload}"
        if any(n in (full, full.rsplit(".", 1)[0], s.aten_name) for n in names):
            out.append(s)
    return out
