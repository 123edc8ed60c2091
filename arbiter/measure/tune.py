"""``arbiter.tune(compiled, batches)``: calibration inputs from the user (docs/precision.md).

Without it a graph decides on its first call, on that call's inputs alone. Inside
``tune`` every graph that measures on its first call (``graph.MeasuredGraph``) does not
decide yet: each call runs the graph in float32 eager, and its inputs and eager's
outputs are kept as one calibration ``Sample``. When the batches are done, each such
graph decides on all of its samples: the candidates are timed on the first, lower-
precision ones are judged against the bound (config `accuracy`) on all but the held-out
share (``accuracy.holdout``), and the chosen placement's errors are measured again on
the held-out ones, which no step of the search saw.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..errors import ArbiterError


@dataclass
class Sample:
    """One calibration input of a graph: its arguments and float32 eager's outputs."""

    args: list
    ref: list
    rng: Optional[torch.Tensor] = None  # torch's RNG state eager's run began with


def keep(args: Sequence[Any]) -> list:
    """A copy of a call's arguments that later calls cannot change."""
    return [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]


class Session:
    """The graphs that met calibration inputs inside one ``tune``, in the order met."""

    def __init__(self) -> None:
        self.graphs: list[Any] = []  # MeasuredGraph, each once

    def met(self, graph: Any) -> None:
        if not any(g is graph for g in self.graphs):
            self.graphs.append(graph)


_local = threading.local()


def current() -> Optional[Session]:
    """The calibration under way in this thread, or None."""
    return getattr(_local, "session", None)


@contextlib.contextmanager
def _session() -> Iterator[Session]:
    if current() is not None:
        raise ArbiterError("arbiter.tune cannot be nested")
    _local.session = Session()
    try:
        yield _local.session
    finally:
        _local.session = None


def tune(compiled: Any, batches: Iterable[Any]) -> int:
    """Run ``compiled`` (what ``torch.compile(..., backend="arbiter")`` returned, or any
    callable) on each of ``batches`` (a tuple of positional arguments each, or a single
    tensor) and let each graph met decide on all of them (see the module docstring).
    Call it before the model's first real call: a graph that decided already keeps its
    choice. Returns how many graphs decided."""
    count = 0
    with _session() as session, torch.no_grad():
        for batch in batches:
            args = batch if isinstance(batch, (tuple, list)) else (batch,)
            compiled(*args)
            count += 1
    if not count:
        raise ArbiterError("arbiter.tune: no batches given (it needs at least one)")
    for graph in session.graphs:
        graph.decide_calibrated()
    return len(session.graphs)
