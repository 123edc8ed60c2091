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

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch._prims_common
from torch.utils._python_dispatch import _disable_current_modes

from ..cache import served
from ..decompose import for_backend
from ..errors import describe
from ..ops import is_random, output_values, tensors_in
from ..registry import Backend
from .first_use import FirstUse, FirstUseCheck
from .isolation import tracing_in_this_thread
from .verify import check_meta, compare, output_specs

log = logging.getLogger(__name__)


@dataclass
class Fallback:
    """One step down a chain: from which backend to which, at which stage, and why."""

    from_backend: str
    to_backend: str
    stage: str  # "compile", "run" (raised, or wrong output metadata) or "verify"
    reason: str


@dataclass
class PieceRecord:
    """What happened to one partition. Mutable: runtime fallbacks update it."""

    partition_id: int
    planned: str
    chain: list[str]
    backend: str = ""  # what runs now ("" until compiled)
    precision: str = ""  # the running backend's lower precision ("bf16"); "": the graph's
    compile_s: float = 0.0
    restride_copies: int = 0
    calls: int = 0  # counted only while timing is on (Piece.timed)
    run_s: float = 0.0
    copies: int = 0  # tensor copies made at this partition's boundary (inputs, outputs)
    verify_checks: int = 0  # accuracy checks against eager ATen (config `verify`)
    verify_max_error: Optional[float] = None
    fallbacks: list[Fallback] = field(default_factory=list)
    shapes: str = "static"  # or "symbolic" (one artifact), "per shape" (run.dynamic)
    specializations: int = 0  # shapes compiled, when "per shape"
    # exact_nonfinite: guard: the ops the running backend computes unlike eager on NaN or
    # inf inputs, and the calls that therefore ran in eager (an input held NaN or inf)
    nonfinite_ops: list[str] = field(default_factory=list)
    nonfinite_calls: int = 0
    # verify `unverified`: each backend's first-use check (run/first_use.py)
    first_use: list[FirstUseCheck] = field(default_factory=list)


def _compile_lock():
    """The lock that serializes compiles process-wide: Dynamo's own when it has one.

    Backends trace and compile with process-global state (export, Inductor, Dynamo's
    config), so pieces compiling in two threads, or beside Dynamo compiling another
    model, must take turns. Taking Dynamo's lock (an RLock) rather than one of our own
    keeps a single lock order: Dynamo holds it while it calls us to plan (and the
    `measure` policy runs pieces then), and a piece takes it before its own lock.
    """
    global _COMPILE_LOCK
    if _COMPILE_LOCK is None:
        try:
            from torch._dynamo.convert_frame import compile_lock
        except ImportError:  # a torch without it: our own, same order
            compile_lock = threading.RLock()
        _COMPILE_LOCK = compile_lock
    return _COMPILE_LOCK


_COMPILE_LOCK = None


class CompileTimeout(Exception):
    """A backend's compile did not finish within the config's ``compile_timeout_s``."""


def _compile(backend: Backend, gm: torch.fx.GraphModule, args: list,
             timeout: Optional[float]) -> tuple[Callable, torch.fx.GraphModule]:
    """``backend.compile(gm, args)``, the nodes its manifest wants decomposed decomposed
    for it alone (arbiter/decompose.py: the next backends and eager get ``gm`` as it is),
    and the graph the backend got; with a ``timeout``, in a helper thread waited for at
    most that long (CompileTimeout after).

    Python cannot stop a thread: a compile that hangs keeps running in its (daemon)
    thread, holding what it holds, and its result is dropped. The helper thread gets the
    caller's grad and inference modes and context variables (the cache's record of the
    entries a compile used); it has no dispatch mode, like the caller's compile under
    ``_disable_current_modes``. Dynamo's compile lock stays with the waiting caller, so
    a backend that takes that lock itself would wait for it, and time out."""
    def build() -> tuple[Callable, torch.fx.GraphModule]:
        got = for_backend(gm, backend)  # traced (make_fx) like the compile
        return backend.compile(got, args), got

    if timeout is None:
        with tracing_in_this_thread():  # torch's tracing state stays in this thread
            return build()
    ctx = contextvars.copy_context()
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
    result: dict = {}
    done = threading.Event()

    def work() -> None:
        try:
            with torch.inference_mode(inference), torch.set_grad_enabled(grad), \
                    tracing_in_this_thread():
                result["fn"] = ctx.run(build)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            result["exc"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=work, daemon=True,
                              name=f"arbiter-compile-{backend.name}")
    worker.start()
    if not done.wait(timeout):
        raise CompileTimeout(f"{backend.name} did not finish compiling within "
                             f"{timeout:g} s (compile_timeout_s); its thread is left "
                             "running and its result will be dropped")
    if "exc" in result:
        raise result["exc"]
    return result["fn"]


