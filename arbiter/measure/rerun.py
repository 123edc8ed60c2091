"""Running a graph that writes into its inputs more than once, unseen by the user.

A graph AOTAutograd lowered with ``keep_inference_input_mutations`` ends in ``copy_``
nodes into the inputs it changes (a KV cache, a position counter, BatchNorm's running
statistics). Its first call times candidates, judges lower-precision ones against config
`accuracy` and mixes placements, running the graph many times: each run must start from
the inputs as the user handed them (else a cache position runs past the cache's end),
and the user's tensors are written once, by the call that returns. ``Rerun`` finds the
inputs a graph writes (``written_inputs``), gives measuring private copies (``begin``)
and wraps each candidate so that every run starts from their first state (``build``);
the restores' time (``restore_s``) is left out of the timing. docs/generation.md says
what went wrong before.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch
import torch.fx

from ..ops import is_mutating


def written_inputs(gm: torch.fx.GraphModule) -> Optional[tuple[int, ...]]:
    """Positions of the placeholders ``gm`` writes into, directly or through a view (an
    argument the op's schema marks ``Tensor(a!)``); None when a write's target cannot be
    traced back (every tensor input is then taken as written)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    index = {p: i for i, p in enumerate(placeholders)}
    base: dict[torch.fx.Node, Optional[int]] = {p: index[p] for p in placeholders}
    written: set[int] = set()
    for n in gm.graph.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        schema = n.target._schema
        returns = [r.alias_info for r in schema.returns]
        for arg, value in zip(schema.arguments, _positional(n, schema)):
            info = arg.alias_info
            if info is None or not isinstance(value, torch.fx.Node):
                continue
            src = base.get(value)
            if info.is_write:
                if value not in base:  # written, and we cannot say whose memory it is
                    return None
                if src is not None:
                    written.add(src)
            if src is not None and any(r is not None and r.before_set & info.before_set
                                       for r in returns):
                base[n] = src  # a view of (or the written) input
        if is_mutating(n) and not any(a.alias_info is not None and a.alias_info.is_write
                                      for a in schema.arguments):
            return None  # mutable by schema, yet no argument says which
    return tuple(sorted(written))


def _positional(node: torch.fx.Node, schema: Any) -> list:
    """The node's value of each schema argument, in the schema's order."""
    out = []
    for k, arg in enumerate(schema.arguments):
        if k < len(node.args):
            out.append(node.args[k])
        else:
            out.append(node.kwargs.get(arg.name))
    return out


class Rerun:
    """The re-runs of one graph's first call; a no-op for a graph that writes nothing."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.written = written_inputs(gm)  # None: every tensor input
        self.restore_s = 0.0  # seconds spent restoring, left out of timings
        self._private: dict[int, torch.Tensor] = {}
        self._start: dict[int, torch.Tensor] = {}

    @property
    def writes(self) -> bool:
        return self.written is None or bool(self.written)

    def begin(self, args: Sequence[Any]) -> list:
        """Private copies of the inputs the graph writes (the rest as they are): what the
        runs of measuring get; the copies' state now is what each run starts from."""
        args = list(args)
        if not self.writes:
            return args
        which = range(len(args)) if self.written is None else self.written
        self._private, self._start = {}, {}
        for i in which:
            a = args[i] if i < len(args) else None
            if isinstance(a, torch.Tensor):
                with torch.no_grad():
                    args[i] = self._private[i] = a.detach().clone()
                    self._start[i] = a.detach().clone()
        return args

    def restore(self, args: Sequence[Any]) -> None:
        """Put the private copies among ``args`` back to their first state; tensors that
        are not the private copies (the user's own, another sample's) are left alone."""
        if not self._private:
            return
        t0 = time.perf_counter()
        with torch.no_grad():
            for i, t in self._private.items():
                if i < len(args) and args[i] is t:
                    t.copy_(self._start[i])
        self.restore_s += time.perf_counter() - t0

    def build(self, build: Callable) -> Callable:
        """``build`` whose callables restore the private copies before each run."""
        if not self.writes:
            return build

        def restoring(cand: Any) -> tuple[Callable, Any]:
            fn, records = build(cand)
            return Restoring(fn, self), records
        return restoring


class Restoring:
    """A candidate's callable that restores the inputs it was given before each run; its
    stitched graph (``graph``) stays readable, for the pieces it calls."""

    def __init__(self, fn: Callable, rerun: Rerun):
        self.fn = fn
        self.rerun = rerun
        self.__name__ = getattr(fn, "__name__", "restoring")

    @property
    def graph(self) -> Any:
        return getattr(self.fn, "graph", None)

    def __call__(self, *args: Any) -> Any:
        self.rerun.restore(args)
        return self.fn(*args)


def restore_seconds(fn: Any) -> float:
    """Seconds ``fn`` (a ``Restoring``) has spent restoring inputs so far; 0 otherwise."""
    rerun = getattr(fn, "rerun", None)
    return rerun.restore_s if isinstance(rerun, Rerun) else 0.0
