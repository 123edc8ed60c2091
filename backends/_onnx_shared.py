"""An ONNX model saved without the weights the program holds already (deploy/shared.py).

Each initializer whose bytes equal a program weight becomes an external-data reference
(location ``arbiter-shared``), and the session made at load gets that weight back
through ``SessionOptions.add_external_initializers`` (copied into the graph before ONNX
Runtime's optimizations, so the session is the one made from the whole model).
"""
from __future__ import annotations

from typing import Any, Optional

#: the external-data location a shared initializer points to (no such file: the loader
#: supplies the tensor itself)
LOCATION = "arbiter-shared"


def strip_shared(model_bytes: bytes, shared: Any) -> tuple[bytes, dict[str, str]]:
    """(the model without the initializers ``shared`` holds, initializer name -> weight
    key). A model with none of them comes back unchanged."""
    import onnx
    import torch
    from onnx import numpy_helper

    model = onnx.ModelProto()
    model.ParseFromString(model_bytes)
    refs: dict[str, str] = {}
    for init in model.graph.initializer:
        if not init.raw_data or init.data_location == onnx.TensorProto.EXTERNAL:
            continue
        try:
            t = torch.from_numpy(numpy_helper.to_array(init).copy())
        except (TypeError, ValueError, RuntimeError):  # no numpy or torch type for it: kept
            continue
        key = shared.find(t)
        if key is None:
            continue
        refs[init.name] = key
        size = len(init.raw_data)
        init.ClearField("raw_data")
        init.data_location = onnx.TensorProto.EXTERNAL
        del init.external_data[:]
        for k, v in (("location", LOCATION), ("offset", "0"), ("length", str(size))):
            entry = init.external_data.add()
            entry.key, entry.value = k, v
    if not refs:
        return model_bytes, {}
    return model.SerializeToString(), refs


def shared_initializers(refs: Any, shared: Optional[Any]) -> tuple[list[str], list[Any]]:
    """(names, OrtValues) for ``add_external_initializers``: each referenced weight from
    the program (``refs``: what ``strip_shared`` recorded)."""
    if not refs:
        return [], []
    if shared is None or not isinstance(refs, dict):
        raise ValueError("the model's shared initializers need the program's weights")
    import onnxruntime as ort

    names, values = [], []
    for name, key in refs.items():
        t = shared.get(key).detach().contiguous()
        names.append(str(name))
        values.append(ort.OrtValue.ortvalue_from_numpy(t.numpy()))
    return names, values
