"""Running a partition: compile on first call, fall back down the chain on failure.

A ``Piece`` is what the stitched graph calls for one partition. It compiles lazily, on
its first call, with the real input tensors (so backends see real shapes and the inputs
need not be invented from metadata). If the chosen backend fails to compile, the next
backend of the partition's chain is tried, down to eager ATen. If a compiled piece raises
at run time, the same happens and the call is retried: the graphs are functional (AOT
functionalizes them), so a failed call changed nothing and a retry is safe. Later calls
use the demoted path. Every step is logged and kept in the piece's ``record``, which the
report reads: the report shows what actually ran, never what was planned.
"""
from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch._prims_common
from torch.utils._python_dispatch import _disable_current_modes

from .registry import Backend

log = logging.getLogger(__name__)


@dataclass
class Fallback:
    """One step down a chain: from which backend to which, at which stage, and why."""

    from_backend: str
    to_backend: str
    stage: str  # "compile" or "run"
    reason: str


@dataclass
class PieceRecord:
    """What happened to one partition. Mutable: runtime fallbacks update it."""

    partition_id: int
    planned: str
    chain: list[str]
    backend: str = ""  # what runs now ("" until compiled)
    compile_s: float = 0.0
    restride_copies: int = 0
    calls: int = 0  # counted only while timing is on (Piece.timed)
    run_s: float = 0.0
    copies: int = 0  # tensor copies made at this partition's boundary (inputs, outputs)
    verify_checks: int = 0  # accuracy checks against eager ATen (config `verify`)
    verify_max_error: Optional[float] = None
    fallbacks: list[Fallback] = field(default_factory=list)


def _reason(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    first = msg[0] if msg else ""
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    loc = f" [at {where[0].filename.rsplit('/', 1)[-1]}:{where[0].lineno}]" if where else ""
    return f"{type(exc).__name__}: {first[:300]}{loc}"


def _non_contiguous_outputs(gm: torch.fx.GraphModule) -> list[tuple[int, tuple, tuple]]:
    """(index, size, stride) of outputs whose traced strides are not contiguous ones."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    found = []
    for k, arg in enumerate(out.args[0]):
        val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor):
            continue
        if not all(isinstance(s, int) for s in (*val.shape, *val.stride())):
            continue  # symbolic: nothing static to enforce (and int() would add a guard)
        size, stride = tuple(val.shape), tuple(val.stride())
        contiguous = tuple(torch._prims_common.make_contiguous_strides_for(size))
        if val.numel() > 1 and _strides_matter(size, stride, contiguous):
            found.append((k, size, stride))
    return found


def _strides_matter(size, stride, contiguous) -> bool:
    # Dimensions of size 1 may carry any stride without changing the layout.
    return any(a != b for n, a, b in zip(size, stride, contiguous) if n > 1)


class Piece:
    """Callable for one partition; see the module docstring."""

    def __init__(self, record: PieceRecord, gm: torch.fx.GraphModule,
                 backends: Sequence[Backend], graph_label: str):
        self.record = record
        self.gm = gm  # the partition as ATen: what eager runs, and what backends compile
        self._backends = list(backends)  # the chain, the last being eager
        self._level = -1
        self._lock = threading.Lock()
        self._fn: Callable = self._first_call
        self.__name__ = f"partition_{record.partition_id}_{record.planned}"
        self.__qualname__ = self.__name__
        self.__module__ = __name__
        self._label = graph_label
        self._restride = _non_contiguous_outputs(gm)
        self.timed = False  # set by a timed run (the report's per-partition times)

    def __call__(self, *args: Any) -> Any:
        if self.timed:
            start = time.perf_counter()
            out = self._call(*args)
            self.record.run_s += time.perf_counter() - start
            self.record.calls += 1
            return out
        return self._call(*args)

    def _call(self, *args: Any) -> Any:
        try:
            out = self._fn(*args)
        except Exception as exc:  # noqa: BLE001 - any backend failure demotes the piece
            return self._demote(exc, args)
        if self._restride:
            out = list(out)
            for k, size, stride in self._restride:
                t = out[k]
                if _strides_matter(size, t.stride(), stride):
                    # Downstream views were traced against eager's strides (a transposed
                    # layout, say); a backend that returns another layout gets one copy.
                    fixed = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device)
                    fixed.copy_(t)
                    out[k] = fixed
                    self.record.restride_copies += 1
        return out

    # -- compile and demote --------------------------------------------------------
    def _first_call(self, *args: Any) -> Any:
        with self._lock:
            if self._level < 0:
                self._advance(args, None)
        return self._fn(*args)

    def _advance(self, args: Sequence[Any], failure: Optional[tuple[str, str]]) -> None:
        """Compile the next backend of the chain that compiles; must hold the lock."""
        start = time.perf_counter()
        while True:
            self._level += 1
            backend = self._backends[self._level]
            if failure is not None:
                frm, stage_reason = failure
                self._note(frm, backend.name, *stage_reason)
            if backend.inline_aten:
                self._fn = self.gm
                break
            try:
                # Backends trace (export, Dynamo) and must not see the dispatch modes
                # that AOTAutograd's runtime wrappers may have active around this call.
                with _disable_current_modes():
                    self._fn = backend.compile(self.gm, list(args))
                break
            except Exception as exc:  # noqa: BLE001 - a backend failing must not fail the user
                failure = (backend.name, ("compile", _reason(exc)))
                log.debug("compile failure detail", exc_info=True)
        self.record.backend = backend.name
        self.record.compile_s += time.perf_counter() - start

    def _demote(self, exc: Exception, args: Sequence[Any]) -> Any:
        with self._lock:
            if self._backends[self._level].inline_aten:
                raise exc  # eager ATen itself failed: the model would fail without us too
            failed = self._backends[self._level].name
            self._advance(args, (failed, ("run", _reason(exc))))
        return self._call(*args)

    def _note(self, frm: str, to: str, stage: str, reason: str) -> None:
        self.record.fallbacks.append(Fallback(frm, to, stage, reason))
        log.warning("%s partition %d: %s failed to %s (%s); falling back to %s",
                    self._label, self.record.partition_id, frm, stage, reason, to)
