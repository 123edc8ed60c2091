"""Keep torch's process-global tracing state to the thread that traces, while a piece compiles.

Pieces compile on their first call, so one thread may export a partition while others
run compiled graphs, and torch 2.13's tracers change state every thread sees: the
exporting flag (another thread's Dynamo-compiled call then raced on
``fx_traceback.current_meta``: ``KeyError: 'custom'``), ``torch.nn.Module`` methods and
``torch.fx.wrap`` functions patched by the FX tracer, the FX tracing flag.
``tracing_in_this_thread()``, entered around a backend's compile and AOTAutograd's
tracing, makes ``torch.compiler.is_exporting`` false in other threads (unless someone
else's export had set it) and dispatches every patch made meanwhile by thread; the FX
flag stays global, so ``is_compiling`` answers True to other threads while it is set.
Re-entrant, and several threads may hold it (a compile abandoned by ``compile_timeout_s``
runs on). Where the private torch names it relies on are missing, it does nothing.
docs/robustness.md ("Racing first calls") has the failures seen and the limits.
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
