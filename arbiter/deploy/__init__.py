"""Compile once, ship, run without Dynamo (docs/deploy.md).

    program = arbiter.export(model, (x,), dynamic_shapes=...)   # torch.export + arbiter
    program(x)                                                  # no Dynamo, one input check
    program.save("model.arbiter")
    program = arbiter.load("model.arbiter")                     # in another process

exporting (``export``), program (``Program``), signature (the input check), tracing
(torch.export -> the planner's ATen graph), saving and archive (the file), safe_program
and serde_fast (the ATen program as data), loading (``load``), report (a loaded
program's report). ``load`` imports none of the compile path (the Arbiter, measuring,
torch.export's tracer): a serving process starts faster."""
from __future__ import annotations

from typing import Any

from .program import Program

__all__ = ["export", "load", "Program"]


def export(model: Any, args: tuple, kwargs: Any = None, dynamic_shapes: Any = None,
           config: Any = None) -> Program:
    """``arbiter.deploy.exporting.export`` (its docstring; docs/deploy.md)."""
    from .exporting import export as run

    return run(model, args, kwargs, dynamic_shapes, config)


def load(path: Any, **options: Any) -> Program:
    """``arbiter.deploy.loading.load`` (its docstring; docs/deploy.md)."""
    from .loading import load as run

    return run(path, **options)
