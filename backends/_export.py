"""What the backends that take an exported program share (ONNX Runtime, OpenVINO).

``quiet()`` keeps the exporters' progress lines, warnings and log records out of the
user's way. ``export_program(gm, args)`` makes an ATen partition a
``torch.export.ExportedProgram``, non-strict, with the partition's real inputs (a
``view`` may rely on their strides; strict export ran Dynamo inside the user's compiled
call and recompiled the model on every call); with ``dynamic=True``, with
``dynamic_shapes`` from the graph's symbols and ranges (``Dim.AUTO`` for expressions
and int inputs, all ``Dim.AUTO`` if export refuses the named Dims; docs/design.md,
"Dynamic shapes"). ``Runner`` is the base of a compiled partition's callable that binds
torch tensors' memory into a runtime: output specs checked once, one runtime handle per
thread, output shapes per call from the input sizes (``arbiter.shapes.Reader``), and the
count of boundary copies kept in the piece's record.
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

from arbiter.shapes import Reader, export_dynamic_shapes, input_values, symbols
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


def export_program(gm: torch.fx.GraphModule, args: tuple, dynamic: bool = False):
    """An ATen FX graph -> ExportedProgram (non-strict; see the module docstring), with
    symbolic dimensions when ``dynamic``. Call inside ``quiet()``."""
    if not dynamic:
        return torch.export.export(gm, args, strict=False)
    values = input_values(gm)
    # A data-dependent size of 0 or 1 at this call must not be fixed by export's 0/1
    # specialization (Dynamo never hands a backed symbol 0 or 1).
    small = any(isinstance(v, torch.Tensor) and isinstance(a, torch.Tensor) and any(
        isinstance(s, torch.SymInt) and n <= 1 for s, n in zip(v.shape, a.shape))
        for v, a in zip(values, args))
    from torch.fx.experimental import _config as fx_config

    with fx_config.patch(backed_size_oblivious=small):
        try:
            return torch.export.export(
                gm, args, dynamic_shapes=export_dynamic_shapes(values), strict=False,
                prefer_deferred_runtime_asserts_over_guards=True)
        except Exception as exc:  # noqa: BLE001 - retried with Dim.AUTO everywhere
            logging.getLogger(__name__).info(
                "export with named dims failed (%s: %s); retrying with Dim.AUTO",
                type(exc).__name__, str(exc).strip().splitlines()[0][:200] if str(exc) else "")
        return torch.export.export(
            gm, args, dynamic_shapes=export_dynamic_shapes(values, named=False),
            strict=False, prefer_deferred_runtime_asserts_over_guards=True)


def range_key(gm: torch.fx.GraphModule) -> str:
    """The symbols' ranges as text: part of a symbolic artifact's cache key (the graph's
    text names the symbols, not their ranges)."""
    found = symbols(input_values(gm))
    return ";".join(f"{s.name}:{s.min}:{s.max}" for s in found.values())


def check_inputs(example_inputs, dtypes: Container, ints: bool = False) -> tuple:
    """The partition's inputs, detached; TypeError for what the runtime cannot bind.
    ``ints``: int inputs (symbolic sizes of a dynamic partition) are allowed."""
    for a in example_inputs:
        if not isinstance(a, torch.Tensor):
            if ints and isinstance(a, int) and not isinstance(a, bool):
                continue
            raise TypeError(f"non-tensor partition input {type(a).__name__}"
                            + ("" if ints else " (a static partition takes tensors only)"))
        if a.dtype not in dtypes:
            raise TypeError(f"partition input dtype {a.dtype} is not supported")
    return tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in example_inputs)


def outputs_of(gm: torch.fx.GraphModule) -> list:
    """The traced value of each output of a partition (which returns a tuple)."""
    vals = output_values(gm)
    if vals is None:
        raise TypeError("the partition does not return a tuple of outputs")
    return vals


class Runner:
    """Base of a compiled partition's callable; see the module docstring.

    ``out_vals``: the partition's traced outputs (``outputs_of``), every one a tensor of a
    dtype in ``dtypes``, and as many as the compiled model has (``n_outputs``);
    ``out_specs`` keeps (shape, dtype) of each, the shape None where it is symbolic: then
    ``output_shapes(args)`` computes it from the call's inputs (``in_vals``: the
    partition's input values), or says None when it depends on data (the runtime
    allocates that output). Subclasses implement ``new_handle()`` (one per thread, from
    ``handle()``) and ``__call__``."""

    def __init__(self, out_vals: list, dtypes: Container, n_outputs: int,
                 in_vals: Optional[list] = None):
        vals = out_vals
        if n_outputs != len(vals):
            raise RuntimeError(f"compiled model has {n_outputs} outputs, partition has "
                               f"{len(vals)}")
        specs = []
        for i, v in enumerate(vals):
            if not isinstance(v, torch.Tensor) or v.dtype not in dtypes:
                raise TypeError(f"output {i}: unsupported value {type(v).__name__}"
                                + (f" of dtype {v.dtype}" if isinstance(v, torch.Tensor) else ""))
            static = all(isinstance(s, int) for s in v.shape)
            if not static and in_vals is None:
                raise TypeError(f"output {i}: symbolic shape {tuple(v.shape)}")
            specs.append((tuple(int(s) for s in v.shape) if static else None, v.dtype))
        self.out_specs: list[tuple[Optional[tuple[int, ...]], torch.dtype]] = specs
        self.dynamic = any(shape is None for shape, _ in specs)
        self._shapes_fn = None
        if self.dynamic:
            self._shapes_fn = Reader(in_vals).shapes_function(vals)
        self._local = threading.local()
        self._record: Optional[Any] = None

    def output_shapes(self, args) -> list:
        """Each output's shape for this call; None for one only the runtime knows."""
        if not self.dynamic:
            return [shape for shape, _ in self.out_specs]
        if self._shapes_fn is None:
            return [shape for shape, _ in self.out_specs]
        return self._shapes_fn(args)

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


