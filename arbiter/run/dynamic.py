"""Partitions with symbolic shapes: one artifact for every size, or one per size.

A partition cut from a graph Dynamo traced with dynamic shapes has symbolic sizes. Its
fallback chain (``run.piece.Piece``) is made of views of the backends (``shape_chain``):

* ``Symbolic(backend)``: the backend compiles the symbolic graph once (ONNX Runtime and
  OpenVINO export with ``dynamic_shapes``, Inductor compiles on the graph's fake inputs).
  Nothing is trusted unchecked: before the artifact is used it runs at a *second shape*
  (``arbiter.shapes.second_assignment``: other sizes within the symbols' ranges that
  satisfy every guard, inputs made from the first call's), compared with eager ATen; a
  failure (exporters have produced static graphs silently, sessions have failed only at a
  new size) or no valid second shape raises, and the piece falls back down its chain.
  At run time every call's output shapes are checked against the sizes the symbols give,
  and guards a backend added to Dynamo's ShapeEnv while compiling (Inductor does; Dynamo
  checked its guards before it, never these) are checked per call.
* ``PerShape(backend, limit)``: for a backend whose manifest does not let the ops take
  symbols (or whose symbolic artifact failed), the partition is specialized to each
  concrete input shape it meets (``specialize``) and compiled like a static one, up to
  ``limit`` shapes (the config's ``shapes.max_specializations``); one more raises, and
  the piece moves to the next backend of its chain.

Every reason these views give starts with ``arbiter.shapes.REASON``, so the report can
tell compute left to eager because of shapes.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from ..decompose import for_backend, for_symbolic
from ..errors import describe
from ..ops import all_finite, output_values
from ..backend import Backend
from ..shapes import (REASON, Reader, SecondShape, expr, graph_is_symbolic, held_symbols,
                      input_values, inputs_at, second_assignment, shape_env_of, tied_groups)
from .chain import Entry, Link, Mode, link_of
from .checks.verify import compare

log = logging.getLogger(__name__)

R = REASON


class ShapeError(RuntimeError):
    """A symbolic artifact that cannot be trusted, or a shape past a limit."""


def shape_links(chain: Sequence[Backend], gm: torch.fx.GraphModule, per_shape: set[str],
                limit: int) -> list[Link]:
    """The links of a partition's chain (``chain``: its backends in order), in the modes
    ``gm``'s shapes call for (see the module).

    ``per_shape``: backends some node of the partition may run on only per concrete shape.
    Symbolic: the backends that may take the symbols (in chain order), then every compiling
    backend per shape (when ``limit`` > 0), then the inline fallback."""
    if not graph_is_symbolic(gm):
        return [link_of(b) for b in chain]
    compiling = [b for b in chain if not b.inline_aten]
    out = [link_of(b, Mode.SYMBOLIC) for b in compiling if b.name not in per_shape]
    if limit > 0:
        out += [link_of(b, Mode.PER_SHAPE) for b in compiling]
    return out + [link_of(b) for b in chain if b.inline_aten]


# -- one artifact for every size -------------------------------------------------------
class Symbolic(Entry):
    """A backend compiling a symbolic partition once; see the module docstring."""

    mode = Mode.SYMBOLIC

    def __init__(self, backend: Backend, tolerances: Any = None):
        super().__init__(backend)
        self.tolerances = tolerances

    def graph_for(self, gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        return for_symbolic(gm, self.backend)

    def compile(self, gm: torch.fx.GraphModule, args: Sequence[Any]) -> Callable:
        values = input_values(gm)
        second = second_assignment(values, args)
        if second is None:
            raise ShapeError(f"{R}: no second shape of this partition's symbols satisfies "
                             "the graph's ranges and guards (or a symbol cannot be read from "
                             "its inputs), so a symbolic artifact cannot be checked")
        env = shape_env_of(values)
        n_guards = len(env.guards) if env is not None else 0
        fn = self.backend.compile(gm, list(args))
        added = [g.expr for g in env.guards[n_guards:]] if env is not None else []
        wrapped = Checked(fn, gm, added)
        if added:  # the artifact holds for fewer sizes: check one it claims
            second = second_assignment(values, args)
            if second is None:
                raise ShapeError(f"{R}: compiling added guards that leave no second shape "
                                 f"to check ({', '.join(map(str, added))[:200]})")
        try:
            check_second_shape(wrapped, gm, args, second, self.tolerances)
        except ShapeError as exc:
            # symbols equal at this call moved apart: a decoder's cache, mask and position
            # lengths are separate symbols the model needs equal, which no guard says
            # (eager fails or computes infinities there, or the artifact refuses them)
            tied = second_assignment(values, args, tied=True)
            if tied is None or tied.assignment == second.assignment:
                return self._held(wrapped, gm, args, second, exc)
            try:
                check_second_shape(wrapped, gm, args, tied, self.tolerances)
            except ShapeError as tied_exc:
                return self._held(wrapped, gm, args, tied, tied_exc)
            wrapped.tie(tied.first)
            log.info("%s: symbolic artifact checked at a second shape with the symbols "
                     "equal at the first call tied (%s; %s), and held to them per call",
                     self.name, tied.describe(), exc)
            return wrapped
        log.info("%s: symbolic artifact checked at a second shape (%s)", self.name,
                 second.describe())
        return wrapped

    def _held(self, wrapped: "Checked", gm: torch.fx.GraphModule, args: Sequence[Any],
              tried: SecondShape, exc: ShapeError) -> "Checked":
        """The last try: the tied check again with the symbols that equal a static size
        of some input kept at their value (``held_symbols``: a decoder step's batch
        beside a tensor traced with that batch as a constant, where eager itself failed
        with the batch moved). The artifact is then held to those values per call (a
        decode loop keeps its batch; another batch raises and goes down the chain).
        Raises ``exc`` (the failure at ``tried``) where nothing is held or no other
        shape is left."""
        values = input_values(gm)
        held = held_symbols(values, args)
        kept = second_assignment(values, args, tied=True, hold=held) if held else None
        if kept is None or kept.assignment == tried.assignment:
            raise exc
        check_second_shape(wrapped, gm, args, kept, self.tolerances)
        wrapped.tie(kept.first)
        wrapped.hold({s: kept.first[s] for s in held if s in kept.first})
        log.info("%s: symbolic artifact checked at a second shape with the symbols equal "
                 "at the first call tied and those equal to a static size kept (%s; %s), "
                 "and held to them per call", self.name, kept.describe(), exc)
        return wrapped


class Checked:
    """A symbolic artifact's callable, checked per call: the guards its compile added
    hold, and its outputs are what the symbols give (``OutputCheck``)."""

    def __init__(self, fn: Callable, gm: torch.fx.GraphModule, added_guards: Sequence[Any]):
        self.fn = fn
        reader = self._reader = Reader(input_values(gm))
        self._outputs = OutputCheck(gm)
        self._ties: Any = None  # (symbols' reader, group sizes, words): ``tie``
        self._held: Any = None  # (symbols' reader, their values, words): ``hold``
        self._guards = None
        self._guard_text = ""
        if added_guards:
            exprs = [reader.env.simplify(e) for e in added_guards]
            self._guards = reader.function(exprs, "guards")
            if self._guards is None:
                raise ShapeError(f"{R}: compiling added shape guards that cannot be checked "
                                 f"per call: {', '.join(map(str, added_guards))[:300]}")
            self._guard_text = ", ".join(map(str, exprs))
            log.info("symbolic artifact: compiling added guards %s (checked per call)",
                     self._guard_text[:300])

    def tie(self, first: dict) -> None:
        """Hold the artifact to calls where the symbols equal in ``first`` (symbol ->
        value at the call it was checked at) are equal: it was checked only so."""
        tied = [g for g in tied_groups(first) if len(g) > 1]
        if not tied:
            return
        fn = self._reader.function([s for g in tied for s in g], "ties")
        if fn is None:
            raise ShapeError(f"{R}: the tied symbols cannot be read per call")
        sizes = [len(g) for g in tied]
        self._ties = (fn, sizes, ", ".join(" = ".join(map(str, g)) for g in tied))

    def hold(self, values: dict) -> None:
        """Hold the artifact to calls where these symbols (symbol -> value) have these
        values: it was checked only so (``Symbolic._held``)."""
        if not values:
            return
        syms = list(values)
        fn = self._reader.function(syms, "held")
        if fn is None:
            raise ShapeError(f"{R}: the held symbols cannot be read per call")
        self._held = (fn, [values[s] for s in syms],
                      ", ".join(f"{s} = {values[s]}" for s in syms))

    def _tied(self, args: Sequence[Any]) -> bool:
        fn, sizes, _ = self._ties
        vals, at = fn(args), 0
        for n in sizes:
            if len(set(vals[at:at + n])) > 1:
                return False
            at += n
        return True

    def attach_record(self, record) -> None:
        record.shapes = "symbolic"
        self._outputs.record = record
        attach = getattr(self.fn, "attach_record", None)
        if attach is not None:
            attach(record)

    def __call__(self, *args: Any) -> Any:
        if self._guards is not None and not all(self._guards(args)):
            raise ShapeError(f"{R}: this call breaks guards the backend added while "
                             f"compiling ({self._guard_text[:200]})")
        if self._ties is not None and not self._tied(args):
            raise ShapeError(f"{R}: this call's sizes are not equal where the artifact was "
                             f"checked with them equal ({self._ties[2][:200]})")
        if self._held is not None and list(self._held[0](args)) != self._held[1]:
            raise ShapeError(f"{R}: this call's sizes differ from those the artifact was "
                             f"checked with held ({self._held[2][:200]})")
        return self._outputs(args, self.fn(*args))


class OutputCheck:
    """What a symbolic partition's outputs must be at a call, from its traced metadata:
    each tensor's shape (a mismatch raises ShapeError), and its traced layout: for
    outputs eager produces with another layout than a contiguous one (a transpose), a
    backend's contiguous result is copied into it once (``record.restride_copies``), as
    ``run.piece`` does for static partitions, since later views were traced against it;
    an output traced contiguous that a backend returns otherwise (Inductor's ``cat`` of
    one tensor, in that tensor's layout) is made contiguous. Generated code over the
    input sizes: a few microseconds a call."""

    def __init__(self, gm: torch.fx.GraphModule):
        import sympy

        reader = Reader(input_values(gm))
        self.record = None
        vals = output_values(gm) or []
        exprs: list = []
        self._layout: list = []  # per output: None, or (offset, rank, has strides)
        for v in vals:
            if not isinstance(v, torch.Tensor):
                self._layout.append(None)
                continue
            sizes = [expr(x) for x in v.shape]
            strides = [expr(x) for x in v.stride()] if v.layout == torch.strided else []
            contiguous, acc = [], sympy.Integer(1)
            for n in reversed(sizes):
                contiguous.append(acc)
                acc = acc * n
            contiguous.reverse()
            odd = bool(strides) and any(sympy.expand(a - b) != 0
                                        for a, b in zip(strides, contiguous))
            self._layout.append((len(exprs), len(sizes), odd))
            exprs += sizes + (strides if odd else [])
        self._fn = reader.function(exprs, "output_layout") if exprs else None

    def __call__(self, args: Sequence[Any], out: Any) -> Any:
        if self._fn is None:
            return out
        values = self._fn(args)
        fixed = None
        for k, (o, at) in enumerate(zip(out, self._layout)):
            if at is None or not isinstance(o, torch.Tensor):
                continue
            start, rank, odd = at
            size = values[start:start + rank]
            if tuple(o.shape) != size:
                raise ShapeError(f"{R}: output {k} has shape {tuple(o.shape)}, the symbols "
                                 f"give {size}")
            t = None
            if odd:
                stride = values[start + rank:start + 2 * rank]
                if any(n > 1 and a != b for n, a, b in zip(size, o.stride(), stride)) and \
                        not any(st == 0 and n > 1 for n, st in zip(size, stride)):
                    t = torch.empty_strided(size, stride, dtype=o.dtype, device=o.device)
                    t.copy_(o)
            elif o.layout == torch.strided and not o.is_contiguous():
                t = o.contiguous()  # traced contiguous, returned in another layout
            if t is not None:
                fixed = list(out) if fixed is None else fixed
                fixed[k] = t
                if self.record is not None:
                    self.record.restride_copies += 1
        return out if fixed is None else fixed


def check_second_shape(fn: Callable, gm: torch.fx.GraphModule, args: Sequence[Any],
                       second: SecondShape, tolerances: Any = None) -> float:
    """Run ``fn`` and eager ATen at the second shape; raise ShapeError on any difference
    (and where eager itself fails, or computes non-finite values where the two differ:
    sizes the model does not take check nothing). Returns the largest error."""
    inputs = inputs_at(input_values(gm), args, second.assignment)
    try:
        expected = list(gm(*[_clone(a) for a in inputs]))
    except Exception as exc:  # noqa: BLE001 - eager itself refuses these sizes
        raise ShapeError(f"{R}: eager ATen fails at the second shape ({second.describe()}): "
                         f"{describe(exc)}; the symbolic artifact cannot be checked") from exc
    try:
        got = list(fn(*inputs))
    except Exception as exc:  # noqa: BLE001
        raise ShapeError(f"{R}: the symbolic artifact fails at a second shape "
                         f"({second.describe()}): {describe(exc)}") from exc
    cmp = compare(expected, got, tolerances)
    if not cmp.ok:
        finite = all_finite([t for t in expected if isinstance(t, torch.Tensor)])
        raise ShapeError(f"{R}: the symbolic artifact differs from eager at a second shape "
                         f"({second.describe()}): {cmp.detail}"
                         + ("" if finite else " (eager's own outputs are not finite there)"))
    return cmp.max_error


def _clone(a: Any) -> Any:
    return a.clone() if isinstance(a, torch.Tensor) else a


# -- one artifact per size -------------------------------------------------------------
class PerShape(Entry):
    """A backend compiling a symbolic partition per concrete input shape."""

    mode = Mode.PER_SHAPE

    def __init__(self, backend: Backend, limit: int, graph_label: str = ""):
        super().__init__(backend)
        self.limit = limit
        self.graph_label = graph_label

    def graph_for(self, gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        return gm  # each specialized (static) graph is decomposed for it (``Specialized``)

    def compile(self, gm: torch.fx.GraphModule, args: Sequence[Any]) -> Callable:
        return Specialized(self.backend, gm, args, self.limit, self.graph_label)


def shape_key(args: Sequence[Any]) -> tuple:
    """What a static artifact was compiled for: sizes, strides and dtypes of the tensor
    arguments, and the int arguments' values."""
    return tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a
                 for a in args)


