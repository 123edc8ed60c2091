"""``backend="arbiter"``: the entry point torch.compile finds without ``import arbiter``,
and one report per compiled model.

pyproject.toml registers ``arbiter_backend`` in the ``torch_dynamo_backends`` entry-point
group. torch.compile passes its ``options`` and ``mode`` here:

* ``options``: ``config`` (a path, a shipped config's name, a dict or an
  ``arbiter.Config``; the embedded default when absent), and any top-level config key,
  flat (``min_block_size``, ``policy``, ``pin``, ``verify``...), which overrides the
  config's value (mappings such as ``verify`` are merged one level deep) and is
  validated like the YAML file; ``dryrun`` (Torch-TensorRT's name; ``dry_run`` too):
  plan without compiling, the graphs run in eager; ``torch_executed_ops`` (Torch-TensorRT's
  name) is read as ``exclude_ops``, with a warning.
* ``mode`` (``MODES``): ``max-autotune`` and ``max-autotune-no-cudagraphs`` select policy
  ``measure`` (unless the config or options name a policy) and set ``mode`` on every
  backend whose options have one (Inductor's max-autotune); ``reduce-overhead`` (CUDA
  graphs over the whole call) is refused, with what to do instead.

Arbiters are cached per (config, options, mode): compiles with equal settings share one
``Arbiter``, and each compiled model still gets its own report: ``report_for(compiled)``.
``reports()`` is the process-wide view (one report per compiled model), ``last_report()``
the model compiled last.

Errors: Dynamo wraps what a backend raises in ``BackendCompilerFailed``; arbiter's own
errors (``arbiter.ConfigError`` for a bad config or option, at the first call) are
re-raised so that ``except arbiter.ConfigError`` catches them (``_through_dynamo``).
"""
from __future__ import annotations

import json
import logging
import threading
from typing import Any, Optional

from .arbiter import Arbiter, arbiters, forget
from .config import Config, config_from_dict, load_config
from .errors import ArbiterError, ConfigError, did_you_mean, warn_at_user_line
from .report import Report
from .run.owner import Owner, current_owner, owner_of

log = logging.getLogger(__name__)

_cache: dict[str, Any] = {}
_last: list = []  # [(Arbiter, Owner)] of the latest backend="arbiter" compile
_lock = threading.Lock()
#: what torch.compile(options=...) takes besides the config's own top-level keys
EXTRA_OPTIONS = ("config", "dryrun")
#: other projects' names for the same things (Torch-TensorRT's), read with a warning
ALIASES = {"torch_executed_ops": "exclude_ops", "dry_run": "dryrun"}
#: torch.compile(mode=...) -> what it means here (None: refused, see _mode_settings)
MODES = ("default", "max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead")
_FILE = "torch.compile(options=...)"


def config_keys() -> list[str]:
    return [k for k in Config.model_fields if k != "source"]


def valid_options() -> list[str]:
    return [*EXTRA_OPTIONS, *config_keys()]


# -- warnings once, at the user's line ------------------------------------------------
_warned: set[str] = set()


def warn_once(message: str, category: type[Warning] = UserWarning) -> None:
    """A warning at the user's line, once per message per process."""
    with _lock:
        if message in _warned:
            return
        _warned.add(message)
    warn_at_user_line(message, category)


# -- mode and options -----------------------------------------------------------------
def _mode_settings(mode: Optional[str]) -> tuple[dict, str]:
    """(config keys implied by ``mode``, the ``mode`` for backends that take one)."""
    if mode in (None, "default"):
        return {}, ""
    if mode in ("max-autotune", "max-autotune-no-cudagraphs"):
        return {"policy": "measure"}, mode
    if mode == "reduce-overhead":
        raise ConfigError(
            "mode 'reduce-overhead' (CUDA graphs over the whole compiled call) is not "
            "supported: arbiter stitches backends with Python calls between partitions. "
            "Use mode 'default' or 'max-autotune', or give Inductor CUDA graphs through "
            "options={'backends': [{'name': 'inductor', 'options': {'options': "
            "{'triton.cudagraphs': True}}}]}", file="torch.compile(mode=...)", key="mode")
    raise ConfigError(f"unknown mode {mode!r}{did_you_mean(str(mode), MODES)}; valid modes: "
                      f"{', '.join(MODES)}", file="torch.compile(mode=...)", key="mode")


