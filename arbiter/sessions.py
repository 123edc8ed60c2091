"""The process-wide view of arbiter's torch.compile sessions and their reports.

The shared ``Arbiter`` per (config, options, mode), the one used last, and the report of
each compiled model.

Compiles with equal settings share one ``Arbiter``, and each compiled model still gets
its own report: ``report_for(compiled)``. ``reports()`` is the process-wide view (one
report per compiled model), ``last_report()`` the model compiled last.
"""
from __future__ import annotations

import json
import threading
from typing import Any, Optional

from .arbiter import Arbiter, arbiters, forget
from .config import Config
from .config.torch_compile import resolve
from .errors import warn_once
from .report import Report
from .run.owner import Owner, owner_of

_cache: dict[str, Any] = {}
_last: list = []  # [(Arbiter, Owner)] of the latest backend="arbiter" compile
_lock = threading.Lock()


def _key(options: Optional[dict], mode: Optional[str]) -> str:
    def enc(x: Any) -> Any:
        if isinstance(x, Config):
            return f"Config@{id(x)}"
        return f"{type(x).__name__}:{x}" if not isinstance(x, (dict, list, str, int, float,
                                                                bool, type(None))) else x

    return json.dumps({"options": options or {}, "mode": mode}, sort_keys=True, default=enc)


def arbiter_for(options: Optional[dict] = None, mode: Optional[str] = None, *,
                create: bool = True) -> Optional[Arbiter]:
    """The shared Arbiter of these torch.compile settings (made and cached on first use)."""
    config = (options or {}).get("config")
    shared = not isinstance(config, Config)
    key = _key(options, mode)
    with _lock:
        be = _cache.get(key) if shared else None
    if be is not None or not create:
        return be
    resolved, dry_run = resolve(options, mode)
    if dry_run:
        warn_once("arbiter: dryrun: nothing is compiled, the graphs run in eager; "
                  "arbiter.report_for(compiled) shows the plan")
    be = Arbiter(resolved, dry_run=dry_run)
    if shared:
        with _lock:
            be = _cache.setdefault(key, be)
    return be


def note_last(be: Arbiter, owner: Owner) -> None:
    """``be`` compiled a graph of ``owner`` last (``last_report``)."""
    with _lock:
        _last[:] = [(be, owner)]


def drop_all() -> None:
    """As in a fresh process: the shared Arbiters and their reports are dropped."""
    with _lock:
        dropped = list(_cache.values())
        _cache.clear()
        _last.clear()
    forget(dropped)


def last_arbiter() -> Optional[Arbiter]:
    with _lock:
        return _last[0][0] if _last else None


# -- reports per compiled model -------------------------------------------------------
def backend_of(compiled: Any) -> Optional[Arbiter]:
    """The Arbiter behind a ``torch.compile``'d model or function, if it has one
    (``find_backend``)."""
    return find_backend(compiled)[1]


def find_backend(compiled: Any) -> tuple[bool, Optional[Arbiter]]:
    """(whether ``compiled`` was compiled with arbiter, the Arbiter behind it if there is
    one yet: ``backend="arbiter"`` makes it at the first call).

    Follows Dynamo's wrappers (``dynamo_ctx.callback._torchdynamo_orig_backend``...) to
    torch.compile's backend wrapper: an ``Arbiter`` instance, or ``backend="arbiter"``
    with its options and mode (then the cached Arbiter of those settings)."""
    todo = [compiled]
    seen: set[int] = set()
    while todo and len(seen) < 32:
        obj = todo.pop(0)
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, Arbiter):
            return True, obj
        fn = getattr(obj, "compiler_fn", None)
        if fn is not None and not isinstance(obj, type):
            if isinstance(fn, Arbiter):
                return True, fn
            if getattr(fn, "__name__", "") == "arbiter_backend":
                kw = getattr(obj, "kwargs", {}) or {}
                return True, arbiter_for(kw.get("options"), kw.get("mode"), create=False)
        for attr in ("dynamo_ctx", "callback", "_torchdynamo_orig_backend", "compiler_fn"):
            v = getattr(obj, attr, None) if not isinstance(obj, type) else None
            if v is not None:
                todo.append(v)
        closure = getattr(obj, "__closure__", None)
        if closure and isinstance(obj, type(backend_of)):
            for name, cell in zip(obj.__code__.co_freevars, closure):
                if name in ("callback", "self"):
                    try:
                        todo.append(cell.cell_contents)
                    except ValueError:
                        pass
    return False, None


def report_for(model: Any, *, advice: bool = True) -> Optional[Report]:
    """The report of one compiled model: ``arbiter.report_for(torch.compile(m, backend=...))``.

    ``model`` is what torch.compile returned, or the module (any instance of its class:
    Dynamo shares graphs between instances) or function that was compiled. The Arbiter is
    the one behind the compiled model when that can be read off it, else the latest one
    that compiled graphs for this model (compiled runs before dry runs). Before the
    first call (nothing compiled yet: torch.compile compiles then) a report that says so
    (``not_called``, its ``summary()`` too); None when ``model`` was not compiled with
    arbiter at all (or it ran elsewhere)."""
    wanted = owner_of(model)
    ours, be = find_backend(model)
    if be is None:
        found = [b for b in arbiters() if _has(b, wanted)]
        found.sort(key=lambda b: not b.dry_run)  # stable: latest compiled run last
        be = found[-1] if found else None
    if be is None or not _has(be, wanted):
        if ours:
            return Report(model=getattr(wanted, "name", None), not_called=True)
        return None
    return be.report(wanted, advice=advice)


def _has(be: Arbiter, owner: Owner) -> bool:
    return any(o.key == owner.key for o in be.owners())


def reports(*, advice: bool = True) -> list[Report]:
    """The process-wide view: one report per (Arbiter, compiled model), in compile order."""
    return [be.report(owner, advice=advice) for be in arbiters() for owner in be.owners()]


def last_report(*, advice: bool = True) -> Optional[Report]:
    """The report of the model compiled last with ``backend="arbiter"`` in this process."""
    with _lock:
        last = _last[0] if _last else None
    if last is None:
        return None
    be, owner = last
    return be.report(owner, advice=advice)
