"""Compile once, ship, run without Dynamo (docs/deploy.md).

    program = arbiter.export(model, (x,), dynamic_shapes=...)   # torch.export + arbiter
    program(x)                                                  # no Dynamo, one input check
    program.save("model.arbiter")
    program = arbiter.load("model.arbiter")                     # in another process

exporting (``export``), program (``Program``), signature (the input check), tracing
(torch.export -> the planner's ATen graph), saving and archive (the file), safe_program
(the ATen program as data), loading (``load``), report (a loaded program's report)."""
from __future__ import annotations

from .exporting import export
from .loading import load
from .program import Program

__all__ = ["export", "load", "Program"]
