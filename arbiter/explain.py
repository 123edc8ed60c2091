"""The plan without compiling: ``arbiter.explain`` and ``arbiter.partition``."""
from __future__ import annotations

from typing import Any

import torch

from .config import ConfigLike
from .report import Report


def explain(model: torch.nn.Module, *inputs: Any, config: ConfigLike = None,
            backward: bool = True, dynamic: bool | None = None) -> Report:
    """What torch.compile(model, backend=Arbiter(config)) would do, without compiling.

    The model runs once in eager under Dynamo and AOTAutograd (so graph breaks and the
    backward graph are seen); no backend compiles anything. With ``backward`` and
    outputs that need gradients, the backward graph is traced too, through
    ``torch.autograd.grad`` (no ``.grad`` of the model is touched).
    """
    from .arbiter import Arbiter

    be = Arbiter(config, dry_run=True)
    compiled = torch.compile(model, backend=be, dynamic=dynamic)
    out = compiled(*inputs)
    if backward and torch.is_grad_enabled():
        flat = [t for t in _flatten(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        wrt = [p for p in model.parameters() if p.requires_grad] + [
            t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
        if flat and wrt:
            torch.autograd.grad(flat, wrt, [torch.ones_like(t) for t in flat],
                                allow_unused=True)
    return be.report()


def partition(graph_module: torch.fx.GraphModule, config: ConfigLike = None):
    """The partition plan for an ATen FX graph whose nodes carry ``meta["val"]``."""
    from .arbiter import Arbiter

    return Arbiter(config, dry_run=True).plan(graph_module)


def _flatten(x: Any) -> list:
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in _flatten(v)]
    if isinstance(x, dict):
        return [y for v in x.values() for y in _flatten(v)]
    if hasattr(x, "to_tuple"):  # transformers ModelOutput
        return _flatten(x.to_tuple())
    return [x]
