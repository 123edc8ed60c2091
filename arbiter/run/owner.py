"""Which compiled model a graph belongs to: its *owner*.

Dynamo calls a backend with a graph and its inputs only. To give each compiled model
its own report (``arbiter.report_for(compiled_model)``), the ``Arbiter`` asks, when Dynamo
hands it a graph, which ``torch.compile``'d callable is running: the innermost frame of
Dynamo's own wrapper (``compile_wrapper`` in ``torch/_dynamo/eval_frame.py``) holds it
as ``fn``. Where that frame is not found (another Dynamo version, a direct call), the
frame Dynamo is tracing (``InstructionTranslator.current_tx()``) stands in: its ``self``
when it is a module, else its code. Nothing here is needed for correctness: an unknown
owner only means the graph is reported under ``?``.

An owner is keyed by the module's *class*, or by the function's code: Dynamo reuses a
compiled graph for every instance of a module class whose guards pass (parameters are
graph inputs), so the graphs a model runs are those compiled for its class.
"""
from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any, Hashable, Optional

import torch

#: The frame of Dynamo's wrapper around a compiled callable, and the name of its closure
#: variable holding that callable (torch 2.6 - 2.13).
_WRAPPER_NAMES = ("compile_wrapper", "_fn")
_EVAL_FRAME = "eval_frame.py"


@dataclass(frozen=True)
class Owner:
    """A compiled model (``name``: ``BertModel``, or ``module.function``), matched by ``key``."""

    name: str
    key: Hashable

    def __str__(self) -> str:
        return self.name


UNKNOWN = Owner("?", ("unknown",))


def _unwrap(obj: Any) -> Any:
    """The user's module or function behind a compiled model or a bound method."""
    seen = 0
    while seen < 8:
        seen += 1
        if isinstance(obj, torch.nn.Module) and "_orig_mod" in getattr(obj, "_modules", {}):
            obj = obj._modules["_orig_mod"]  # OptimizedModule
            continue
        orig = getattr(obj, "_torchdynamo_orig_callable", None)
        if orig is not None and orig is not obj:
            obj = orig
            continue
        if isinstance(obj, types.MethodType) and isinstance(obj.__self__, torch.nn.Module):
            obj = obj.__self__
            continue
        wrapped = getattr(obj, "__wrapped__", None)  # functools.wraps (Dynamo's wrap_inline)
        if isinstance(obj, types.FunctionType) and wrapped is not None:
            obj = wrapped
            continue
        break
    return obj


def owner_of(obj: Any) -> Owner:
    """The owner key of a model as the user holds it: a compiled model
    (``torch.compile``'s result), the module or function that was compiled, or a class."""
    obj = _unwrap(obj)
    if isinstance(obj, type):
        return Owner(obj.__name__, ("module", obj))
    if isinstance(obj, torch.nn.Module):
        return Owner(type(obj).__name__, ("module", type(obj)))
    code = getattr(obj, "__code__", None)
    if code is None and hasattr(obj, "__call__"):
        code = getattr(type(obj).__call__, "__code__", None)
    if code is None:
        return Owner(type(obj).__name__, ("object", type(obj)))
    name = f"{getattr(obj, '__module__', '') or ''}.{getattr(obj, '__qualname__', code.co_name)}"
    return Owner(name.lstrip("."), ("code", code))


def _compiled_callable() -> Any:
    """The ``torch.compile``'d callable whose graph Dynamo is compiling now (the ``fn``
    of Dynamo's innermost wrapper frame on this thread's stack), or None."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name in _WRAPPER_NAMES and code.co_filename.endswith(_EVAL_FRAME):
            fn = frame.f_locals.get("fn")
            if fn is not None:
                return fn
        frame = frame.f_back
    return None


def current_owner() -> Owner:
    """The owner of the graph Dynamo is compiling now (call from inside a backend)."""
    try:
        fn = _compiled_callable()
        if fn is not None:
            return owner_of(fn)
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        this = tx.f_locals.get("self")
        if isinstance(this, torch.nn.Module):
            return owner_of(this)
        return Owner(tx.f_code.co_name, ("code", tx.f_code))
    except Exception:  # noqa: BLE001 - an unknown owner is reported as such
        return UNKNOWN


def compiling_fsdp_module() -> bool:
    """Whether the model Dynamo is compiling now holds a module whose parameters FSDP2
    (``fully_shard``) manages: ``fully_shard`` marks each such module
    ``_is_fsdp_managed_module`` (for Dynamo, torch 2.4 - 2.13). False when the compiled
    model is not found (a function, another Dynamo version)."""
    try:
        this = _unwrap(_compiled_callable())
        if not isinstance(this, torch.nn.Module):
            from torch._dynamo.symbolic_convert import InstructionTranslator

            this = _unwrap(InstructionTranslator.current_tx().f_locals.get("self"))
        return isinstance(this, torch.nn.Module) and any(
            getattr(m, "_is_fsdp_managed_module", False) for m in this.modules())
    except Exception:  # noqa: BLE001 - not found: nothing known to be FSDP-managed
        return False


def matches(graph_owner: Optional[Owner], wanted: Owner) -> bool:
    return graph_owner is not None and graph_owner.key == wanted.key
