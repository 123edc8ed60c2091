"""Writing a backend's manifest from what the backend itself declares.

``arbiter manifest BACKEND`` asks the backend class for ``declared_ops()`` (for
onnxruntime: the ops of PyTorch's ONNX exporter registry; for inductor: its lowerings and
decompositions) and writes ``capabilities/<backend>.yaml`` with every entry marked
``verified: declared`` and the versions it came from. Entries are only as good as the
source they are declared from; probing them (OpInfo) is what marks them verified.
"""
from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any, Optional

import torch
import yaml

from ..ops import op_name
from ..registry import get_backend_class


def generate(backend: str, defaults: Optional[dict[str, Any]] = None,
             existing: Optional[Path] = None) -> str:
    cls = get_backend_class(backend)
    declared = cls.declared_ops()
    inst = cls()
    ok, why = inst.plannable()  # declaring needs the package, not a device
    if not ok:
        raise RuntimeError(f"cannot generate the {backend} manifest: {why}")
    keep: dict[str, Any] = {}
    if existing is not None and existing.exists():
        old = yaml.safe_load(existing.read_text()) or {}
        keep = {k: old[k] for k in ("defaults", "decompositions") if k in old}
    doc: dict[str, Any] = {
        "backend": backend,
        "format": 1,
        "source": (f"`arbiter manifest {backend}` on {datetime.date.today().isoformat()}: "
                   f"declared by {cls.__module__}.{cls.__qualname__}.declared_ops() "
                   f"(torch {torch.__version__}; {inst.version()})"),
        "defaults": keep.get("defaults", defaults or {}),
    }
    if declared is None:
        doc["ops"] = {"*": {}}
    else:
        doc["ops"] = {op_name(op): (entry or {}) for op, entry in
                      sorted(declared.items(), key=lambda kv: op_name(kv[0]))}
    for k in ("decompositions",):
        if k in keep:
            doc[k] = keep[k]
    header = (f"# Capability manifest of the {backend} backend. Generated: edit `defaults`\n"
              f"# and `decompositions` by hand (they are kept on regeneration);\n"
              f"# regenerate ops with `arbiter manifest {backend} --write`.\n")
    return header + yaml.safe_dump(doc, sort_keys=False, width=100, default_flow_style=None)
