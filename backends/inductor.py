"""TorchInductor: PyTorch's own compiler (C++/OpenMP on CPU, Triton on GPU).

A partition is compiled with ``torch.compile(partition, backend="inductor")``: Dynamo
retraces the small ATen graph (cheap) and gives Inductor what it expects, with guards, so
a partition whose shapes change is recompiled rather than run with stale kernels.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field

from arbiter.registry import Backend, register_backend


class InductorOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Optional[str] = Field(None, description="torch.compile mode: default, "
                                "reduce-overhead, max-autotune, max-autotune-no-cudagraphs")
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="torch._inductor.config overrides")


@register_backend
class Inductor(Backend):
    name = "inductor"
    Options = InductorOptions

    def compile(self, gm, example_inputs):
        dynamic = _has_symbolic_placeholders(gm)
        opts = self.options
        kwargs: dict[str, Any] = {"fullgraph": True, "dynamic": dynamic}
        if opts.mode:
            kwargs["mode"] = opts.mode
        if opts.options:
            kwargs["options"] = dict(opts.options)
        fn = torch.compile(gm, backend="inductor", **kwargs)
        fn(*example_inputs)  # compile now, so a failure is a compile failure, not a run one
        return fn

    @classmethod
    def declared_ops(cls):
        """Ops Inductor lowers or decomposes (its ATen fallback kernels included)."""
        from torch._inductor.decomposition import select_decomp_table
        from torch._inductor.lowering import fallbacks, lowerings

        out = {}
        for table, note in ((lowerings, None), (select_decomp_table(), "decomposed by Inductor")):
            for op in table:
                if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten":
                    out.setdefault(op, {"note": note} if note else {})
        for op in fallbacks:
            if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten":
                out[op] = {"note": "runs as an ATen fallback kernel inside Inductor's code"}
        return out


def _has_symbolic_placeholders(gm: torch.fx.GraphModule) -> bool:
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt):
            return True
        if isinstance(val, torch.Tensor) and any(not isinstance(s, int) for s in val.shape):
            return True
    return False