class Specialized:
    """Static artifacts of one symbolic partition, by concrete shape (``shape_key``)."""

    def __init__(self, backend: Backend, gm: torch.fx.GraphModule, args: Sequence[Any],
                 limit: int, label: str = ""):
        self.backend = backend
        self.gm = gm
        self.limit = limit
        self.label = label
        self._fns: dict[tuple, tuple[Callable, list[int]]] = {}
        self._lock = threading.Lock()
        self._record = None
        self.compile_s = 0.0
        self._outputs = OutputCheck(gm)
        self._add(shape_key(args), args)

    def attach_record(self, record) -> None:
        self._record = record
        self._outputs.record = record
        record.shapes = "per shape"
        record.specializations = len(self._fns)
        for fn, _ in self._fns.values():
            attach = getattr(fn, "attach_record", None)
            if attach is not None:
                attach(record)

    def _add(self, key: tuple, args: Sequence[Any]) -> tuple[Callable, list[int]]:
        if len(self._fns) >= self.limit:
            raise ShapeError(f"{R}: {self.backend.name} compiled this partition for "
                             f"{len(self._fns)} shapes already (shapes.max_specializations: "
                             f"{self.limit}); one more shape goes to the next backend")
        start = time.perf_counter()
        static, keep = specialize(self.gm, args)
        # static now: the nodes its manifest wants decomposed, decomposed for it alone
        fn = self.backend.compile(for_backend(static, self.backend), [args[i] for i in keep])
        elapsed = time.perf_counter() - start
        self.compile_s += elapsed
        self._fns[key] = (fn, keep)
        rec = self._record
        if rec is not None:
            rec.specializations = len(self._fns)
            rec.compile_s += elapsed
            attach = getattr(fn, "attach_record", None)
            if attach is not None:
                attach(rec)
        log.info("%s: %s compiled a partition for shape %d of at most %d in %.2f s",
                 self.label, self.backend.name, len(self._fns), self.limit, elapsed)
        return fn, keep

    def __call__(self, *args: Any) -> Any:
        key = shape_key(args)
        hit = self._fns.get(key)
        if hit is None:
            from torch.utils._python_dispatch import _disable_current_modes

            from .compiling import compile_lock

            with compile_lock(), self._lock:
                hit = self._fns.get(key)
                if hit is None:
                    with _disable_current_modes():
                        hit = self._add(key, args)
        fn, keep = hit
        out = fn(*args) if len(keep) == len(args) else fn(*[args[i] for i in keep])
        return self._outputs(args, out)


