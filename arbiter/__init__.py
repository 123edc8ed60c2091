"""torch-arbiter: one torch.compile backend that splits graphs across many backends.

    import torch, arbiter
    compiled = torch.compile(model, backend="arbiter")        # embedded default config
    compiled(x)
    print(arbiter.report_for(compiled))                       # what ran where, this model
    print(arbiter.explain(model, x, config="my.yaml"))        # the plan, without compiling
    program = arbiter.export(model, (x,)); program.save("m.arbiter")   # docs/deploy.md
    program = arbiter.load("m.arbiter"); program(x)            # no Dynamo

The names below load on first use (PEP 562), so ``import arbiter`` (and the ``arbiter``
command's ``--help``) imports neither torch nor any backend's package. No function
shadows a submodule: ``arbiter.report`` is the subpackage, ``arbiter.report_for`` the
function (``reports()``: every model compiled here; ``last_report()``: the last one).
"""
from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__  # noqa: F401 - public

#: public name -> the module that defines it
_NAMES = {
    "Arbiter": "arbiter", "Config": "config", "load_config": "config",
    "explain": "dryrun", "partition": "dryrun",
    "last_arbiter": "sessions", "last_report": "sessions", "reports": "sessions",
    "ArbiterError": "errors", "ConfigError": "errors", "ManifestError": "errors",
    "UnknownBackendError": "errors", "UnknownOpError": "errors",
    "Policy": "plan.policy", "register_policy": "plan.policy",
    "Backend": "backend", "backend_names": "registry", "get_backend_class": "registry",
    "register_backend": "registry", "Report": "report", "report_for": "sessions",
    "tune": "measure.tune",
    "export": "deploy", "load": "deploy", "Program": "deploy",
}

__all__ = sorted([*_NAMES, "__version__"])


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    else:
        try:  # a submodule: arbiter.dynamo, arbiter.ops...
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES))
