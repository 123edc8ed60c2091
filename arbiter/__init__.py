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

from ._version import __version__
from .arbiter import Arbiter
from .config import Config, load_config
from .dryrun import explain, partition
from .dynamo import last_arbiter
from .errors import ArbiterError, ConfigError, ManifestError, UnknownBackendError, UnknownOpError
from .plan.policy import Policy, register_policy
from .registry import Backend, backend_names, get_backend_class, register_backend
from .report import Report

__all__ = [
    "Arbiter", "ArbiterError", "Backend", "Config", "ConfigError", "ManifestError", "Policy",
    "Report", "UnknownBackendError", "UnknownOpError", "__version__", "backend_names",
    "explain", "get_backend_class", "last_report", "load_config", "partition",
    "register_backend", "register_policy",
]


def last_report() -> Report | None:
    """The report of the most recent ``backend="arbiter"`` compile in this process."""
    be = last_arbiter()
    return be.report() if be is not None else None
