"""The ONNX export shared by ONNX Runtime and TensorRT.

A partition is translated by PyTorch's own exporter (``torch.onnx.export(...,
dynamo=True)``, onnxscript's ATen library "torchlib"); ``export_onnx`` builds the
exporter's registry once per process (``_registry_once``). What the export gets wrong is
refused by ``EXPORT_VALIDATORS`` (the ONNX Runtime and TensorRT backends apply them).
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch

from ._export import export_program, quiet


# -- the export ---------------------------------------------------------------------------
#: (class, from_torchlib's arguments, ops registered with torch) -> the registry built
_REGISTRIES: dict = {}


@contextlib.contextmanager
def _registry_once():
    """``torch.onnx.export`` builds its registry of ATen -> ONNX translations afresh on
    every call (about 1 s: onnxscript's torchlib walked, every op looked up), and arbiter
    exports once per partition and per candidate. Within this block the registry is built
    once per process and every export gets its own copy of it (a dict of lists: an
    exporter that adds custom translations changes only its copy). Key: the arguments and
    the number of operators registered with torch (a library loaded since, with ops
    torchlib translates, gets a new registry, as it would have). Where the registry holds
    more than the two fields copied (another torch), nothing is cached."""
    try:
        from torch.onnx._internal.exporter import _registration
        real = _registration.ONNXRegistry.__dict__["from_torchlib"]
        # another thread's export inside this block (a compile left running past
        # compile_timeout_s): restore torch's own method, not that thread's stand-in
        real = getattr(real.__func__, "_arbiter_real", real)
        build = real.__func__
    except Exception:  # noqa: BLE001 - another torch: its own registry every time
        yield
        return
    ops = len(torch._C._dispatch_get_all_op_names())

    def from_torchlib(cls, *args, **kwargs):
        key = (cls, args, tuple(sorted(kwargs.items())), ops)
        base = _REGISTRIES.get(key)
        if base is None:
            base = build(cls, *args, **kwargs)
            if set(vars(base)) != {"_opset_version", "functions"}:
                return base
            _REGISTRIES.clear()  # one kept: the ops count only grows
            _REGISTRIES[key] = base
        copy = cls.__new__(cls)
        copy._opset_version = base._opset_version
        copy.functions = {k: list(v) for k, v in base.functions.items()}
        return copy

    from_torchlib._arbiter_real = real
    _registration.ONNXRegistry.from_torchlib = classmethod(from_torchlib)
    try:
        yield
    finally:
        _registration.ONNXRegistry.from_torchlib = real


def export_onnx(gm: torch.fx.GraphModule, args: tuple, optimize: bool = True,
                dynamic: bool = False):
    """An ATen FX graph -> onnx.ModelProto, through torch.onnx's dynamo exporter; ``dynamic``: symbolic dimensions from the graph's symbols
    (backends/_export.py)."""
    with quiet(), _registry_once():
        # non-strict only (backends/_export.py); torch.onnx.export's own fallback to
        # strict export would run Dynamo inside the user's compiled call
        exported = export_program(gm, args, dynamic=dynamic)
        program = torch.onnx.export(exported, args, dynamo=True, optimize=optimize,
                                    verbose=False, report=False)
    return program.model_proto


# -- what the export gets wrong: refused -------------------------------------------------
def _batch_norm_training(node) -> Optional[str]:
    # The exporter translates training-mode batch norm with ONNX's BatchNormalization,
    # which normalizes with the running statistics: measured wrong by 0.24 on the small CNN.
    schema = node.target._schema
    names = [a.name for a in schema.arguments]
    if "training" in names:
        i = names.index("training")
        training = node.args[i] if i < len(node.args) else node.kwargs.get("training", False)
        if training:
            return "training-mode batch norm (batch statistics) is exported with running statistics"
    return None


#: Validators of the nodes the export computes unlike eager.
EXPORT_VALIDATORS = {
    "aten._native_batch_norm_legit_functional": _batch_norm_training,
    "aten._native_batch_norm_legit": _batch_norm_training,
    "aten.native_batch_norm": _batch_norm_training,
    "aten._batch_norm_with_update_functional": _batch_norm_training,
    "aten.batch_norm": _batch_norm_training,
}
