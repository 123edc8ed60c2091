"""ONNX models that refer to their partition's constants rather than hold a copy.

A frozen partition's weights are constants of its graph (``get_attr`` nodes:
arbiter/run/freeze.py), and the ONNX export copies each into an initializer. ONNX
Runtime's model was therefore the weights again: BERT-base's 436 MB were serialized,
hashed and written into the persistent cache at the first compile, then read and checked
again in every later process (2.5 s of a warm start's 7.7), and the bytes were held for
the process's life besides the session's own copy.

* ``refer_constants(model, gm)`` (at export, on onnx_ir's model): every initializer of at
  least ``MIN_BYTES`` that is one of ``gm``'s constants (the same memory, or the same
  bytes) or a constant's transpose (onnxscript's optimizer folds a ``Linear``'s ``t``
  into its weight) becomes an external-data reference (location ``LOCATION``: no such
  file), and the model's metadata (``META_KEY``) records which: initializer -> the
  constant's position among ``gm``'s ``get_attr`` nodes, ``"t:"`` before a transpose.
  Positions, not names: the persistent cache's key holds the graph with each constant's
  bytes at its position (arbiter/cache/), so a model found under that key refers to
  the same bytes in any process.
* ``resolve(model_bytes, gm)``: those constants again, {initializer: tensor}, for
  ``SessionOptions.add_external_initializers`` (ONNX Runtime copies them in while it
  builds the session, before its graph optimizations: the session is the one the whole
  model gives; the caller keeps them alive with the session all the same) and for
  ``inline_constants``, the whole model (a precision lowering, a saved program).
"""
from __future__ import annotations

import json
from typing import Any, Optional

import torch

from arbiter.ops import attr_value

#: The external-data location of an initializer given from the partition's constants.
LOCATION = "arbiter-constant"
#: The model's metadata key holding {initializer: position, "t:" + position}.
META_KEY = "arbiter.constants"
#: Smaller initializers stay in the model (not worth a reference).
MIN_BYTES = 4096
TRANSPOSED = "t:"


