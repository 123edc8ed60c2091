"""``backend="arbiter"``: the entry point torch.compile finds without ``import arbiter``.

pyproject.toml registers ``arbiter_backend`` in the ``torch_dynamo_backends`` entry-point
group. ``torch.compile(model, backend="arbiter", options={"config": "my.yaml"})`` passes
``options`` here; the only option is ``config`` (a path, a shipped config's name, or a
dict). Arbiters are cached per config, so recompiles of one model share one report,
readable with ``arbiter.last_report()``.
"""
from __future__ import annotations

import json
import threading
from typing import Any, Optional

from .arbiter import Arbiter
from .errors import ConfigError, did_you_mean

_cache: dict[str, Any] = {}
_last: list = []
_lock = threading.Lock()
OPTIONS = ("config",)


def _key(config: Any) -> str:
    if isinstance(config, dict):
        return "dict:" + json.dumps(config, sort_keys=True, default=str)
    return f"{type(config).__name__}:{config}"


def arbiter_backend(gm, example_inputs, options: Optional[dict] = None, **kwargs):
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
