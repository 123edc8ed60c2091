"""A static cost estimate of a plan, for policy `cost` and to order `measure`'s work.

Per node, by op class: matrix products and convolutions cost their FLOPs at the
backend's GFLOP/s, every other op the bytes it reads and writes at its GB/s, and every
node the backend's per-node overhead. A partition run by a compiled backend adds its
per-call overhead and ``boundary_us`` per tensor crossing into or out of it. Shapes come
from the FakeTensor metadata (a symbolic size counts as its hint, else 1). The numbers
live in ``arbiter/plan/cost_table.yaml``, written by ``bench/calibrate_cost.py`` (a
backend missing from it gets its ``default`` row; its ``compile`` rows are kept as they
are). docs/policies.md ("`cost`") gives the formulas.
"""
from __future__ import annotations

import functools
import importlib.resources
import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.fx

from ..ops import is_getitem, tensors_in
from .partition import Plan

# (op packet) -> index of the argument holding the left matrix, for FLOP counting.
_MATMUL_LHS = {"aten.mm": 0, "aten.bmm": 0, "aten.addmm": 1, "aten.baddbmm": 1,
               "aten.matmul": 0}
_CONV = {"aten.convolution", "aten._convolution", "aten.convolution_backward"}
_SDPA_PREFIX = "aten._scaled_dot_product"


@dataclass(frozen=True)
class BackendCost:
    call_us: float   # per call of a compiled partition (0 for inline eager)
    node_us: float   # per node
    gflops: float    # matrix products and convolutions
    gbps: float      # everything else, by bytes moved


@dataclass(frozen=True)
class CostTable:
    backends: dict
    default: BackendCost
    boundary_us: float
    source: str
    # backend -> (seconds its first compile in a process adds, milliseconds per node):
    # what policy `calibrated` weighs before compiling a runner-up (predict_compile_s)
    compile: dict = field(default_factory=dict)

    def of(self, backend: str) -> BackendCost:
        # a lower-precision variant (`openvino:bf16`) is costed as its backend
        return self.backends.get(backend) or self.backends.get(backend.split(":")[0],
                                                                self.default)

    def compile_of(self, backend: str) -> Optional[tuple[float, float]]:
        """``backend``'s ``compile`` row (a variant's: its backend's), None without one."""
        return self.compile.get(backend) or self.compile.get(backend.split(":")[0])


def _row(d: dict) -> BackendCost:
    return BackendCost(float(d["call_us"]), float(d["node_us"]), float(d["gflops"]),
                       float(d["gbps"]))


@functools.lru_cache(maxsize=None)
def load_table(path: Optional[str] = None) -> CostTable:
    """The shipped table (``arbiter/plan/cost_table.yaml``), or the YAML file at ``path``."""
    import yaml

    if path is None:
        text = (importlib.resources.files("arbiter.plan") / "cost_table.yaml").read_text()
        source = "arbiter/plan/cost_table.yaml"
    else:
        with open(path) as f:
            text = f.read()
        source = path
    data = yaml.safe_load(text)
    return CostTable({k: _row(v) for k, v in (data.get("backends") or {}).items()},
                     _row(data["default"]), float(data["boundary_us"]), source,
                     {k: (float(v["first_s"]), float(v["ms_per_node"]))
                      for k, v in (data.get("compile") or {}).items()})


def _size(s: Any) -> int:
    if isinstance(s, int):
        return s
    hint = getattr(getattr(s, "node", None), "hint", None)
    return int(hint) if isinstance(hint, int) else 1


def _numel(t: torch.Tensor) -> int:
    return math.prod(_size(s) for s in t.shape)


def node_work(node: torch.fx.Node) -> tuple[float, float]:
    """(FLOPs, bytes) of one ATen node, from its metadata."""
    out = node.meta.get("val")
    packet = str(node.target).rsplit(".", 1)[0] if isinstance(
        node.target, torch._ops.OpOverload) else ""
    first_out = next(iter(tensors_in(out)), None)
    if first_out is not None:
        if packet in _MATMUL_LHS:
            lhs = node.args[_MATMUL_LHS[packet]]
            val = lhs.meta.get("val") if isinstance(lhs, torch.fx.Node) else None
            if isinstance(val, torch.Tensor) and val.dim() >= 1:
                return 2.0 * _numel(first_out) * _size(val.shape[-1]), 0.0
        if packet in _CONV and len(node.args) > 1 and isinstance(node.args[1], torch.fx.Node):
            w = node.args[1].meta.get("val")
            if isinstance(w, torch.Tensor) and w.dim() >= 1 and _size(w.shape[0]):
                return 2.0 * _numel(first_out) * _numel(w) / _size(w.shape[0]), 0.0
        if packet.startswith(_SDPA_PREFIX) and len(node.args) >= 2:
            q, k = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None
                    for a in node.args[:2])
            if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.dim() >= 2:
                return 4.0 * _numel(q) * _size(k.shape[-2]), 0.0
    return 0.0, operand_bytes(node)


def operand_bytes(node: torch.fx.Node) -> float:
    """Bytes of a node's tensor inputs and outputs, from its metadata: what a matrix
    product reads and writes (its weights, for a linear layer on a few rows)."""
    moved = sum(_numel(t) * t.element_size() for t in tensors_in(node.meta.get("val")))
    for inp in node.all_input_nodes:
        moved += sum(_numel(t) * t.element_size() for t in tensors_in(inp.meta.get("val")))
    return float(moved)


def node_us(node: torch.fx.Node, c: BackendCost) -> float:
    flops, moved = node_work(node)
    return c.node_us + flops / (c.gflops * 1e3) + moved / (c.gbps * 1e3)


def plan_ms(plan: Plan, inline: set[str], table: Optional[CostTable] = None) -> float:
    """Estimated milliseconds of one call of the stitched plan. ``inline``: backends
    whose partitions run in place (no call, no boundary)."""
    table = table or load_table()
    total = 0.0
    for part in plan.partitions:
        c = table.of(part.backend)
        members = set(part.nodes)
        for n in part.nodes:
            if not is_getitem(n):
                total += node_us(n, c)
        if part.backend in inline:
            continue
        crossing = {i for n in part.nodes for i in n.all_input_nodes if i not in members}
        crossing |= {n for n in part.nodes if any(u not in members for u in n.users)}
        total += c.call_us + table.boundary_us * len(crossing)
    return total / 1e3
