"""What the backends that take an exported program share (ONNX Runtime, OpenVINO).

* ``quiet()``: the exporters' progress lines, warnings and log records kept out of the
  user's way;
* ``export_program(gm, args)``: an ATen partition -> ``torch.export.ExportedProgram``,
  non-strict, with the partition's real inputs (their strides: a ``view`` may rely on
  them). Strict export was dropped: it runs Dynamo inside the user's compiled call, which
  invalidated the caller's Dynamo cache and recompiled the model on every call (GPT-2);
* ``Runner``: the base of a compiled partition's callable that binds torch tensors'
  memory into a runtime: the output specs (static shapes, supported dtypes, checked
  once), one runtime handle per thread (sessions' bindings and infer requests are not
  thread-safe), and the count of boundary copies kept in the piece's record.
"""
from __future__ import annotations

import contextlib
import io
import logging
import threading
import warnings
from collections.abc import Container
from typing import Any, Optional

import torch

from arbiter.ops import output_values

_LOGGERS = ("torch.onnx", "onnxscript", "onnx_ir", "torch.export")


@contextlib.contextmanager
def quiet():
    """Exporters log and print progress and warnings: keep them out of the user's way."""
    loggers = [logging.getLogger(n) for n in _LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, lvl in zip(loggers, levels):
            lg.setLevel(lvl)


def export_program(gm: torch.fx.GraphModule, args: tuple):
    """An ATen FX graph -> ExportedProgram (non-strict; see the module docstring).
    Call inside ``quiet()``."""
    return torch.export.export(gm, args, strict=False)


def check_inputs(example_inputs, dtypes: Container) -> tuple:
    """The partition's inputs, detached; TypeError for what the runtime cannot bind."""
    for a in example_inputs:
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"non-tensor partition input {type(a).__name__} "
                            "(symbolic sizes are not supported by this backend)")
        if a.dtype not in dtypes:
            raise TypeError(f"partition input dtype {a.dtype} is not supported")
    return tuple(a.detach() for a in example_inputs)


def outputs_of(gm: torch.fx.GraphModule) -> list:
    """The traced value of each output of a partition (which returns a tuple)."""
    vals = output_values(gm)
    if vals is None:
        raise TypeError("the partition does not return a tuple of outputs")
    return vals


class Runner:
    """Base of a compiled partition's callable; see the module docstring.

    ``out_vals``: the partition's traced outputs (``outputs_of``), every one a tensor of a
    dtype in ``dtypes`` with a static shape, and as many as the compiled model has
    (``n_outputs``); ``out_specs`` keeps (shape, dtype) of each. Subclasses implement
    ``new_handle()`` (one per thread, from ``handle()``) and ``__call__``."""

    def __init__(self, out_vals: list, dtypes: Container, n_outputs: int):
        vals = out_vals
        if n_outputs != len(vals):
            raise RuntimeError(f"compiled model has {n_outputs} outputs, partition has "
                               f"{len(vals)}")
        specs = []
        for i, v in enumerate(vals):
            if not isinstance(v, torch.Tensor) or v.dtype not in dtypes:
                raise TypeError(f"output {i}: unsupported value {type(v).__name__}"
                                + (f" of dtype {v.dtype}" if isinstance(v, torch.Tensor) else ""))
            if any(not isinstance(s, int) for s in v.shape):
                raise TypeError(f"output {i}: symbolic shape {tuple(v.shape)}")
            specs.append((tuple(int(s) for s in v.shape), v.dtype))
        self.out_specs: list[tuple[tuple[int, ...], torch.dtype]] = specs
        self._local = threading.local()
        self._record: Optional[Any] = None

    def attach_record(self, record) -> None:
        """Count the copies this runner makes into ``record.copies`` (run.piece.Piece)."""
        self._record = record

    def handle(self):
        """This thread's runtime handle (``new_handle()`` on the thread's first call)."""
        h = getattr(self._local, "handle", None)
        if h is None:
            h = self._local.handle = self.new_handle()
        return h

    def new_handle(self):
        raise NotImplementedError

    def contiguous(self, t: torch.Tensor) -> torch.Tensor:
        """``t``, or a contiguous copy of it (counted): the runtimes bind by pointer and
        have no strides; binding a strided tensor's pointer silently gives wrong results."""
        if t.is_contiguous():
            return t
        if self._record is not None:
            self._record.copies += 1
        return t.contiguous()
