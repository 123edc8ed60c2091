"""``backend="arbiter"``: the entry point torch.compile finds without ``import arbiter``.

pyproject.toml registers ``arbiter_backend`` in the ``torch_dynamo_backends`` entry-point
group. ``torch.compile(model, backend="arbiter", options={"config": "my.yaml"})`` passes
``options`` here; the only option is ``config`` (a path, a shipped config's name, or a
dict). Arbiters are cached per config, so recompiles of one model share one report,
readable with ``arbiter.last_report()``.

Errors: Dynamo wraps what a backend raises in ``BackendCompilerFailed``; arbiter's own
errors (``arbiter.ConfigError`` for a bad config, at the first call) are re-raised so that
``except arbiter.ConfigError`` catches them (``_through_dynamo``).
"""
from __future__ import annotations

import json
import threading
from typing import Any, Optional

from .arbiter import Arbiter
from .errors import ArbiterError, ConfigError, did_you_mean

_cache: dict[str, Any] = {}
_last: list = []
_lock = threading.Lock()
OPTIONS = ("config",)


def _key(config: Any) -> str:
    if isinstance(config, dict):
        return "dict:" + json.dumps(config, sort_keys=True, default=str)
    return f"{type(config).__name__}:{config}"


def arbiter_backend(gm, example_inputs, options: Optional[dict] = None, **kwargs):
    try:
        return _backend(gm, example_inputs, options)
    except ArbiterError as exc:
        raise _through_dynamo(exc) from exc.__cause__


def _through_dynamo(exc: ArbiterError) -> ArbiterError:
    """``exc`` as an instance of a subclass of its own class and of Dynamo's
    ``ShortenTraceback``, which Dynamo re-raises as it is: any other exception from a
    backend reaches the user wrapped in ``BackendCompilerFailed``, where
    ``except arbiter.ConfigError`` would miss it. Same message and attributes."""
    try:
        from torch._dynamo.exc import ShortenTraceback
    except ImportError:  # a torch without it: as it is
        return exc
    base = type(exc)
    cls = _PASSTHROUGH.get(base)
    if cls is None:
        cls = _PASSTHROUGH[base] = type(base.__name__, (base, ShortenTraceback), {
            "__module__": base.__module__, "__qualname__": base.__qualname__,
            "__doc__": base.__doc__})
    new = cls.__new__(cls)
    new.args = exc.args
    new.__dict__.update(exc.__dict__)
    new.first_useful_frame = None  # nothing of Dynamo's to strip from the traceback
    return new.with_traceback(exc.__traceback__)


_PASSTHROUGH: dict = {}


def _backend(gm, example_inputs, options: Optional[dict]):
    options = dict(options or {})
    unknown = [k for k in options if k not in OPTIONS]
    if unknown:
        raise ConfigError(f"unknown option {unknown[0]!r}{did_you_mean(unknown[0], OPTIONS)}; "
                          f"valid options: {', '.join(OPTIONS)}",
                          file="torch.compile(options=...)", key=unknown[0])
    config = options.get("config")
    if hasattr(config, "model_dump"):
        be = Arbiter(config)
    else:
        with _lock:
            key = _key(config)
            be = _cache.get(key)
            if be is None:
                be = _cache[key] = Arbiter(config)
    with _lock:
        _last[:] = [be]
    return be(gm, example_inputs)


def last_arbiter():
    with _lock:
        return _last[0] if _last else None
