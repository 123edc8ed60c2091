"""Running a partition: compile on first call, fall back down the chain on failure.

A ``Piece`` is what the stitched graph calls for one partition. It compiles lazily, on
its first call, with the real input tensors (so backends see real shapes and the inputs
need not be invented from metadata). If the chosen backend fails to compile, the next
backend of the partition's chain is tried, down to eager ATen. If a compiled piece raises
at run time, eager ATen runs the same inputs (the graphs are functional: AOT
functionalizes them, so a failed call changed nothing): when eager fails too, its error
is the user's (an index out of range) and is raised, with nothing demoted and no cached
artifact evicted; when it does not, that call returns eager's result and later calls use
the next backend of the chain. A compile that fails on the call's inputs is judged the
same way. Every step is logged and kept in the piece's ``record``, which the
report reads: the report shows what actually ran, never what was planned.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..cache import served
from ..config import VerifyOptions
from ..errors import describe
from ..ops import is_random
from .chain import Entry, Mode
from .checks.calls import IndexGuard, all_finite, restore, snapshot
from .checks.first_use import FirstUse
from .checks.piece_checks import PieceChecks
from .checks.verify import check_meta, output_specs
from .compiling import compile_for, compile_lock, evict
from .dynamic import Checked
from .layouts import OutputLayouts
from .record import Fallback, PieceRecord

log = logging.getLogger(__name__)

__all__ = ["Piece", "PieceRecord", "Fallback"]


class Piece:
    """Callable for one partition; see the module docstring.

    Every call of a compiled backend is checked against the partition's traced output
    metadata (count, shape, dtype, device: a few comparisons per output); a mismatch
    demotes the piece like an exception does. With ``verify`` (the config's
    ``VerifyOptions``), chosen calls copy the inputs first, check that the backend did
    not write into them nor reuse its output buffers (a second call), run the ATen graph
    in eager on the copies and compare (``arbiter.run.checks.verify.compare``); a failure
    demotes the piece (stage ``verify``) and that call returns eager's result.
    """

    def __init__(self, record: PieceRecord, gm: torch.fx.GraphModule,
                 backends: Sequence[Entry], graph_label: str,
                 verify: Optional[VerifyOptions] = None,
                 compile_timeout_s: Optional[float] = None,
                 lowered_verify: Optional[VerifyOptions] = None,
                 first_use: Optional[FirstUse] = None):
        """``verify``: the config's VerifyOptions; ``lowered_verify``: those for a backend
        of the chain that runs at a lower precision (``Entry.precision``; config
        `accuracy`: ``AccuracyOptions.verify_options``), used while it runs.
        ``first_use``: with verify mode ``unverified``, what decides and localizes the
        first-use checks (run/checks/first_use.py; a default one otherwise)."""
        self.record = record
        self.gm = gm  # the partition as ATen: what eager runs, and what backends compile
        self._backends = list(backends)  # the chain, the last being eager
        # (level in the chain, callable): one attribute, published only when the level's
        # callable is ready, so a thread never pairs a level with another level's callable
        # (it once ran the ATen graph while another thread's export had swapped its
        # constants for fake tensors: FakeTensor results, docs/robustness.md)
        self._current: tuple[int, Callable] = (-1, gm)
        self._lock = threading.Lock()
        self.__name__ = f"partition_{record.partition_id}_{record.planned}"
        self.__qualname__ = self.__name__
        self.__module__ = __name__
        self._label = graph_label
        # outputs whose layout a later view may need (run/layouts.py)
        self._layouts = OutputLayouts(gm)
        self._specs = output_specs(gm)
        # verify and first-use checks: which calls, judged how (run/checks/piece_checks.py)
        self._checks = PieceChecks(record, gm, graph_label, verify, lowered_verify, first_use,
                                   any(n.op == "call_function" and is_random(n)
                                       for n in gm.graph.nodes))
        self._device_checks = 2  # calls left whose output devices are checked
        self.timed = False  # set by a timed run (the report's per-partition times)
        self._served: list = []  # cache entries the current backend was compiled from
        self._compile_timeout = compile_timeout_s
        # level -> ops its backend computes unlike eager on non-finite inputs
        # (Backend.nonfinite_guard); set before the level is published in _current
        self._guarded: dict[int, list[str]] = {}
        # (level, callable, guarded) once calls of the current backend need nothing but
        # the output check and, where ``guarded`` (exact_nonfinite guard), the input
        # check (no verify, no restriding, devices checked): ``__call__``'s short path.
        # Reset (under the lock) whenever the level changes.
        self._fast: Optional[tuple[int, Callable, bool]] = None
        self._pending: Optional[tuple[int, str, str]] = None  # ``demote``: next call
        # positions read from the inputs (token ids), checked before a backend runs
        self._index_guard = IndexGuard.of(gm)

    def running(self) -> tuple[int, Optional[Entry], Callable]:
        """(the chain position running now, its entry, its artifact: the backend's own
        callable, without a symbolic one's per-call checks); (-1, None, the ATen graph)
        before the first call compiled anything (arbiter.deploy saves what runs)."""
        level, fn = self._current
        if level < 0:
            return level, None, fn
        return level, self._backends[level], fn.fn if isinstance(fn, Checked) else fn

    @property
    def _fn(self) -> Callable:
        """The callable of the current level (bench/ reads it)."""
        return self._current[1]

    def __call__(self, *args: Any) -> Any:
        fast = self._fast
        if fast is not None and not self.timed:
            # the steady state: the backend's call and the output check, as in _call
            level, fn, guarded = fast
            if guarded and not all_finite(args):  # exact_nonfinite guard, as in _call
                return self._nonfinite_call(self._backends[level], args)
            if self._index_guard is not None and not self._index_guard.ok(args):
                return self.gm(*args)  # an index out of range: eager's error, the user's
            try:
                out = fn(*args)
            except Exception as exc:  # noqa: BLE001 - demote unless eager fails too
                return self._failed_run(level, exc, args)
            if self._specs is not None:
                why = check_meta(out, self._specs, False)
                if why is not None:
                    self._demote_from(level, "run", f"wrong output: {why}", args)
                    return self._call(*args)
            return out
        if self.timed:
            start = time.perf_counter()
            out = self._call(*args)
            self.record.run_s += time.perf_counter() - start
            self.record.calls += 1
            return out
        return self._call(*args)

    def demote(self, stage: str, reason: str) -> None:
        """Move past the current backend on the next call (config `accuracy`'s drift
        watch: the graph's check failed, not one of this piece's own)."""
        with self._lock:
            self._pending = (self._current[0], stage, reason)
            self._fast = None

    def _call(self, *args: Any) -> Any:
        pending, self._pending = self._pending, None
        if pending is not None:
            self._demote_from(pending[0], pending[1], pending[2], args)
        if self._current[0] < 0:
            with compile_lock(), self._lock:
                if self._current[0] < 0:
                    self._advance(args, None)
        while True:
            level, fn = self._current
            backend = self._backends[level]
            if backend.inline_aten:
                return fn(*args)  # eager ATen: its errors are the model's own
            if level in self._guarded and not all_finite(args):
                return self._nonfinite_call(backend, args)
            if self._index_guard is not None and not self._index_guard.ok(args):
                return self.gm(*args)  # an index out of range: eager's error, the user's
            due = self._checks.mode != "off" and self._checks.due()
            # verified calls: the reference is computed from the inputs as they were
            # before the backend ran (it might write into them)
            before = snapshot(args) if due else None
            try:
                out = fn(*args)
            except Exception as exc:  # noqa: BLE001 - demote unless eager fails too
                if before is not None:
                    restore(args, before)
                return self._failed_run(level, exc, args)
            if self._specs is not None:
                devices = self._device_checks > 0  # first calls only: see check_meta
                if devices:
                    self._device_checks -= 1
                why = check_meta(out, self._specs, devices)
                if why is not None:
                    if before is not None:
                        restore(args, before)
                    self._demote_from(level, "run", f"wrong output: {why}", args)
                    continue
                if devices:  # first calls: which outputs come in another layout
                    self._learn_layouts(level, backend.name, out)
            if before is not None:
                why, expected = self._checks.judge(level, backend, fn, args, before, out)
                if why is not None:  # demoted; that call returns eager's result
                    self._demote_from(level, "verify", why, args)
                    return expected
            elif self._fast is None and self._checks.mode == "off" and \
                    not self._layouts.restride and self._device_checks <= 0:
                self._go_fast(level, fn)
            return self._layouts.restrided(out, self.record)

    def _failed_run(self, level: int, exc: Exception, args: Sequence[Any]) -> Any:
        """The backend at ``level`` raised ``exc`` on ``args``: unless eager fails too
        (``_eager_or_users_error``), the piece is demoted and this call returns eager's
        result."""
        out = self._eager_or_users_error(args, exc, self._backends[level].name)
        self._demote_from(level, "run", describe(exc), args)
        return out

    def _eager_or_users_error(self, args: Sequence[Any], exc: Exception, who: str) -> Any:
        """Eager ATen's result on ``args``, after backend ``who`` failed on them with ``exc``
        (at run time, or compiling: a first-use check runs the inputs); the graphs are
        functional, so the failure changed nothing. When eager fails too, its error is
        the user's and is raised (``exc`` chained), before anything is demoted or
        evicted."""
        try:
            return self.gm(*args)
        except Exception as users:
            log.info("%s partition %d: %s failed (%s) and eager fails on the same inputs: "
                     "the caller's error, nothing demoted", self._label,
                     self.record.partition_id, who, describe(exc))
            raise users from exc

    def _nonfinite_call(self, backend: Entry, args: Sequence[Any]) -> Any:
        """A call with NaN or inf in an input, on a backend that computes some of the
        partition's ops unlike eager there (``exact_nonfinite: guard``): eager ATen runs
        it; the backend stays for the next call."""
        with self._lock:
            self.record.nonfinite_calls += 1
            first = self.record.nonfinite_calls == 1
        if first:
            log.warning("%s partition %d: an input holds NaN or inf and %s computes %s "
                        "unlike eager there: such calls run in eager ATen "
                        "(exact_nonfinite: guard)", self._label, self.record.partition_id,
                        backend.name, ", ".join(self.record.nonfinite_ops))
        return self.gm(*args)

    def _go_fast(self, level: int, fn: Callable) -> None:
        """Let ``__call__`` take its short path with ``fn``, unless the level moved on."""
        with self._lock:
            if self._current == (level, fn):
                self._fast = (level, fn, level in self._guarded)

    def _learn_layouts(self, level: int, name: str, out: Sequence[Any]) -> None:
        """The outputs the backend at ``level`` returned in another layout than the
        traced one are copied into it from now on (run/layouts.py)."""
        found = self._layouts.differing(out)
        if not found:
            return
        with self._lock:
            if self._current[0] != level:
                return
            self._layouts.add(found)
        for k, size, stride in found:
            log.info("%s partition %d: %s returns output %d (shape %s) with strides %s, "
                     "traced %s: copied into the traced layout on every call",
                     self._label, self.record.partition_id, name, k, list(size),
                     tuple(out[k].stride()), stride)

    # -- compile and demote --------------------------------------------------------
    def _advance(self, args: Sequence[Any], failure: Optional[tuple[str, str]]) -> None:
        """Compile the next backend of the chain that compiles; must hold the locks."""
        start = time.perf_counter()
        level = self._current[0]
        got = self.gm  # the graph the backend compiled (eager: the partition as planned)
        while True:
            level += 1
            backend = self._backends[level]
            if failure is not None:
                frm, stage_reason = failure
                self._note(frm, backend.name, *stage_reason,
                           per_shape=getattr(backend, "mode", None) == Mode.PER_SHAPE)
            if backend.inline_aten:
                fn = self.gm
                break
            loaded: list = []  # persistent-cache entries the compile used
            got = self.gm
            try:
                skip = self._checks.first_use.skip(backend, self.gm, args) \
                    if self._checks.checks_unverified(backend) else None
                if skip is not None:
                    failure = (backend.name, ("verify", skip))
                    continue
                # Progress for long compiles (`arbiter report` shows these on stderr).
                log.info("%s partition %d: compiling with %s", self._label,
                         self.record.partition_id, backend.name)
                # Backends trace (export, Dynamo) and must not see the dispatch modes
                # that AOTAutograd's runtime wrappers may have active around this call.
                with _disable_current_modes(), served() as loaded:
                    fn, got = compile_for(backend, self.gm, list(args), self._compile_timeout)
                self._served = list(loaded)
                # A compiled callable may count the copies it makes (inputs made
                # contiguous...) into the record's `copies` (docs/resources.md).
                attach = getattr(fn, "attach_record", None)
                if attach is not None:
                    attach(self.record)
                log.info("%s partition %d: compiled with %s in %.2f s", self._label,
                         self.record.partition_id, backend.name, time.perf_counter() - start)
                break
            except Exception as exc:  # noqa: BLE001 - a backend failing must not fail the user
                self._eager_or_users_error(args, exc, backend.name)
                failure = (backend.name, ("compile", describe(exc)))
                log.debug("compile failure detail", exc_info=True)
                evict(loaded, f"{backend.name} failed to compile with it ({describe(exc)})")
        self._checks.start(level, backend, got)
        self._fast = None
        self._layouts.reset()  # the new backend's are learned
        self._device_checks = 2
        guard = [] if backend.inline_aten else backend.nonfinite_guard(self.gm)
        if guard:
            self._guarded[level] = guard
        self.record.nonfinite_ops = list(guard)
        self.record.backend = backend.name
        self.record.precision = backend.precision
        self.record.compile_s += time.perf_counter() - start
        self._current = (level, fn)

    def _demote_from(self, level: int, stage: str, reason: str, args: Sequence[Any]) -> None:
        """Move past the backend at ``level``, unless another thread already did."""
        with compile_lock(), self._lock:
            if self._current[0] == level:
                failed = self._backends[level].name
                # kept, a cached artifact that failed would fail in every later process
                evict(self._served, f"{failed} failed to {stage} with it ({reason})")
                self._served = []
                self._advance(args, (failed, (stage, reason)))

    def _note(self, frm: str, to: str, stage: str, reason: str,
              per_shape: bool = False) -> None:
        self.record.fallbacks.append(Fallback(frm, to, stage, reason))
        # the same backend next in the chain: its per-shape entry after its symbolic one
        # ("falling back to onnxruntime" from onnxruntime read as a failure to itself)
        then = f"{to} compiles it per shape instead" if to == frm and per_shape \
            else f"{to} compiles it again" if to == frm else f"falling back to {to}"
        log.warning("%s partition %d: %s failed to %s (%s); %s",
                    self._label, self.record.partition_id, frm, stage, reason, then)
