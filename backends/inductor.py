"""TorchInductor: PyTorch's own compiler (C++/OpenMP on CPU, Triton on GPU).

A partition is handed to ``torch._inductor.compile_fx.compile_fx`` with the partition's
real first-call inputs, as Inductor's own torch.compile path does after Dynamo. Wrapping
the ATen partition in ``torch.compile`` instead was tried: Dynamo declined some partition
GraphModules ("found no compiled frames"), so the direct entry is used. A static
partition's kernels are specialized to those shapes.

A partition with symbolic shapes is compiled on the graph's own fake inputs (FakeTensors
with SymInt sizes, and its SymInt inputs), as Inductor does under Dynamo: the kernels take
the sizes as arguments, one compile serves every size. Guards Inductor adds to Dynamo's
ShapeEnv while compiling are checked per call by ``arbiter.run.dynamic``.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field

from arbiter.registry import Backend, register_backend
from arbiter.shapes import graph_is_symbolic, input_values

log = logging.getLogger(__name__)


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
        from torch._inductor import config as inductor_config
        from torch._inductor.compile_fx import compile_fx

        # symbolic: the graph's fake inputs, so the kernels take sizes as arguments
        example = input_values(gm) if graph_is_symbolic(gm) else list(example_inputs)
        patches = dict(self.options.options)
        if self.options.mode in ("max-autotune", "max-autotune-no-cudagraphs"):
            patches.setdefault("max_autotune", True)
        if self._threads is not None:
            # The OpenMP thread count is baked into the generated C++ kernels at compile
            # time (cpp.threads; -1 would read torch.get_num_threads() then).
            patches.setdefault("cpp.threads", self._threads)
        context = _cacheable_context(gm)
        if context is not None:
            try:
                with inductor_config.patch(patches), context:
                    return compile_fx(gm, example)
            except Exception as exc:  # noqa: BLE001 - retried below without the context
                # Seen on the small CNN's training forward: Inductor's scalar pass looked
                # up a symbol the context's shape env does not know (KeyError). Compile
                # as before, at the price of Inductor's cache for this graph.
                log.info("inductor: compile inside a tracing context failed (%s: %s); "
                         "compiling without it (Inductor's FX graph cache is bypassed)",
                         type(exc).__name__, str(exc)[:200])
        with inductor_config.patch(patches):
            return compile_fx(gm, example)

    _threads = None  # set by configure_resources: the budget's threads

    def configure_resources(self, budget) -> dict:
        """Inductor's CPU kernels use torch's OpenMP pool (already sized by
        arbiter.run.resources); the budget's thread count is also baked into its kernels."""
        user = self.options.options.get("cpp.threads")
        if not budget.coordinate:
            return {"coordinated": False, "openmp_threads": "torch.get_num_threads() at compile"}
        if user is None:
            type(self)._threads = budget.threads  # process-wide, like the budget
        return {"coordinated": True,
                "openmp_threads": user if user is not None else budget.threads,
                "spinning": "torch's OpenMP: OMP_WAIT_POLICY at torch's import"}

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


def _cacheable_context(gm: torch.fx.GraphModule):
    """A tracing context around ``compile_fx``, with the fake mode (and shape env) the
    graph was traced with.

    Pieces compile on their first call, outside Dynamo's and AOTAutograd's tracing
    context; without one, Inductor's own FX graph cache bypasses every graph ("No shape
    env") and a second process recompiles everything (measured on gpt2_tiny: 12.6 s warm
    vs 40 s cold, all three pieces bypassed; with this context they hit). The graph's
    own fake mode is used, not a fresh one. Returns None where no context is needed or
    possible (one is active already: a caller tracing; or the graph has no fake mode)."""
    from torch._guards import TracingContext, detect_fake_mode, tracing

    if TracingContext.try_get() is not None:
        return None
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    fake_mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    if fake_mode is None or fake_mode.shape_env is None:
        return None  # nothing to key on: Inductor bypasses its cache
    return tracing(TracingContext(fake_mode))
