"""OpenVINO's compiled partitions saved as IR and read back (arbiter.deploy; docs/deploy.md).

``openvino.save_model`` writes the converted model (weights uncompressed, so float32
stays float32), ``Core.read_model`` reads it from memory and it is compiled with the
loading config's options (threads, precision hint, device).
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from collections.abc import Callable
from typing import Any, Optional

import torch

from arbiter.shapes import graph_is_symbolic, input_values

from ._export import outputs_of
from ._openvino_plugin import properties_for

FILES = ("model.xml", "model.bin")


def save(runner: Any) -> Optional[tuple[dict, dict[str, bytes]]]:
    """(entry, files) of an ``OvRunner`` that kept its converted model; None otherwise."""
    import openvino as ov

    model = getattr(runner, "model", None)
    if model is None:
        return None
    with tempfile.TemporaryDirectory(prefix="arbiter-ov-") as tmp:
        ov.save_model(model, str(Path(tmp) / "model.xml"), compress_to_fp16=False)
        files = {name: (Path(tmp) / name).read_bytes() for name in FILES}
    return {"format": "openvino-ir"}, files


def load(backend: Any, entry: dict, files: dict[str, bytes], gm: torch.fx.GraphModule,
         runner: Callable, passthrough: Callable):
    """A ``runner`` (the backend's ``OvRunner``) for the partition ``gm`` from saved IR,
    compiled with ``backend``'s options; ``passthrough(model)``: its outputs that are
    inputs as they are."""
    import numpy as np
    import openvino as ov

    if entry.get("format") != "openvino-ir" or not set(FILES) <= set(files):
        raise ValueError(f"not an OpenVINO IR artifact (entry {entry}, files {sorted(files)})")
    core = ov.Core()
    weights = ov.Tensor(np.frombuffer(files["model.bin"], dtype=np.uint8).copy())
    model = core.read_model(model=files["model.xml"].decode("utf-8"), weights=weights)
    values = input_values(gm)
    args = tuple(torch.empty(0, dtype=v.dtype) if isinstance(v, torch.Tensor) else 0
                 for v in values)
    compiled = core.compile_model(model, backend.options.device,
                                  properties_for(model, backend.properties()))
    out = runner(compiled, args, outputs_of(gm), passthrough(model),
                 values if graph_is_symbolic(gm) else None)
    out.model = model
    return out
