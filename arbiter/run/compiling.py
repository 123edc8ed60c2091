"""Compiling one partition with one backend: the compile lock, the timeout, the eviction.

The process-wide compile lock, the config's ``compile_timeout_s`` (a helper thread), and
the persistent-cache entries a failed compile was built from evicted.
"""
from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Sequence
from typing import Optional

import torch

from .chain import Entry
from .isolation import tracing_in_this_thread


def compile_lock():
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
            from torch._dynamo.convert_frame import compile_lock as lock
        except ImportError:  # a torch without it: our own, same order
            lock = threading.RLock()
        _COMPILE_LOCK = lock
    return _COMPILE_LOCK


_COMPILE_LOCK = None


class CompileTimeout(Exception):
    """A backend's compile did not finish within the config's ``compile_timeout_s``."""


def compile_for(backend: Entry, gm: torch.fx.GraphModule, args: list,
                timeout: Optional[float]) -> tuple[Callable, torch.fx.GraphModule]:
    """``backend.compile(gm, args)`` (a chain entry) on the graph as that entry gets it
    (``Entry.graph_for``: the nodes its manifest wants decomposed, decomposed for it
    alone; the next entries and eager get ``gm`` as it is), and that graph; with a
    ``timeout``, in a helper thread waited for at most that long (CompileTimeout after).

    Python cannot stop a thread: a compile that hangs keeps running in its (daemon)
    thread, holding what it holds, and its result is dropped. The helper thread gets the
    caller's grad and inference modes and context variables (the cache's record of the
    entries a compile used); it has no dispatch mode, like the caller's compile under
    ``_disable_current_modes``. Dynamo's compile lock stays with the waiting caller, so
    a backend that takes that lock itself would wait for it, and time out."""
    def build() -> tuple[Callable, torch.fx.GraphModule]:
        got = backend.graph_for(gm)  # traced (make_fx) like the compile
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


def evict(loaded: Sequence[tuple], why: str) -> None:
    """Remove persistent-cache entries a failed compile or run was built from."""
    for cache, kind, key in loaded:
        cache.evict(kind, key, why)