def _merge(base: dict, key: str, value: Any) -> Any:
    old = base.get(key)
    if isinstance(old, dict) and isinstance(value, dict):
        return {**old, **value}
    return value


def resolve(options: Optional[dict] = None, mode: Optional[str] = None
            ) -> tuple[Config, bool]:
    """The config (validated) and dry-run flag that ``options`` and ``mode`` ask for."""
    if options is not None and not isinstance(options, dict):
        raise ConfigError(f"options must be a dict, not {type(options).__name__}", file=_FILE)
    options = dict(options or {})
    for alias, name in ALIASES.items():
        if alias in options:
            if name in options:
                raise ConfigError(f"options {alias!r} and {name!r} say the same thing; give "
                                  f"one", file=_FILE, key=alias)
            warn_once(f"torch.compile(options={{{alias!r}: ...}}) is read as {name!r}")
            options[name] = options.pop(alias)
    valid = valid_options()
    unknown = [k for k in options if k not in valid]
    if unknown:
        raise ConfigError(f"unknown option {unknown[0]!r}{did_you_mean(unknown[0], valid)}; "
                          f"valid options: {', '.join(valid)}", file=_FILE, key=unknown[0])
    dry_run = options.pop("dryrun", False)
    if not isinstance(dry_run, bool):
        raise ConfigError(f"dryrun must be true or false, not {dry_run!r}", file=_FILE,
                          key="dryrun")
    # the embedded default's policy gives way to mode's; a config the user names keeps its own
    named = options.get("config") not in (None, "default")
    base = load_config(options.pop("config", None))
    implied, backend_mode = _mode_settings(mode)
    if not options and not implied and not backend_mode:
        return base, dry_run
    data = base.model_dump(mode="json")
    for key, value in implied.items():
        if key not in options and (not named or data.get(key) == Config.model_fields[key].default):
            data[key] = value  # a policy the user's config or the options name wins over mode's
    for key, value in options.items():
        data[key] = _merge(data, key, value)
    if backend_mode:
        data["backends"] = [_with_mode(spec, backend_mode) for spec in data["backends"]]
    config = config_from_dict(data, _FILE)
    config.source = f"{base.source or 'default'} + {_FILE}" if options else \
        f"{base.source or 'default'} + torch.compile(mode={mode!r})"
    return config, dry_run


def _with_mode(spec: Any, mode: str) -> Any:
    """A backend spec with ``mode`` set where the backend's options have a ``mode`` field
    and the config did not set one."""
    from .registry import get_backend_class

    spec = {"name": spec} if isinstance(spec, str) else dict(spec)
    try:
        fields = get_backend_class(spec["name"]).Options.model_fields
    except ArbiterError:
        return spec  # an unknown name: the config's validation says so
    opts = dict(spec.get("options") or {})
    if "mode" in fields and opts.get("mode") is None:
        opts["mode"] = mode
        spec["options"] = opts
    return spec


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


def arbiter_backend(gm, example_inputs, options: Optional[dict] = None,
                    mode: Optional[str] = None, **kwargs):
    try:
        return _backend(gm, example_inputs, options, mode, kwargs)
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


def _backend(gm, example_inputs, options: Optional[dict], mode: Optional[str], kwargs: dict):
    if kwargs:
        raise ConfigError(f"unexpected torch.compile argument(s) {', '.join(sorted(kwargs))}; "
                          "arbiter takes options= and mode=", file=_FILE)
    be = arbiter_for(options, mode)
    with _lock:
        _last[:] = [(be, current_owner())]
    return be(gm, example_inputs)


def _reset() -> None:
    """``torch._dynamo.reset()`` calls this (through torch.compile's backend wrapper):
    as in a fresh process, the shared Arbiters and their reports are dropped."""
    with _lock:
        dropped = list(_cache.values())
        _cache.clear()
        _last.clear()
    forget(dropped)


arbiter_backend.reset = _reset  # type: ignore[attr-defined]


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