def specialize(gm: torch.fx.GraphModule, args: Sequence[Any]) -> tuple[torch.fx.GraphModule, list[int]]:
    """``gm`` for the concrete shapes of ``args``: int inputs become constants, every
    value's metadata is propagated again from fake copies of the real inputs (static
    sizes), and size arithmetic folds to ints. Returns the static graph (sharing ``gm``'s
    constants) and the positions of the inputs it still takes (the tensors)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    graph = torch.fx.Graph()
    env: dict = {}
    out = graph.graph_copy(gm.graph, env)
    graph.output(out)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    keep = []
    for i, (p, a) in enumerate(zip(placeholders, args)):
        if isinstance(a, torch.Tensor):
            keep.append(i)
        else:
            _replace_with_constant(p, a)
            graph.erase_node(p)
    static = torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__ + "Static")
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(args[i]) for i in keep]
    FakeTensorProp(static, mode).propagate_dont_convert_inputs(*fakes)
    for n in list(graph.nodes):
        if n.op == "call_function" and isinstance(n.meta.get("val"), (int, bool)) \
                and not isinstance(n.meta["val"], torch.Tensor):
            _replace_with_constant(n, n.meta["val"])
            graph.erase_node(n)
    output = next(n for n in graph.nodes if n.op == "output")
    output.meta["val"] = tuple(a.meta.get("val") if isinstance(a, torch.fx.Node) else a
                               for a in output.args[0])
    graph.lint()
    static.recompile()
    return static, keep


def _replace_with_constant(node: torch.fx.Node, value: Any) -> None:
    for user in list(node.users):
        user.args = torch.fx.node.map_arg(user.args, lambda x: value if x is node else x)
        user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda x: value if x is node else x)
