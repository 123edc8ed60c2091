"""``Program``: what ``arbiter.export`` and ``arbiter.load`` return.

A call checks its inputs against the exported signature (signature.py) and runs the
stitched partitions directly: no Dynamo, no guards, the weights handed to the stitched
graph as they were frozen. Inference only: calls run with gradients off.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .signature import Signature

_set_grad = torch._C._set_grad_enabled
_grad_enabled = torch.is_grad_enabled


@dataclass
class Source:
    """What saving needs (set on an exported program; None on a loaded one)."""

    ep: Any  # the decomposed ExportedProgram (torch.export)
    arbiter: Any  # the Arbiter that planned and compiled it
    record: Any  # its GraphRecord
    samples: tuple[list, list]  # the example inputs and the program's outputs on them
    model: str = ""


@dataclass
class Deployed:
    """How a loaded program came to be (the report's ``deployed`` section)."""

    path: str
    format_version: int
    saved_versions: dict[str, str]
    loaded_versions: dict[str, str]
    partitions: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    load_s: float = 0.0
    check: str = ""


class Program:
    """A compiled inference program (see the module). ``program(*args, **kwargs)``,
    ``program.report()``, ``program.save(path)``."""

    def __init__(self, fn: Callable, signature: Signature, weights: list[torch.Tensor],
                 report: Callable[[], Any], source: Optional[Source] = None,
                 deployed: Optional[Deployed] = None):
        self._fn = fn
        self.signature = signature
        self._weights = tuple(weights)
        self._report = report
        self._source = source
        self.deployed = deployed
        self._save_lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        sig = self.signature
        flat = sig.flatten(args, kwargs)
        sig.check(flat)
        grad = _grad_enabled()
        if grad:
            _set_grad(False)
        try:
            out = self._fn(*self._weights, *flat)
        finally:
            if grad:
                _set_grad(True)
        return sig.unflatten(out)

    def report(self) -> Any:
        """What ran where (an ``arbiter.Report``): the compile's report, and for a loaded
        program what loading did (``deployed``)."""
        return self._report()

    def save(self, path: str | os.PathLike) -> None:
        """Write the program to ``path`` (one file; docs/deploy.md)."""
        if self._source is None:
            raise TypeError("a loaded program cannot be saved again: copy its file")
        from .saving import save

        with self._save_lock:
            save(self, self._source, path)

    def __repr__(self) -> str:
        ins = ", ".join(f"{n}: {d}{list(s)}" for n, d, s in self.signature.inputs)
        where = f" loaded from {self.deployed.path}" if self.deployed else ""
        return f"<arbiter.Program({ins}){where}>"
