"""A partition's fallback chain, typed: links as data, entries that compile.

A ``Link`` names a backend, the precision variant it runs at and the ``Mode`` it
compiles in; its label (``onnxruntime (symbolic)``, what the report and a saved file
show) is derived from those, never read back. An ``Entry`` is a link made runnable
around a ``Backend``: what ``run.piece.Piece`` walks down. ``Entry`` itself compiles
the partition as it is (``Mode.STATIC``); ``run.dynamic.Symbolic`` and ``PerShape`` and
the loader's saved artifact (``deploy.rebuild.Preloaded``) are the other modes.
``run.build.assemble`` makes entries from links, for compiling and loading alike.
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..decompose import for_backend
from ..backend import Backend


class Mode(str, enum.Enum):
    """How an entry compiles its partition."""

    STATIC = "static"  # the graph as it is (its shapes, when static)
    SYMBOLIC = "symbolic"  # once for every size its symbols take (checked at a second)
    PER_SHAPE = "per shape"  # once per concrete input shape, up to a limit
    SAVED = "saved"  # a saved artifact, loaded (arbiter.load)


@dataclass(frozen=True)
class Link:
    """One entry of a chain as data (what a saved file holds)."""

    backend: str  # the registered backend's name ("onnxruntime")
    precision: str = ""  # a lower-precision variant's label ("fp16"); "": the graph's own
    mode: Mode = Mode.STATIC

    @property
    def name(self) -> str:
        """The name the entry runs under (a variant's: ``onnxruntime:fp16``)."""
        return f"{self.backend}:{self.precision}" if self.precision else self.backend

    @property
    def label(self) -> str:
        """What the report shows for it."""
        return self.name if self.mode is Mode.STATIC else f"{self.name} ({self.mode.value})"


def link_of(backend: Backend, mode: Mode = Mode.STATIC) -> Link:
    """The link of ``backend`` (a variant: its base's name and its precision) in ``mode``."""
    return Link(backend.base_name or backend.name, backend.precision, mode)


class Entry:
    """A backend compiling a partition as it is (``Mode.STATIC``); the base of the other
    modes' entries."""

    mode = Mode.STATIC

    def __init__(self, backend: Backend):
        self.backend = backend

    @property
    def link(self) -> Link:
        return link_of(self.backend, self.mode)

    @property
    def name(self) -> str:
        return self.link.name

    @property
    def label(self) -> str:
        return self.link.label

    @property
    def precision(self) -> str:
        return self.link.precision

    @property
    def inline_aten(self) -> bool:
        return bool(self.backend.inline_aten)

    def nonfinite_guard(self, gm: torch.fx.GraphModule) -> list[str]:
        return self.backend.nonfinite_guard(gm)

    def graph_for(self, gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        """The partition as this entry compiles it: the nodes the backend's manifest
        wants decomposed, decomposed for it alone (arbiter/decompose/)."""
        return for_backend(gm, self.backend)

    def compile(self, gm: torch.fx.GraphModule, args: Sequence[Any]) -> Callable:
        return self.backend.compile(gm, list(args))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label}>"