def _all_finite(args: Sequence[Any]) -> bool:
    """Whether every floating-point tensor among ``args`` is free of NaN and inf. One sum
    per tensor (NaN and inf survive a sum; 15 us for 150k float32 values here, where
    ``isfinite(t).all()`` took milliseconds), confirmed element-wise only when the sum is
    not finite (finite values can overflow it)."""
    for a in args:
        for t in tensors_in(a):
            if t.is_floating_point() and t.numel() and not torch.isfinite(t.sum()):
                if not bool(torch.isfinite(t).all()):
                    return False
    return True


def _snapshot(args: Sequence[Any]) -> list:
    """Copies of the tensor arguments (same strides where the layout allows)."""
    return [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]


def _restore(args: Sequence[Any], before: Sequence[Any]) -> None:
    """Write the copies back into the arguments a backend changed."""
    for a, b in zip(args, before):
        if isinstance(a, torch.Tensor) and not _same_bits(a, b):
            try:
                with torch.no_grad():
                    a.copy_(b)
            except RuntimeError:  # an expanded (overlapping) input cannot be written
                log.debug("cannot restore an input", exc_info=True)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN equals the same NaN, -0.0 differs from 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    try:
        return torch.equal(a.detach().reshape(-1).contiguous().view(torch.uint8),
                           b.detach().reshape(-1).contiguous().view(torch.uint8))
    except RuntimeError:  # a layout without a byte view (sparse...)
        return bool(torch.equal(a, b))


def _shared_buffers(first: Any, second: Any, args: Sequence[Any] = ()
                    ) -> Optional[tuple[int, int]]:
    """(i, j) when output j of the second call shares memory with output i of the
    first, else None. An output that is a view of an input (``args``) shares the
    input's memory on every call by design (a compiled ``view``, ``t``, or an input
    returned as it is): not a reused buffer."""
    def spans(outs):
        found = []
        for k, t in enumerate(outs if isinstance(outs, (list, tuple)) else ()):
            if isinstance(t, torch.Tensor) and t.numel() and t.layout == torch.strided:
                st = t.untyped_storage()
                found.append((k, st.data_ptr(), st.data_ptr() + st.nbytes(), t.device))
        return found

    def overlap(a, b) -> bool:
        return a[3] == b[3] and a[1] < b[2] and b[1] < a[2]

    inputs = spans(list(tensors_in(list(args))))
    earlier = [s for s in spans(first) if not any(overlap(s, i) for i in inputs)]
    for span in spans(second):
        if any(overlap(span, i) for i in inputs):
            continue
        for old in earlier:
            if overlap(span, old):
                return old[0], span[0]
    return None


def _evict(loaded: Sequence[tuple], why: str) -> None:
    """Remove persistent-cache entries a failed compile or run was built from."""
    for cache, kind, key in loaded:
        cache.evict(kind, key, why)


def _non_contiguous_outputs(gm: torch.fx.GraphModule) -> list[tuple[int, tuple, tuple]]:
    """(index, size, stride) of outputs whose traced strides are not contiguous ones."""
    return [o for o in _traced_layouts(gm) if o[3]]