#: Ops an output may pass through that leave its value as it is: a partition returning
#: ``x`` and ``detach(x)`` (what AOTAutograd's training forwards do for a value both
#: returned and saved for the backward) returns one value twice once exported.
_SAME_VALUE = (torch.ops.aten.detach.default, torch.ops.aten.alias.default)


class DistinctOutputs:
    """A partition's callable compiled from a copy returning each value once (see
    ``distinct_outputs``), giving every original output back: repeated values as the
    same tensor, ``detach``/``alias`` outputs by applying them to it (a view, as in
    eager)."""

    def __init__(self, fn, where: list[tuple[int, tuple]]):
        self.fn = fn
        self.where = where

    def __call__(self, *args):
        outs = self.fn(*args)
        got = []
        for k, ops in self.where:
            v = outs[k]
            for op in ops:
                v = op(v)
            got.append(v)
        return got


def distinct_outputs(gm: torch.fx.GraphModule, compile_fn):
    """``compile_fn(gm)``, or, when ``gm`` returns one value more than once (directly or
    through ``detach``/``alias``), ``compile_fn`` of a copy returning each value once,
    wrapped in ``DistinctOutputs``. OpenVINO's frontend cannot convert a graph that
    returns a value twice ("Check 'is_number(name)' failed"): every training forward of
    a model ending in an activation fell back to eager whole (the --grad probe's most
    common failure, 2026-11-26)."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    if not isinstance(out.args[0], (tuple, list)):
        return compile_fn(gm)
    bases, where = [], []
    for a in out.args[0]:
        ops = []
        while isinstance(a, torch.fx.Node) and a.op == "call_function" and \
                a.target in _SAME_VALUE:
            ops.append(a.target)
            a = a.args[0]
        if a in bases:
            k = bases.index(a)
        else:
            k = len(bases)
            bases.append(a)
        where.append((k, tuple(reversed(ops))))
    if len(bases) == len(where) and not any(ops for _, ops in where):
        return compile_fn(gm)
    graph = torch.fx.Graph()
    env: dict = {}
    graph.graph_copy(gm.graph, env)  # every node but the output
    graph.output([env[b] if isinstance(b, torch.fx.Node) else b for b in bases])
    graph.eliminate_dead_code()
    copy = torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    return DistinctOutputs(compile_fn(copy), where)
