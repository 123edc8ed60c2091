"""The plan without compiling: ``arbiter.explain`` and ``arbiter.partition``.

``explain`` takes a model (with Dynamo's graph breaks), ``partition`` an ATen graph."""
from __future__ import annotations

from typing import Any

import torch

from .arbiter import Arbiter
from .config import ConfigLike
from .plan.partition import Plan
from .report import GraphBreakReport, Report


def graph_breaks(model: Any, *inputs: Any) -> GraphBreakReport:
    """Dynamo's graph breaks for ``model(*inputs)``, from ``torch._dynamo.explain``.

    PyTorch's explain resets Dynamo's caches before and after (models compiled earlier
    in the process recompile on their next call). ``explain`` and ``Arbiter.report`` do
    not use it: they count the breaks of their own compile.
    """
    out = torch._dynamo.explain(model)(*inputs)
    reasons = []
    for r in out.break_reasons:
        frames = getattr(r, "user_stack", None) or []
        where = f" [{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}]" \
            if frames else ""
        text = str(getattr(r, "reason", r)).strip().splitlines()
        reasons.append(f"{text[0][:300] if text else '?'}{where}")
    return GraphBreakReport(graphs=out.graph_count, breaks=out.graph_break_count,
                            reasons=reasons)


def explain(model: torch.nn.Module, *inputs: Any, config: ConfigLike = None,
            backward: bool = True, dynamic: bool | None = None,
            breaks: bool = True) -> Report:
    """What torch.compile(model, backend=Arbiter(config)) would do, without compiling.

    The model runs once in eager under Dynamo and AOTAutograd (so graph breaks and the
    backward graph are seen); no backend compiles anything. With ``backward`` and
    outputs that need gradients, the backward graph is traced too, through
    ``torch.autograd.grad`` (no ``.grad`` of the model is touched). With ``breaks``, the
    report holds Dynamo's graph breaks as this trace saw them.

    Other compiled models are left alone: Dynamo's caches are not reset, and where
    torch.compile has ``isolate_recompiles`` this trace's cache entries are kept apart
    (they count against no other compile's recompile limit).
    """
    be = Arbiter(config, dry_run=True)
    kw = {"isolate_recompiles": True} if "isolate_recompiles" in _compile_params() else {}
    compiled = torch.compile(model, backend=be, dynamic=dynamic, **kw)
    out = compiled(*inputs)
    if backward and torch.is_grad_enabled():
        flat = [t for t in flatten_outputs(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        wrt = [p for p in model.parameters() if p.requires_grad] + [
            t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
        if flat and wrt:
            torch.autograd.grad(flat, wrt, [torch.ones_like(t) for t in flat],
                                allow_unused=True)
    report = be.report()  # this Arbiter traced this model only
    if not breaks:
        report.graph_breaks = None
    return report


def _compile_params() -> set[str]:
    import inspect

    return set(inspect.signature(torch.compile).parameters)


def partition(graph_module: torch.fx.GraphModule, config: ConfigLike = None) -> Plan:
    """The priority plan for an ATen FX graph whose nodes carry ``meta["val"]``."""
    return Arbiter(config, dry_run=True).planner.plan(graph_module)


def flatten_outputs(x: Any) -> list:
    """The leaves of a model's output (lists, tuples, dicts, transformers' ModelOutput)."""
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in flatten_outputs(v)]
    if isinstance(x, dict):
        return [y for v in x.values() for y in flatten_outputs(v)]
    if hasattr(x, "to_tuple"):  # transformers ModelOutput
        return flatten_outputs(x.to_tuple())
    return [x]