def _traced_layouts(gm: torch.fx.GraphModule) -> list[tuple[int, tuple, tuple, bool]]:
    """(index, size, stride, not contiguous) of every output whose traced layout a copy
    can restore: static sizes and strides, more than one element, not expanded."""
    found = []
    for k, val in enumerate(output_values(gm) or ()):
        if not isinstance(val, torch.Tensor):
            continue
        if not all(isinstance(s, int) for s in (*val.shape, *val.stride())):
            continue  # symbolic: nothing static to enforce (and int() would add a guard)
        size, stride = tuple(val.shape), tuple(val.stride())
        contiguous = tuple(torch._prims_common.make_contiguous_strides_for(size))
        if any(st == 0 and n > 1 for n, st in zip(size, stride)):
            # An expanded (overlapping) layout cannot be written by a copy; the backend's
            # dense result holds the same values and any view of it is valid.
            continue
        if val.numel() > 1:
            found.append((k, size, stride, _strides_matter(size, stride, contiguous)))
    return found


def _strides_matter(size, stride, contiguous) -> bool:
    # Dimensions of size 1 may carry any stride without changing the layout.
    return any(a != b for n, a, b in zip(size, stride, contiguous) if n > 1)


class Piece:
    """Callable for one partition; see the module docstring.

    Every call of a compiled backend is checked against the partition's traced output
    metadata (count, shape, dtype, device: a few comparisons per output); a mismatch
    demotes the piece like an exception does. With ``verify`` (the config's
    ``VerifyOptions``), chosen calls copy the inputs first, check that the backend did
    not write into them nor reuse its output buffers (a second call), run the ATen graph
    in eager on the copies and compare (``arbiter.run.verify.compare``); a failure
    demotes the piece (stage ``verify``) and that call returns eager's result.
    """

    def __init__(self, record: PieceRecord, gm: torch.fx.GraphModule,
                 backends: Sequence[Backend], graph_label: str, verify: Any = None,
                 compile_timeout_s: Optional[float] = None, lowered_verify: Any = None,
                 first_use: Optional[FirstUse] = None):
        """``verify``: the config's VerifyOptions; ``lowered_verify``: the same kind of
        settings (mode, every_n, tolerances) for a backend of the chain that runs at a
        lower precision (``Backend.precision``; config `accuracy`), used while it runs.
        ``first_use``: with verify mode ``unverified``, what decides and localizes the
        first-use checks (run/first_use.py; a default one otherwise)."""
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
        # outputs whose layout a later view may need: every call restrides those traced
        # non-contiguous; the others are compared on the first calls of each backend and
        # join ``_restride`` for it if it returns another layout (``_learn_layouts``)
        layouts = _traced_layouts(gm)
        self._layouts = [(k, size, stride) for k, size, stride, _ in layouts]
        self._restride_traced = [(k, size, stride) for k, size, stride, odd in layouts
                                 if odd]
        self._restride = list(self._restride_traced)
        self._specs = output_specs(gm)
        self._verify_cfg = verify
        self._lowered_cfg = lowered_verify
        self._first_use = first_use or FirstUse(getattr(verify, "tolerances", None))
        # the check under way: (level, graph the backend got, its unverified pairs)
        self._checking: Optional[tuple[int, torch.fx.GraphModule, list]] = None
        self._draws_random = any(n.op == "call_function" and is_random(n)
                                 for n in gm.graph.nodes)
        self._use_verify(verify)
        self._since_compile = 0  # calls of the current backend (verify `every`)
        self._device_checks = 2  # calls left whose output devices are checked
        self._verify_pending = False  # verify `first`: the next call is checked
        self.timed = False  # set by a timed run (the report's per-partition times)
        self._served: list = []  # cache entries the current backend was compiled from
        self._compile_timeout = compile_timeout_s
        # level -> ops its backend computes unlike eager on non-finite inputs
        # (Backend.nonfinite_guard); set before the level is published in _current
        self._guarded: dict[int, list[str]] = {}
        # (level, callable) once calls of the current backend need nothing but the output
        # check (no verify, no restriding, devices checked): ``__call__``'s short path.
        # Reset (under the lock) whenever the level changes.
        self._fast: Optional[tuple[int, Callable]] = None

    @property
    def _fn(self) -> Callable:
        """The callable of the current level (bench/ reads it)."""
        return self._current[1]

    def __call__(self, *args: Any) -> Any:
        fast = self._fast
        if fast is not None and not self.timed:
            # the steady state: the backend's call and the output check, as in _call
            level, fn = fast
            try:
                out = fn(*args)
            except Exception as exc:  # noqa: BLE001 - demote, then the full path
                self._demote_from(level, "run", describe(exc), args)
                return self._call(*args)
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

    def _call(self, *args: Any) -> Any:
        if self._current[0] < 0:
            with _compile_lock(), self._lock:
                if self._current[0] < 0:
                    self._advance(args, None)
        while True:
            level, fn = self._current
            backend = self._backends[level]
            if backend.inline_aten:
                return fn(*args)  # eager ATen: its errors are the model's own
            if level in self._guarded and not _all_finite(args):
                return self._nonfinite_call(backend, args)
            due = self._verify_mode != "off" and self._due()
            # verified calls: the reference is computed from the inputs as they were
            # before the backend ran (it might write into them)
            before = _snapshot(args) if due else None
            try:
                out = fn(*args)
            except Exception as exc:  # noqa: BLE001 - any backend failure demotes the piece
                if before is not None:
                    _restore(args, before)
                self._demote_from(level, "run", describe(exc), args)
                continue  # retry: the graphs are functional, the failed call changed nothing
            if self._specs is not None:
                devices = self._device_checks > 0  # first calls only: see check_meta
                if devices:
                    self._device_checks -= 1
                why = check_meta(out, self._specs, devices)
                if why is not None:
                    if before is not None:
                        _restore(args, before)
                    self._demote_from(level, "run", f"wrong output: {why}", args)
                    continue
                if devices:  # first calls: which outputs come in another layout
                    self._learn_layouts(level, backend.name, out)
            if before is not None:
                expected = self._verify(level, fn, args, before, out)
                if expected is not None:
                    return expected
            elif self._fast is None and self._verify_mode == "off" and \
                    not self._restride and self._device_checks <= 0 and \
                    level not in self._guarded:  # exact_nonfinite guard: inputs checked
                self._go_fast(level, fn)
            return self._restrided(out)

    def _nonfinite_call(self, backend: Any, args: Sequence[Any]) -> Any:
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
                self._fast = (level, fn)

    def _learn_layouts(self, level: int, name: str, out: Sequence[Any]) -> None:
        """Add to ``_restride`` (for the backend at ``level``) the outputs it returned in
        another layout than the traced one. The nodes after this partition were traced
        against eager's layout, and a ``view`` among them fails on another (an eager
        fallback raised "view size is not compatible" on GPT-2 training: it received a
        key cache traced contiguous in the transposed order of Inductor's decomposition
        of a one-tensor ``cat``; docs/robustness.md). A compiled artifact's output
        layouts are fixed by its input layouts, themselves the traced ones, so the first
        calls decide; the steady state checks only the outputs found here."""
        seen = {k for k, _, _ in self._restride}
        found = [(k, size, stride) for k, size, stride in self._layouts if k not in seen
                 and isinstance(out[k], torch.Tensor)
                 and _strides_matter(size, out[k].stride(), stride)]
        if not found:
            return
        with self._lock:
            if self._current[0] != level:
                return
            self._restride = sorted(self._restride + found)
        for k, size, stride in found:
            log.info("%s partition %d: %s returns output %d (shape %s) with strides %s, "
                     "traced %s: copied into the traced layout on every call",
                     self._label, self.record.partition_id, name, k, list(size),
                     tuple(out[k].stride()), stride)

    def _restrided(self, out: Any) -> Any:
        if not self._restride:
            return out
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

    # -- accuracy checks -------------------------------------------------------------
    def _checks_unverified(self, backend: Any) -> bool:
        """Whether ``backend`` runs under verify mode ``unverified`` here."""
        lowered = bool(getattr(backend, "precision", "")) and self._lowered_cfg is not None
        cfg = self._lowered_cfg if lowered else self._verify_cfg
        return not backend.inline_aten and getattr(cfg, "mode", "off") == "unverified"

    def _plan_first_use(self, level: int, backend: Any, got: torch.fx.GraphModule) -> None:
        """Verify mode ``unverified``: the next call is checked against eager when
        ``got`` (what the backend compiled) holds an unverified (op, dtype)."""
        symbolic = getattr(backend, "mode", "") == "symbolic"
        items = self._first_use.needed(backend, got, symbolic)
        if not items:
            return
        check = FirstUseCheck(backend.name, [str(u) for u in items])
        self.record.first_use.append(check)
        if self._draws_random:
            check.result = "not checked: the partition draws random numbers"
            log.warning("%s partition %d: %s runs unverified ops (%s) unchecked: the "
                        "partition draws random numbers (random: backend)", self._label,
                        self.record.partition_id, backend.name, check.unverified[0])
            return
        self._verify_mode = "first"
        self._checking = (level, got, items)
        log.info("%s partition %d: %s holds ops no probe verified (%s%s): its first call "
                 "is checked against eager", self._label, self.record.partition_id,
                 backend.name, ", ".join(check.unverified[:3]),
                 f" and {len(items) - 3} more" if len(items) > 3 else "")

    def _first_use_done(self, level: int, why: Optional[str], before: list) -> None:
        """Record the outcome of a first-use check (``why``: what failed, or None)."""
        checking, self._checking = self._checking, None
        if checking is None or checking[0] != level or not self.record.first_use:
            return
        check = self.record.first_use[-1]
        if why is None:
            check.result = "passed"
            return
        check.result, check.detail = "failed", why.removeprefix("differs from eager: ")
        if not why.startswith("differs from eager"):
            return  # not wrong numbers (an input written, a buffer reused, a second call
            # that raised): demoted, nothing to trace to an op
        _, got, items = checking
        with _compile_lock():
            found = self._first_use.localize(self._backends[level], got, before, items, why)
        check.findings = [f.label() for f in found]

    def _use_verify(self, verify: Any) -> None:
        self._verify_mode = getattr(verify, "mode", "off") if verify is not None else "off"
        if self._verify_mode not in ("off", "unverified") and self._draws_random:
            # a partition drawing random numbers (config `random: backend`) cannot equal
            # eager's draw: nothing to compare
            log.info("%s partition %d draws random numbers: verify skips it", self._label,
                     self.record.partition_id)
            self._verify_mode = "off"
        self._verify_every = int(getattr(verify, "every_n", 1) or 1)
        self._tolerances = getattr(verify, "tolerances", None)

    def _due(self) -> bool:
        if self._verify_mode == "first":
            due, self._verify_pending = self._verify_pending, False
            return due
        n = self._since_compile
        self._since_compile = n + 1
        return n % self._verify_every == 0

    def _verify(self, level: int, fn: Callable, args: Sequence[Any], before: list,
                out: Any) -> Optional[list]:
        """Check a verified call; on a failure demote and return eager's result.

        ``before`` holds copies of the inputs taken before the backend ran: the reference
        is eager ATen on them, so a backend writing into its inputs cannot change the
        reference. Checked in order: the inputs were not written (they are restored if
        they were: eager nodes after this partition read them); a second call does not
        return the first call's buffers (a result the user holds would change under
        them); the numbers match eager within tolerance."""
        rec = self.record
        rec.verify_checks += 1
        why = None
        again = None
        try:
            again = fn(*args)  # a second call on the same inputs: are buffers reused?
        except Exception as exc:  # noqa: BLE001 - a backend failure demotes the piece
            why = f"failed on a second call with the same inputs ({describe(exc)})"
        written = [k for k, (a, b) in enumerate(zip(args, before))
                   if isinstance(a, torch.Tensor) and not _same_bits(a, b)]
        if written:
            _restore(args, before)
            why = (f"wrote into its input{'s' if len(written) > 1 else ''} "
                   f"{', '.join(map(str, written))} (partition inputs are read-only)")
        elif why is None:
            shared = _shared_buffers(out, again, args)
            if shared is not None:
                why = (f"returns the same output buffer on every call (output {shared[1]} of "
                       f"a second call is output {shared[0]} of the first): results the "
                       "caller holds would change")
        expected = list(self.gm(*before))
        if why is None:
            cmp = compare(expected, list(out), self._tolerances)
            if rec.verify_max_error is None or cmp.max_error > rec.verify_max_error:
                rec.verify_max_error = cmp.max_error
            if cmp.ok:
                self._first_use_done(level, None, before)
                return None
            why = f"differs from eager: {cmp.detail}"
        self._first_use_done(level, why, before)
        self._demote_from(level, "verify", why, args)
        return expected

    # -- compile and demote --------------------------------------------------------
    def _advance(self, args: Sequence[Any], failure: Optional[tuple[str, str]]) -> None:
        """Compile the next backend of the chain that compiles; must hold the locks."""
        start = time.perf_counter()
        level = self._current[0]
        while True:
            level += 1
            backend = self._backends[level]
            if failure is not None:
                frm, stage_reason = failure
                self._note(frm, backend.name, *stage_reason)
            if backend.inline_aten:
                fn = self.gm
                break
            loaded: list = []  # persistent-cache entries the compile used
            got = self.gm
            try:
                skip = self._first_use.skip(backend, self.gm, args) \
                    if self._checks_unverified(backend) else None
                if skip is not None:
                    failure = (backend.name, ("verify", skip))
                    continue
                # Progress for long compiles (`arbiter report` shows these on stderr).
                log.info("%s partition %d: compiling with %s", self._label,
                         self.record.partition_id, backend.name)
                # Backends trace (export, Dynamo) and must not see the dispatch modes
                # that AOTAutograd's runtime wrappers may have active around this call.
                with _disable_current_modes(), served() as loaded:
                    fn, got = _compile(backend, self.gm, list(args), self._compile_timeout)
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
                failure = (backend.name, ("compile", describe(exc)))
                log.debug("compile failure detail", exc_info=True)
                _evict(loaded, f"{backend.name} failed to compile with it ({describe(exc)})")
        lowered = bool(getattr(backend, "precision", ""))  # a variant: its own checks
        self._use_verify(self._lowered_cfg if lowered and self._lowered_cfg is not None
                         else self._verify_cfg)
        self._checking = None
        if self._verify_mode == "unverified":
            self._verify_mode = "off"
            if not backend.inline_aten:
                self._plan_first_use(level, backend, got)
        self._fast = None
        self._restride = list(self._restride_traced)  # the new backend's are learned
        self._since_compile = 0
        self._device_checks = 2
        self._verify_pending = not backend.inline_aten
        guard = [] if backend.inline_aten else backend.nonfinite_guard(self.gm)
        if guard:
            self._guarded[level] = guard
        self.record.nonfinite_ops = list(guard)
        self.record.backend = backend.name
        self.record.precision = getattr(backend, "precision", "") or ""
        self.record.compile_s += time.perf_counter() - start
        self._current = (level, fn)

    def _demote_from(self, level: int, stage: str, reason: str, args: Sequence[Any]) -> None:
        """Move past the backend at ``level``, unless another thread already did."""
        with _compile_lock(), self._lock:
            if self._current[0] == level:
                failed = self._backends[level].name
                # kept, a cached artifact that failed would fail in every later process
                _evict(self._served, f"{failed} failed to {stage} with it ({reason})")
                self._served = []
                self._advance(args, (failed, (stage, reason)))

    def _note(self, frm: str, to: str, stage: str, reason: str) -> None:
        self.record.fallbacks.append(Fallback(frm, to, stage, reason))
        log.warning("%s partition %d: %s failed to %s (%s); falling back to %s",
                    self._label, self.record.partition_id, frm, stage, reason, to)
