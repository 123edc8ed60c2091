"""What ``torch.compile(backend="arbiter", options=..., mode=...)`` asks for, as a config.

``resolve`` reads them into a validated config:

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
"""
from __future__ import annotations

from typing import Any, Optional

from ..errors import ArbiterError, ConfigError, did_you_mean, warn_once
from . import Config, config_from_dict, load_config

#: what torch.compile(options=...) takes besides the config's own top-level keys
EXTRA_OPTIONS = ("config", "dryrun")
#: other projects' names for the same things (Torch-TensorRT's), read with a warning
ALIASES = {"torch_executed_ops": "exclude_ops", "dry_run": "dryrun"}
#: torch.compile(mode=...) -> what it means here (None: refused, see _mode_settings)
MODES = ("default", "max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead")
FILE = "torch.compile(options=...)"


def config_keys() -> list[str]:
    return [k for k in Config.model_fields if k != "source"]


def valid_options() -> list[str]:
    return [*EXTRA_OPTIONS, *config_keys()]


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
        raise ConfigError(f"options must be a dict, not {type(options).__name__}", file=FILE)
    options = dict(options or {})
    for alias, name in ALIASES.items():
        if alias in options:
            if name in options:
                raise ConfigError(f"options {alias!r} and {name!r} say the same thing; give "
                                  f"one", file=FILE, key=alias)
            warn_once(f"torch.compile(options={{{alias!r}: ...}}) is read as {name!r}")
            options[name] = options.pop(alias)
    valid = valid_options()
    unknown = [k for k in options if k not in valid]
    if unknown:
        raise ConfigError(f"unknown option {unknown[0]!r}{did_you_mean(unknown[0], valid)}; "
                          f"valid options: {', '.join(valid)}", file=FILE, key=unknown[0])
    dry_run = options.pop("dryrun", False)
    if not isinstance(dry_run, bool):
        raise ConfigError(f"dryrun must be true or false, not {dry_run!r}", file=FILE,
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
    config = config_from_dict(data, FILE)
    config.source = f"{base.source or 'default'} + {FILE}" if options else \
        f"{base.source or 'default'} + torch.compile(mode={mode!r})"
    return config, dry_run


def _with_mode(spec: Any, mode: str) -> Any:
    """A backend spec with ``mode`` set where the backend's options have a ``mode`` field
    and the config did not set one."""
    from ..registry import get_backend_class

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
