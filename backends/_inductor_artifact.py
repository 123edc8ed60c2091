"""Inductor's partitions saved as AOTInductor packages (arbiter.deploy; docs/deploy.md).

``compile_fx``'s result cannot be written out, so saving compiles the partition once more,
ahead of time: ``torch.export`` of the partition (inputs made from its traced metadata),
then ``torch._inductor.aoti_compile_and_package``, whose ``.pt2`` holds a shared library
of the kernels and the weights. Loading it (``aoti_load_package``) loads that library:
native code from the file, which ``arbiter.load`` runs only with ``native_code=True``.
Static shapes only (a symbolic partition is saved as ATen and compiled again at load).
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Optional

import torch

from arbiter.ops import dequantizes_constants
from arbiter.shapes import graph_is_symbolic, input_values

from ._export import quiet


def example_inputs(gm: torch.fx.GraphModule) -> tuple:
    """Inputs of the partition's traced shapes and dtypes (zeros: export traces, it does
    not compute); ValueError for a symbolic or non-tensor input."""
    args = []
    for v in input_values(gm):
        if not isinstance(v, torch.Tensor) or not all(isinstance(s, int) for s in v.shape):
            raise ValueError("a symbolic or non-tensor partition input")
        args.append(torch.zeros(tuple(v.shape), dtype=v.dtype, device=v.device))
    return tuple(args)


def save(backend: Any, gm: torch.fx.GraphModule) -> Optional[tuple[dict, dict[str, bytes]]]:
    """(entry, files) with ``model.pt2``; None for what it cannot package (symbolic
    shapes, autocast)."""
    from torch._inductor import aoti_compile_and_package
    from torch._inductor import config as inductor_config

    if graph_is_symbolic(gm) or backend.options.autocast is not None:
        return None
    patches = dict(backend.options.options)
    if backend._threads is not None:
        patches.setdefault("cpp.threads", backend._threads)
    if backend.options.freeze_quantized and dequantizes_constants(gm):
        patches.setdefault("freezing", True)  # as compile() does: int8 kernels
    with tempfile.TemporaryDirectory(prefix="arbiter-aoti-") as tmp:
        path = Path(tmp) / "model.pt2"
        with quiet(), torch.no_grad(), inductor_config.patch(patches):
            program = torch.export.export(gm, example_inputs(gm), strict=False)
            aoti_compile_and_package(program, package_path=str(path))
        blob = path.read_bytes()
    return {"format": "aotinductor", "native_code": True}, {"model.pt2": blob}


class _Loaded:
    """The loaded package's runner, returning a list as compiled partitions do."""

    def __init__(self, runner: Any, tmp: tempfile.TemporaryDirectory):
        self._runner = runner
        self._tmp = tmp  # the package file stays while the runner lives

    def __call__(self, *args: Any) -> list:
        out = self._runner(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]


def load(entry: dict, files: dict[str, bytes], gm: torch.fx.GraphModule) -> _Loaded:
    from torch._inductor import aoti_load_package

    if entry.get("format") != "aotinductor" or "model.pt2" not in files:
        raise ValueError(f"not an AOTInductor artifact (entry {entry}, files {sorted(files)})")
    tmp = tempfile.TemporaryDirectory(prefix="arbiter-aoti-")
    path = Path(tmp.name) / "model.pt2"
    path.write_bytes(files["model.pt2"])
    return _Loaded(aoti_load_package(str(path)), tmp)
