"""torch-arbiter: one torch.compile backend that splits graphs across many backends.

    import torch, arbiter
    out = torch.compile(model, backend="arbiter")(x)          # embedded default config
    be = arbiter.Arbiter("my.yaml")
    out = torch.compile(model, backend=be)(x)
    print(be.report())                                        # what actually ran where
    print(arbiter.explain(model, x, config="my.yaml"))        # the plan, without compiling

Heavy packages (onnxruntime, openvino, triton...) are imported by their backend, on use.
"""
from __future__ import annotations

from .arbiter import Arbiter
from .config import Config, load_config
from .errors import (ArbiterError, BackendUnavailableError, ConfigError, ManifestError,
                     UnknownBackendError, UnknownOpError)
from .explain import explain, partition
from .registry import Backend, backend_names, get_backend_class, register_backend
from .report import Report

__version__ = "0.1.0"

__all__ = [
    "Arbiter", "ArbiterError", "Backend", "BackendUnavailableError", "Config", "ConfigError",
    "ManifestError", "Report", "UnknownBackendError", "UnknownOpError", "backend_names",
    "explain", "get_backend_class", "last_report", "load_config", "partition",
    "register_backend",
]


def last_report() -> Report | None:
    """The report of the most recent ``backend="arbiter"`` compile in this process."""
    from .dynamo import last_arbiter

    be = last_arbiter()
    return be.report() if be is not None else None
