"""torch-arbiter: one torch.compile backend that splits graphs across many backends.

    import torch, arbiter
    compiled = torch.compile(model, backend="arbiter")        # embedded default config
    compiled(x)
    print(arbiter.report(compiled))                           # what ran where, this model
    compiled = torch.compile(model, backend="arbiter", mode="max-autotune",
                             options={"config": "my.yaml", "min_block_size": 2})
    print(arbiter.explain(model, x, config="my.yaml"))        # the plan, without compiling

``report(compiled)``: one compiled model; ``reports()``: every model compiled in this
process; ``last_report()``: the model compiled last with ``backend="arbiter"``. Heavy
packages (onnxruntime, openvino, triton...) are imported by their backend, on use.
"""
from __future__ import annotations

from ._version import __version__
from .arbiter import Arbiter
from .config import Config, load_config
from .dryrun import explain, partition
from .dynamo import last_arbiter, last_report, report, reports
from .errors import ArbiterError, ConfigError, ManifestError, UnknownBackendError, UnknownOpError
from .plan.policy import Policy, register_policy
from .registry import Backend, backend_names, get_backend_class, register_backend
from .report import Report

__all__ = [
    "Arbiter", "ArbiterError", "Backend", "Config", "ConfigError", "ManifestError", "Policy",
    "Report", "UnknownBackendError", "UnknownOpError", "__version__", "backend_names",
    "explain", "get_backend_class", "last_arbiter", "last_report", "load_config",
    "partition", "register_backend", "register_policy", "report", "reports",
]
