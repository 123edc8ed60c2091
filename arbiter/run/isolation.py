"""Keep torch's process-global tracing state to the thread that traces, while a piece
compiles.

Pieces compile on their first call, so in a process serving several threads one thread
may export a partition (torch.export, make_fx) while others run compiled graphs. In
torch 2.13 tracing changes state every thread sees:

* ``torch.compiler._is_exporting_flag`` and ``_is_compiling_flag`` (module globals): in
  another thread, each call of a Dynamo-compiled graph then enters
  ``fx_traceback.annotate`` (eval_frame.py), which adds and deletes a key of the global
  ``fx_traceback.current_meta`` that the exporting thread is swapping node by node: the
  other thread got ``KeyError: 'custom'`` (8 threads making the first call under
  ``cpu_all``, 1 round in 9 at first, 1 in 1 with a 12-partition model here);
* ``torch.nn.Module.__call__`` and ``__getattr__``, and functions marked ``torch.fx.wrap``,
  patched by ``torch.fx``'s tracer (``_Patcher``): another thread's module calls and
  attribute reads went through the exporting thread's tracer (``module_call_wrapper``,
  ``_AttrProxy``), where healthy partitions failed with errors from the tracer's fake
  tensors.

* ``torch.fx._symbolic_trace._is_fx_tracing_flag``: another thread's call of a
  Dynamo-compiled function raised "Detected that you are using FX to symbolically trace
  a dynamo-optimized function" when the tracing thread had not also set the compiling
  flag.

``tracing_in_this_thread()``, entered around a backend's compile by the thread running
it (and around AOTAutograd's tracing in ``Arbiter.__call__``: with 8 racing first calls
Dynamo compiles the frame in several threads while others already run it), makes those visible to that thread only where it can: ``torch.compiler.is_exporting``
answers False in other threads while it is active (unless the flag was already set when
it began: someone else's export), and every patch ``_Patcher`` makes meanwhile
dispatches by thread (the tracing thread gets the patched function, the others the
original). The FX tracing flag is a module global no function reads through an
attribute, so it stays visible; ``torch.compiler.is_compiling`` answers True to other
threads while it is set, so that ``is_fx_symbolic_tracing()`` stays false for them, as
it already was during an export (which sets both flags). Re-entrant, and several threads may hold it (a compile abandoned by
``compile_timeout_s`` keeps running in its own). What it cannot cover: Dynamo's own tracing
before it calls arbiter (it sets the compiling flag), tracing by code other than
arbiter's, and state other libraries keep globally. Where torch's private names it relies on are missing, it does nothing.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable

_lock = threading.Lock()
_owners: dict[int, int] = {}  # thread id -> depth
_saved: dict[str, Any] = {}
_preset: dict[str, bool] = {}  # flags already set when the first owner began


@contextlib.contextmanager
def tracing_in_this_thread():
    """See the module docstring."""
    me = threading.get_ident()
    with _lock:
        if not _owners:
            _install()
        _owners[me] = _owners.get(me, 0) + 1
    try:
        yield
    finally:
        with _lock:
            _owners[me] -= 1
            if not _owners[me]:
                del _owners[me]
            if not _owners:
                _uninstall()


def _visible() -> bool:
    return threading.get_ident() in _owners or not _owners


def _install() -> None:
    try:
        import torch.compiler as tc
        from torch.fx import _symbolic_trace as st
    except ImportError:
        return
    if not hasattr(tc, "_is_exporting_flag") or not hasattr(st, "_Patcher"):
        return  # another torch: nothing known to isolate
    _preset["exporting"] = bool(tc._is_exporting_flag)
    _preset["compiling"] = bool(getattr(tc, "_is_compiling_flag", False))
    _saved.update(is_exporting=tc.is_exporting, is_compiling=tc.is_compiling,
                  patch=st._Patcher.patch, patch_method=st._Patcher.patch_method)
    orig_exporting, orig_compiling = tc.is_exporting, tc.is_compiling

    @functools.wraps(orig_exporting)
    def is_exporting() -> bool:
        return orig_exporting() and (_visible() or _preset.get("exporting", False))

    @functools.wraps(orig_compiling)
    def is_compiling() -> bool:
        # Not hidden from other threads: torch.fx's `_is_fx_tracing_flag` (a module
        # global read inside is_fx_symbolic_tracing()) cannot be, and is_compiling() true
        # is what keeps is_fx_symbolic_tracing() false there, so that their
        # Dynamo-compiled calls do not raise "Detected that you are using FX to
        # symbolically trace a dynamo-optimized function". Tracing without the
        # compiling flag (make_fx) gets it too, for the same reason.
        if orig_compiling():
            return True
        return not _visible() and bool(getattr(st, "_is_fx_tracing_flag", False))

    orig_patch, orig_patch_method = st._Patcher.patch, st._Patcher.patch_method

    def patch(self, frame_dict, name, new_fn, deduplicate=True):
        import builtins

        before = frame_dict.get(name, getattr(builtins, name, None))
        return orig_patch(self, frame_dict, name, _by_thread(new_fn, before), deduplicate)

    def patch_method(self, cls, name, new_fn, deduplicate=True):
        return orig_patch_method(self, cls, name, _by_thread(new_fn, getattr(cls, name)),
                                 deduplicate)

    tc.is_exporting, tc.is_compiling = is_exporting, is_compiling
    st._Patcher.patch, st._Patcher.patch_method = patch, patch_method


def _uninstall() -> None:
    if not _saved:
        return
    import torch.compiler as tc
    from torch.fx import _symbolic_trace as st

    tc.is_exporting, tc.is_compiling = _saved["is_exporting"], _saved["is_compiling"]
    st._Patcher.patch, st._Patcher.patch_method = _saved["patch"], _saved["patch_method"]
    _saved.clear()
    _preset.clear()


def _by_thread(new_fn: Callable, orig_fn: Any) -> Callable:
    """``new_fn`` for the threads tracing, ``orig_fn`` for the others. A patch that was
    already dispatching (nested tracing) is not wrapped twice."""
    if orig_fn is None or getattr(new_fn, "__arbiter_by_thread__", False):
        return new_fn
    tracer_thread = threading.get_ident()

    @functools.wraps(new_fn)
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == tracer_thread:
            return new_fn(*args, **kwargs)
        return orig_fn(*args, **kwargs)

    dispatch.__arbiter_by_thread__ = True
    return dispatch