def constants(gm: torch.fx.GraphModule) -> list[Any]:
    """``gm``'s ``get_attr`` values in graph order (the positions references name)."""
    return [attr_value(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"]


def _head(t: torch.Tensor) -> torch.Tensor:
    """A few of ``t``'s first elements (a view: no copy of a transposed ``t``)."""
    while t.dim() > 1:
        t = t[0]
    return t[:16]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes and bytes: a few elements first (cheap), then all of them."""
    return bool(torch.equal(_head(a), _head(b))) and bool(torch.equal(a, b))


class _Index:
    """``gm``'s tensor constants by memory and by (dtype, shape)."""

    def __init__(self, values: list[Any]):
        self.by_memory: dict[tuple, int] = {}
        self.by_shape: dict[tuple, list[int]] = {}
        self.values = values
        for i, v in enumerate(values):
            if not isinstance(v, torch.Tensor) or v.layout != torch.strided or \
                    v.device.type != "cpu" or v.numel() * v.element_size() < MIN_BYTES:
                continue
            self.by_memory.setdefault(self._memory(v), i)
            self.by_shape.setdefault((v.dtype, tuple(v.shape)), []).append(i)

    @staticmethod
    def _memory(t: torch.Tensor) -> tuple:
        return (t.data_ptr(), t.dtype, tuple(t.shape), t.stride())

    def find(self, t: torch.Tensor) -> Optional[str]:
        hit = self.by_memory.get(self._memory(t))
        if hit is not None:
            return str(hit)
        for i in self.by_shape.get((t.dtype, tuple(t.shape)), ()):
            if _same(self.values[i], t):
                return str(i)
        if t.dim() == 2:
            for i in self.by_shape.get((t.dtype, (t.shape[1], t.shape[0])), ()):
                if _same(self.values[i].t(), t):
                    return TRANSPOSED + str(i)
        return None


def _as_torch(tensor: Any) -> Optional[torch.Tensor]:
    """An onnx_ir tensor's data as a CPU torch tensor, without a copy where it can."""
    raw = getattr(tensor, "raw", None)
    if isinstance(raw, torch.Tensor):
        return raw
    try:
        return torch.from_numpy(tensor.numpy())
    except (TypeError, ValueError, RuntimeError, AttributeError):  # no torch dtype for it
        return None


def refer_constants(model: Any, gm: torch.fx.GraphModule) -> int:
    """Make ``model``'s initializers that are ``gm``'s constants references to them (see
    the module docstring); returns how many."""
    from onnx_ir import ExternalTensor

    index = _Index(constants(gm))
    if not index.by_shape:
        return 0
    refs: dict[str, str] = {}
    for name, value in model.graph.initializers.items():
        tensor = value.const_value
        if tensor is None or isinstance(tensor, ExternalTensor) or tensor.nbytes < MIN_BYTES:
            continue
        data = _as_torch(tensor)
        ref = index.find(data) if data is not None else None
        if ref is None:
            continue
        value.const_value = ExternalTensor(LOCATION, 0, tensor.nbytes, tensor.dtype,
                                           shape=tensor.shape, name=name)
        refs[name] = ref
    if refs:
        model.metadata_props[META_KEY] = json.dumps(refs, sort_keys=True)
    return len(refs)


def _refs(model: Any) -> dict[str, str]:
    for prop in model.metadata_props:
        if prop.key == META_KEY:
            refs = json.loads(prop.value)
            if not isinstance(refs, dict):
                raise ValueError(f"{META_KEY} is not a mapping")
            return {str(k): str(v) for k, v in refs.items()}
    return {}


def resolve(model_bytes: bytes, gm: torch.fx.GraphModule) -> dict[str, torch.Tensor]:
    """{initializer: tensor} for the references ``refer_constants`` made (none for a
    model without them); ``ValueError`` when one names what ``gm`` does not hold."""
    import onnx

    model = onnx.ModelProto()
    model.ParseFromString(model_bytes)
    refs = _refs(model)
    if not refs:
        return {}
    values = constants(gm)
    shapes = {init.name: tuple(init.dims) for init in model.graph.initializer
              if init.data_location == onnx.TensorProto.EXTERNAL}
    out = {}
    for name, ref in refs.items():
        pos = ref.removeprefix(TRANSPOSED)
        t = values[int(pos)] if pos.isdigit() and int(pos) < len(values) else None
        if isinstance(t, torch.Tensor) and ref.startswith(TRANSPOSED) and t.dim() == 2:
            t = t.t()
        elif ref.startswith(TRANSPOSED):
            t = None
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shapes.get(name):
            raise ValueError(f"the ONNX model's initializer {name!r} refers to constant "
                             f"{ref!r}, which the partition does not hold in that shape")
        out[name] = t.detach().contiguous()
    return out


def session_initializers(found: dict[str, torch.Tensor]) -> tuple[list[str], list[Any]]:
    """(names, OrtValues) for ``SessionOptions.add_external_initializers``."""
    if not found:
        return [], []
    import onnxruntime as ort

    return list(found), [ort.OrtValue.ortvalue_from_numpy(t.numpy()) for t in found.values()]


def inline_constants(model_bytes: bytes, found: dict[str, torch.Tensor]) -> bytes:
    """The whole model: each referenced initializer given its bytes again."""
    if not found:
        return model_bytes
    import onnx

    model = onnx.ModelProto()
    model.ParseFromString(model_bytes)
    for init in model.graph.initializer:
        t = found.get(init.name)
        if t is None or init.data_location != onnx.TensorProto.EXTERNAL:
            continue
        del init.external_data[:]
        init.data_location = onnx.TensorProto.DEFAULT
        init.raw_data = t.reshape(-1).view(torch.uint8).numpy().tobytes()
    kept = [p for p in model.metadata_props if p.key != META_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    return model.SerializeToString()
