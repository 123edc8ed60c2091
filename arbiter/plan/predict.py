"""A plan's time predicted from this machine's calibration (policy `calibrated`).

The calibration (measure/calibration_cells.py measures it, measure/calibration.py keeps
it) holds per backend its cost per call (``call_us``), per node (``node_us``) and, per op
class, the time of graphs of that class at a few sizes (``cells``: (work, microseconds);
work is FLOPs or bytes moved, as ``cost.node_work`` counts). A node's time is its
backend's ``node_us`` plus its work at its class's time, piecewise linear through the
cells (``BackendCalibration.class_us``); a matrix product is priced at least at the
time of reading its operands at the backend's ``gemv`` rate (a roofline: a linear layer on
one row, a decode step's, reads its weights and does little arithmetic, and the FLOPs
alone priced it 14x below its time); a partition of at least ``FACTOR_MIN_NODES``
compute nodes is priced op by op times its backend's block factor for its kind
(``block_kind``), since op cells alone miss fusion; products priced at their floor are
left out of the factor (fusing ops around a product does not shorten reading its
weights, and the factor, measured on a block of 128 rows, had Inductor's decode step
predicted at 0.39 ms where it took ~0.6; 0.47 without it on the floor-priced products).
A compiled partition adds ``call_us`` and ``boundary_us`` per tensor crossing it. What the
calibration lacks is priced by the static table (``cost.py``; ``Prediction.uncalibrated``);
``predict_compile_s`` reads its ``compile`` rows. docs/policies.md ("`calibrated`").
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.fx

from ..ops import DATA_MOVES, is_dequantize, is_getitem, op_name, packet_name
from .cost import CostTable, load_table, node_work, operand_bytes
from .partition import Plan

#: Op classes the calibration measures, and the ATen packets (``aten.<name>``) of each;
#: ops of no class move bytes at the ``elementwise`` rate.
CLASSES: dict[str, frozenset[str]] = {
    "linear": frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul"}),
    "conv": frozenset({"convolution", "_convolution", "convolution_backward"}),
    "attention": frozenset({"_scaled_dot_product_flash_attention_for_cpu",
                            "_scaled_dot_product_efficient_attention",
                            "_scaled_dot_product_flash_attention",
                            "_scaled_dot_product_attention_math",
                            "_scaled_dot_product_flash_attention_for_cpu_backward"}),
    "norm": frozenset({"native_layer_norm", "native_layer_norm_backward",
                       "_native_batch_norm_legit_no_training", "_native_batch_norm_legit",
                       "native_batch_norm", "native_batch_norm_backward",
                       "native_group_norm", "native_group_norm_backward"}),
    "reduction": frozenset({"sum", "mean", "amax", "amin", "max", "min", "prod", "var",
                            "var_mean", "argmax", "argmin", "logsumexp", "_softmax",
                            "_log_softmax", "_softmax_backward_data",
                            "_log_softmax_backward_data", "cumsum"}),
    # a linear or convolution whose weight is dequantized int8 (a PT2E model's): named
    # by ``op_class`` from the node's weight, not its packet; priced as its float class
    # where the calibration has no cell of it
    "qlinear": frozenset(),
    "qconv": frozenset(),
}
#: A class the calibration measures that no packet is of: the rate at which a matrix
#: product reads its operands (a linear layer on one row), the floor of a ``linear``
#: node's time. Not applied to ``qlinear`` (its weight is read as int8).
GEMV = "gemv"
#: The int8 classes and the float class each is priced as without a cell of its own.
INT8_CLASSES = {"qlinear": "linear", "qconv": "conv"}
_INT8_OF = {base: cls for cls, base in INT8_CLASSES.items()}
#: Where the weight is among each linear/conv packet's arguments.
_WEIGHT_ARG = {"mm": 1, "addmm": 2, "bmm": 1, "baddbmm": 2, "matmul": 1, "convolution": 1,
               "_convolution": 1}
#: Ops that move no data (views, metadata): their nodes cost only ``node_us``.
FREE = frozenset({"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand",
                  "unsqueeze", "squeeze", "slice", "select", "alias", "detach",
                  "as_strided", "split", "split_with_sizes", "unbind", "sym_size",
                  "sym_numel", "sym_stride", "lift_fresh_copy"})


#: Kinds of whole blocks the calibration times (``factors``): a partition is of kind
#: ``conv`` when convolutions hold at least half of its FLOPs, else ``matmul``.
KINDS = ("matmul", "conv")
#: A partition with at least this many compute nodes (not ``free``) is priced with its
#: backend's factor for its kind (a block of a model, where fusion pays); a smaller one
#: op by op.
FACTOR_MIN_NODES = 12


@dataclass(frozen=True)
class BackendCalibration:
    """One backend's measured costs on this machine (see the module docstring).
    ``factors``: kind -> a whole block's measured time over its op-by-op prediction (what
    fusing, layouts and scheduling across ops do to it on this backend). ``observed``:
    the factor this machine's measured candidates correct its predictions by, from
    ``observed_n`` timings (measure/feedback.py; 1.0 before there are enough)."""

    call_us: float
    node_us: float
    cells: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    factors: dict[str, float] = field(default_factory=dict)
    observed: float = 1.0
    observed_n: int = 0

    def op_us(self, cls: str, work: float, flops: bool) -> Optional[float]:
        """One node's microseconds (its ``node_us`` included) from its class and work
        (``flops``: the work is FLOPs, not bytes), or None when not calibrated."""
        if cls == "free":
            return self.node_us
        us = self.class_us(cls, work)
        if us is None and cls in INT8_CLASSES:
            us = self.class_us(INT8_CLASSES[cls], work)
        if us is None and not flops:
            us = self.class_us("elementwise", work)
        return None if us is None else self.node_us + us

    def floor_us(self, cls: str, moved: float) -> Optional[float]:
        """The least a ``linear`` node whose operands are ``moved`` bytes takes (its
        ``node_us`` included): reading them at the ``gemv`` cells' time; None for other
        classes or without the cells."""
        if cls != "linear" or moved <= 0:
            return None
        us = self.class_us(GEMV, moved)
        return None if us is None else self.node_us + us

    def class_us(self, cls: str, work: float) -> Optional[float]:
        """Microseconds of ``work`` of class ``cls`` (no per-node cost), or None when the
        class was not calibrated. Time is piecewise linear in work through the calibrated
        sizes: below the smallest, the line through the two smallest (its intercept, at
        least 0, is the class's fixed cost per op: a tiny matmul is not free); above the
        largest, the largest's rate; with one size, that size's rate."""
        cells = self.cells.get(cls)
        if not cells:
            return None
        if work <= 0:
            return 0.0
        (w0, t0) = cells[0]
        if len(cells) == 1 or work >= cells[-1][0]:
            w, t = cells[-1]
            return work * t / w
        i = max(1, bisect.bisect_left([w for w, _ in cells], work))
        (wa, ta), (wb, tb) = cells[i - 1], cells[i]
        slope = (tb - ta) / (wb - wa) if wb > wa else 0.0
        if slope <= 0:  # noise: the larger ran no slower; its rate
            return work * tb / wb
        if work < w0:
            fixed = max(0.0, t0 - slope * w0)
            return min(t0, fixed + slope * work)
        return ta + slope * (work - wa)

    def to_json(self) -> dict:
        return {"call_us": self.call_us, "node_us": self.node_us,
                "cells": {k: [list(c) for c in v] for k, v in self.cells.items()},
                "factors": dict(self.factors)}

    @classmethod
    def from_json(cls, raw: dict) -> "BackendCalibration":
        """From ``to_json``'s shape; ValueError on anything else (a file is checked)."""
        if not isinstance(raw, dict):
            raise ValueError("a backend's calibration must be a mapping")
        cells = {}
        for k, v in (raw.get("cells") or {}).items():
            if k not in CLASSES and k not in ("elementwise", GEMV):
                raise ValueError(f"unknown op class {k!r} (valid: "
                                 f"{', '.join([*CLASSES, 'elementwise', GEMV])})")
            pairs = tuple(sorted((float(w), float(us)) for w, us in v))
            if any(w <= 0 or us <= 0 for w, us in pairs):
                raise ValueError(f"class {k!r}: work and time must be positive")
            cells[k] = pairs
        factors = {}
        for k, v in (raw.get("factors") or {}).items():
            if k not in KINDS:
                raise ValueError(f"unknown block kind {k!r} (valid: {', '.join(KINDS)})")
            if not float(v) > 0:
                raise ValueError(f"block kind {k!r}: the factor must be positive")
            factors[k] = float(v)
        return cls(float(raw["call_us"]), float(raw["node_us"]), cells, factors)


def op_class(node: torch.fx.Node) -> str:
    """The calibration class of an ATen node: one of ``CLASSES``, ``free`` or
    ``elementwise``."""
    if not isinstance(node.target, torch._ops.OpOverload):
        return "elementwise"
    packet = packet_name(op_name(node.target)).partition(".")[2]  # aten.mm.default -> mm
    if packet in FREE:
        return "free"
    for cls, packets in CLASSES.items():
        if packet in packets:
            if cls in _INT8_OF and _int8_weight(node, packet):
                return _INT8_OF[cls]
            return cls
    return "elementwise"


def _int8_weight(node: torch.fx.Node, packet: str) -> bool:
    """Whether the weight of a linear/conv ``node`` is dequantized from integer codes,
    through ops that only move it (``ops.DATA_MOVES``, as the partitioner's units follow
    it: a PT2E model's ``dequantize_per_channel`` then ``t``)."""
    index = _WEIGHT_ARG.get(packet)
    if index is None or len(node.args) <= index:
        return False
    arg = node.args[index]
    for _ in range(4):
        if not isinstance(arg, torch.fx.Node) or arg.op != "call_function":
            return False
        if is_dequantize(arg):
            return True
        if packet_name(op_name(arg.target)) not in DATA_MOVES or not arg.args:
            return False
        arg = arg.args[0]
    return False


def op_work(node: torch.fx.Node) -> tuple[str, float, float]:
    """(op class, FLOPs, bytes moved) of an ATen node; a ``free`` op does no work. A
    ``linear`` node's bytes are its operands' (what the ``gemv`` floor prices)."""
    cls = op_class(node)
    if cls == "free":
        return cls, 0.0, 0.0
    flops, moved = node_work(node)
    if cls == "linear" and flops:
        moved = operand_bytes(node)
    return cls, flops, moved


@dataclass
class Prediction:
    ms: float
    uncalibrated: set[str] = field(default_factory=set)  # backends priced by the static table


def node_us(node: torch.fx.Node, backend: str, calib: Optional[BackendCalibration],
            table: CostTable) -> tuple[float, bool]:
    """(microseconds, calibrated) of one node on ``backend``."""
    us, known, _ = _priced(op_work(node), backend, calib, table)
    return us, known


def _priced(work: tuple[str, float, float], backend: str,
            calib: Optional[BackendCalibration], table: CostTable) -> tuple[float, bool, bool]:
    """(microseconds, calibrated, at its floor) of a node of ``op_work`` ``work``: by
    the calibration (a matrix product at least at its ``floor_us``), else by the static
    table."""
    cls, flops, moved = work
    if calib is not None:
        us = calib.op_us(cls, flops if flops else moved, bool(flops))
        if us is not None:
            floor = calib.floor_us(cls, moved) if flops else None
            if floor is not None and floor > us:
                return floor, True, True
            return us, True, False
    row = table.of(backend)
    moved = 0.0 if flops else moved  # the static table prices products by FLOPs alone
    return row.node_us + flops / (row.gflops * 1e3) + moved / (row.gbps * 1e3), False, False


def block_kind(works: list[tuple[str, float, float]]) -> str:
    """``conv`` when convolutions hold at least half of the FLOPs of ``works`` (nodes'
    ``op_work``), else ``matmul`` (see ``KINDS``)."""
    total = sum(flops for _, flops, _ in works)
    conv = sum(flops for cls, flops, _ in works if INT8_CLASSES.get(cls, cls) == "conv")
    return "conv" if total and conv >= total / 2 else "matmul"


def predict_compile_s(plan: Plan, inline: set[str],
                      table: Optional[CostTable] = None) -> Optional[float]:
    """The predicted seconds of compiling ``plan``'s partitions (first calls included):
    per backend its first compile in a process, per partition its nodes at the backend's
    rate (the cost table's ``compile`` rows), or None when a compiled partition's backend
    has no row. Rough (Inductor's rate on convolutions is six times its rate on a
    transformer's matmuls), but it tells a backend that compiles BERT-base in a second
    from one that takes fifteen."""
    table = table or load_table()
    total, started = 0.0, set()
    for part in plan.partitions:
        if part.backend in inline:
            continue
        row = table.compile_of(part.backend)
        if row is None:
            return None
        first_s, ms_per_node = row
        base = part.backend.split(":")[0]  # a variant's first compile is its backend's
        if base not in started:
            total += first_s
            started.add(base)
        total += ms_per_node / 1e3 * sum(not is_getitem(n) for n in part.nodes)
    return total


def predict(plan: Plan, inline: set[str], calibration: dict[str, BackendCalibration],
            table: Optional[CostTable] = None) -> Prediction:
    """The predicted milliseconds of one call of ``plan`` (see the module docstring).
    ``inline``: backends whose partitions run in place (no call, no boundary)."""
    table = table or load_table()
    out = Prediction(0.0)
    total = 0.0
    for part in plan.partitions:
        base = part.backend.split(":")[0]  # a lower-precision variant: its backend's
        calib = calibration.get(part.backend) or calibration.get(base)
        members = set(part.nodes)
        works = [op_work(n) for n in part.nodes if not is_getitem(n)]
        part_us = bound_us = 0.0
        for w in works:
            us, known, at_floor = _priced(w, part.backend, calib, table)
            if at_floor:
                bound_us += us
            else:
                part_us += us
            if not known:
                out.uncalibrated.add(part.backend)
        compute = sum(cls != "free" for cls, _, _ in works)
        if calib is not None and calib.factors and compute >= FACTOR_MIN_NODES:
            part_us *= calib.factors.get(block_kind(works), 1.0)
        part_us += bound_us  # reading weights: no fusion makes it shorter
        observed = calib.observed if calib is not None else 1.0
        total += part_us * observed
        if part.backend in inline:
            continue
        crossing = {i for n in part.nodes for i in n.all_input_nodes if i not in members}
        crossing |= {n for n in part.nodes if any(u not in members for u in n.users)}
        call = calib.call_us * observed if calib is not None else table.of(part.backend).call_us
        total += call + table.boundary_us * len(crossing)
    out.ms = total / 1e3
    return out
