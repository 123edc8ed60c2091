"""Triton: hand-written kernels for whole patterns, claimed by its manifest's ``patterns:``.

The patterns: RMSNorm, LayerNorm + residual, bias + GELU, softmax with scale and mask.
The backend claims no single op. The partitioner hands it partitions made of pattern
matches it claimed (arbiter/plan/patterns.py); ``compile`` matches the patterns again in
the partition, checks each match as the planner did, and builds a new graph calling one
kernel launcher per match (backends/_triton_kernels.py) in place of its ATen nodes.
Kernels run on CUDA tensors or, with ``TRITON_INTERPRET=1`` set before triton is
imported, on CPU tensors in Triton's interpreter, 500-5000x slower than eager: that is
how tests/test_triton.py compares every kernel with eager in float32 and float16 without
a GPU. Without a GPU driver and without the interpreter the backend is unavailable, with
that reason. docs/design.md ("Triton backend"; what ran on a GPU: "What ran where").
"""
from __future__ import annotations

import operator
from typing import Any, Optional

import torch
import torch.fx

from arbiter.backend import Backend
from arbiter.ops import is_getitem, op_name
from arbiter.plan.pattern_library import PATTERNS
from arbiter.plan.patterns import (Match, checked, compile_pattern, entry_refuses,
                                   find_matches)
from arbiter.plan.capability import value_descs
from arbiter.registry import register_backend

from . import _triton_kernels as kernels

#: patterns whose kernel holds a whole row in one block
_ROW_WISE = {"rms_norm", "add_layer_norm", "scale_mask_softmax"}


@register_backend
class Triton(Backend):
    name = "triton"
    install_hint = "pip install 'torch-arbiter[triton]'"

    def available(self) -> tuple[bool, str]:
        found, why = kernels.mode()
        return (True, "") if found is not None else (False, why)

    def version(self) -> str:
        import triton

        found, _ = kernels.mode()
        return f"triton {triton.__version__}" + (" (interpreter)" if found == "interpreter" else "")

    def check_pattern(self, name: str, match: Match) -> Optional[str]:
        if name not in kernels.LAUNCHERS:
            return f"no Triton kernel for pattern {name}"
        found, why = kernels.mode()
        if found is None:
            return why
        want = "cpu" if found == "interpreter" else "cuda"
        vals = [match.input_value(k) for k in range(len(match.inputs))]
        vals += [o.meta.get("val") for o in match.outputs]
        for v in vals:
            if isinstance(v, torch.Tensor) and v.device.type != want:
                return ("Triton's interpreter runs CPU tensors only" if want == "cpu" else
                        "CPU tensors run only in Triton's interpreter (TRITON_INTERPRET=1)")
        out = match.outputs[0].meta.get("val")
        if name in _ROW_WISE and isinstance(out, torch.Tensor) and out.dim() \
                and out.shape[-1] > kernels.MAX_COLS:
            return f"rows of {out.shape[-1]} elements exceed the kernel's {kernels.MAX_COLS}"
        return None

    def compile(self, gm: torch.fx.GraphModule, example_inputs):
        found, why = kernels.mode()
        if found is None:
            raise RuntimeError(why)
        manifest = self.manifest()
        matches = find_matches(gm.graph, [compile_pattern(self, n) for n in manifest.patterns])
        for m in matches:
            descs = [d for v in (*[m.input_value(k) for k in range(len(m.inputs))],
                                 *[o.meta.get("val") for o in m.outputs])
                     for d in value_descs(v)]
            why = (entry_refuses(manifest.pattern_entry(m.pattern), descs)
                   or checked(PATTERNS[m.pattern].check, m)
                   or self.check_pattern(m.pattern, m))
            if why is not None:
                raise TypeError(f"pattern {m.pattern} at {m.nodes[-1].name}: {why}")
        return _rewrite(gm, matches)


def _rewrite(gm: torch.fx.GraphModule, matches: list[Match]) -> torch.fx.GraphModule:
    """A new graph (sharing ``gm``'s constants) with one launcher call per match in place
    of its nodes; every other compute node is refused: this backend runs patterns only."""
    member: dict[torch.fx.Node, Match] = {}
    for m in matches:
        for n in m.nodes:
            member[n] = m
            # unread getitems of a matched node go with it
            member.update({u: m for u in n.users if is_getitem(u) and not u.users})
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, Any] = {}
    emitted: set[int] = set()

    def value(a: Any) -> Any:
        if not isinstance(a, torch.fx.Node):
            return a
        if a not in env:
            raise TypeError(f"{a.name} is used before its pattern's inputs are computed")
        return env[a]

    for node in gm.graph.nodes:
        m = member.get(node)
        if m is None:
            if node.op == "call_function":
                raise TypeError(f"triton runs pattern kernels only; {node.name} "
                                f"({op_name(node.target)}) is in no pattern it claims")
            env[node] = graph.node_copy(node, value)
            continue
        inputs = [a for a in m.inputs if isinstance(a, torch.fx.Node)]
        if id(m) in emitted or any(a not in env for a in inputs):
            continue
        emitted.add(id(m))
        params = PATTERNS[m.pattern].params(m)
        if m.pattern == "rms_norm":
            params["out_dtype"] = m.outputs[0].meta["val"].dtype
        call = graph.call_function(kernels.LAUNCHERS[m.pattern],
                                   tuple(value(a) for a in m.inputs), params)
        call.name = f"triton_{m.pattern}"
        for k, out in enumerate(m.outputs):
            got = graph.call_function(operator.getitem, (call, k))
            got.meta = dict(out.meta)
            env[out] = got
    missing = [m.pattern for m in matches if id(m) not in emitted]
    if missing:
        raise TypeError(f"pattern(s) {', '.join(missing)} could not be placed in order")
    graph.lint()
    return torch.fx.GraphModule(gm, graph, class_name="TritonPatterns")
