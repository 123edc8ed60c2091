"""Symbolic shapes, as facts read off a graph's FakeTensor metadata.

A graph Dynamo traced with dynamic shapes carries ``torch.SymInt`` sizes whose
``ShapeEnv`` knows each symbol's range, the guards Dynamo checks and the symbols found
equal (always read an expression through ``ShapeEnv.simplify``). For a graph's inputs
and outputs this module answers: which symbols appear, their ranges and where the user's
inputs carry them (``symbols``); generated Python functions that read them off a call's
real arguments to compute output shapes or check conditions (``Reader``: microseconds,
no sympy at run time); ``torch.export`` dynamic shapes (``export_dynamic_shapes``);
another assignment satisfying ranges and guards, and inputs at it
(``second_assignment``, ``inputs_at``: what a dynamic artifact is checked on before it
is trusted). Base layer: torch and sympy only. docs/design.md ("Dynamic shapes").
"""
from __future__ import annotations

import itertools
import logging
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.fx

log = logging.getLogger(__name__)

#: What symbolic-shape refusals and failures say first (the report counts them).
REASON = "symbolic shapes"

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def about_shapes(reason: str) -> bool:
    """Whether a refusal or fallback reason is about symbolic shapes."""
    return f"{REASON}:" in reason


# -- values ----------------------------------------------------------------------------
def is_symbolic(value: Any) -> bool:
    """Whether a ``meta["val"]`` holds a symbolic size, stride or scalar."""
    if isinstance(value, _SYM_TYPES):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in value.shape)
    if isinstance(value, (list, tuple)):
        return any(is_symbolic(v) for v in value)
    return False


def graph_is_symbolic(gm: torch.fx.GraphModule) -> bool:
    """Whether any input or node of ``gm`` has a symbolic value."""
    return any(is_symbolic(n.meta.get("val")) for n in gm.graph.nodes)


def input_values(gm: torch.fx.GraphModule) -> list:
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


def shape_env_of(values: Iterable[Any]):
    """The ShapeEnv behind the first symbolic size or scalar in ``values``, or None."""
    for v in values:
        if isinstance(v, _SYM_TYPES):
            return v.node.shape_env
        if isinstance(v, torch.Tensor):
            for s in (*v.shape, *_strides(v)):
                if isinstance(s, torch.SymInt):
                    return s.node.shape_env
        elif isinstance(v, (list, tuple)):
            env = shape_env_of(v)
            if env is not None:
                return env
    return None


def _strides(t: torch.Tensor) -> tuple:
    try:
        return tuple(t.stride())
    except RuntimeError:  # sparse and other layouts without strides
        return ()


def expr(size: Any):
    """The sympy expression of a size (replacements applied), or an Integer."""
    import sympy

    if isinstance(size, _SYM_TYPES):
        node = size.node
        return node.shape_env.simplify(node.expr)
    return sympy.Integer(int(size))


def free_symbols(values: Iterable[Any]) -> set:
    """Symbols in the sizes, strides and scalars of ``values``."""
    out: set = set()
    for v in values:
        if isinstance(v, _SYM_TYPES):
            out |= expr(v).free_symbols
        elif isinstance(v, torch.Tensor):
            for s in (*v.shape, *_strides(v)):
                if isinstance(s, torch.SymInt):
                    out |= expr(s).free_symbols
        elif isinstance(v, (list, tuple)):
            out |= free_symbols(v)
    return out


def _name(sym) -> str:
    return str(sym)


# -- ranges ----------------------------------------------------------------------------
@dataclass(frozen=True)
class SymbolRange:
    """One symbol of a graph: its range and the user's inputs that carry it."""

    name: str
    min: int
    max: Optional[int]  # None: unbounded
    sources: tuple[str, ...] = ()  # e.g. "x.size(0)"
    data_dependent: bool = False  # an unbacked symbol (nonzero, item)


def bounds(e, shape_env) -> tuple[int, Optional[int]]:
    """(min, max) of an expression over the ShapeEnv's ranges; max None if unbounded."""
    from torch.utils._sympy.numbers import int_oo

    if e.is_number:
        return int(e), int(e)
    r = shape_env.bound_sympy(e)
    lo = 0 if r.lower in (-int_oo,) or not r.lower.is_finite else int(r.lower)
    hi = None if r.upper is int_oo or not r.upper.is_finite else int(r.upper)
    return lo, hi


def symbols(values: Sequence[Any]) -> dict[str, SymbolRange]:
    """The symbols of ``values`` (a graph's inputs), by name, with ranges and sources."""
    env = shape_env_of(values)
    if env is None:
        return {}
    syms = free_symbols(values)
    sources: dict = {s: [] for s in syms}
    for raw, srcs in getattr(env, "var_to_sources", {}).items():
        target = env.simplify(raw)
        if target in sources:
            for src in srcs:
                sources[target].append(_source_text(getattr(src, "name", src)))
    out = {}
    for s in sorted(syms, key=_name):
        lo, hi = bounds(s, env)
        out[_name(s)] = SymbolRange(_name(s), lo, hi,
                                    tuple(dict.fromkeys(sources[s])),
                                    data_dependent=_name(s).startswith("u"))
    return out


def _source_text(name: Any) -> str:
    """``L['x'].size()[0]`` -> ``x.size(0)``."""
    import re

    text = name() if callable(name) else str(name)
    text = re.sub(r"^L\['([^']*)'\]", r"\1", text)
    return re.sub(r"\.size\(\)\[(\d+)\]", r".size(\1)", text)


def input_ranges(values: Sequence[Any], args: Sequence[Any]) -> list:
    """Per input, what an optimization profile needs (TensorRT's min/opt/max shapes):
    for a tensor, one (min, opt, max) per dimension, ``opt`` the size at this call and
    ``max`` None when unbounded; static sizes give (n, n, n). None for other inputs."""
    env = shape_env_of(values)
    out: list = []
    for v, a in zip(values, args):
        if not isinstance(v, torch.Tensor):
            out.append(None)
            continue
        dims = []
        for s, n in zip(v.shape, a.shape):
            if isinstance(s, torch.SymInt) and env is not None:
                lo, hi = bounds(expr(s), env)
                dims.append((lo, int(n), hi))
            else:
                dims.append((int(n), int(n), int(n)))
        out.append(dims)
    return out


# -- reading symbols from real arguments --------------------------------------------
class Reader:
    """Where each symbol of a graph's inputs can be read from a call's real arguments.

    A symbol is *bound* when some input carries it bare: a tensor dimension whose size is
    exactly the symbol (``args[i].shape[d]``) or an int input equal to it (``args[i]``).
    ``function(exprs)`` compiles Python code evaluating sympy expressions of bound
    symbols from the arguments (None when one is unbound or cannot be printed)."""

    def __init__(self, values: Sequence[Any]):
        self.values = list(values)
        self.env = shape_env_of(self.values)
        self.sites: dict = {}  # symbol -> python text reading it from `a`
        for i, v in enumerate(self.values):
            if isinstance(v, torch.SymInt):
                e = expr(v)
                if e.is_Symbol:
                    self.sites.setdefault(e, f"a[{i}]")
        for i, v in enumerate(self.values):
            if isinstance(v, torch.Tensor):
                for d, s in enumerate(v.shape):
                    if isinstance(s, torch.SymInt):
                        e = expr(s)
                        if e.is_Symbol:
                            self.sites.setdefault(e, f"a[{i}].shape[{d}]")
        self.symbols = free_symbols(self.values)
        self.unbound = {s for s in self.symbols if s not in self.sites}

    def function(self, exprs: Sequence[Any], name: str = "f") -> Optional[Callable]:
        """``fn(args) -> tuple`` of the values of ``exprs`` (sympy; ints pass through)."""
        import sympy
        from torch.utils._sympy.printers import PythonPrinter

        printer = PythonPrinter()
        needed: set = set()
        texts = []
        for e in exprs:
            e = sympy.sympify(e)
            if not e.free_symbols <= set(self.sites):
                return None
            needed |= e.free_symbols
            try:
                texts.append(printer.doprint(e))
            except Exception:  # noqa: BLE001 - an expression the printer cannot write
                return None
        lines = [f"def {name}(a):"]
        lines += [f"    {_name(s)} = {self.sites[s]}" for s in sorted(needed, key=_name)]
        lines.append(f"    return ({''.join(t + ', ' for t in texts)})")
        return _compile("\n".join(lines), name)

    def bind(self, args: Sequence[Any]) -> dict:
        """{symbol: int} for the bound symbols, read from real arguments."""
        out = {}
        for s, site in self.sites.items():
            out[s] = int(eval(site, {}, {"a": args}))  # noqa: S307 - our own text
        return out

    def shapes_function(self, out_values: Sequence[Any]) -> Optional[Callable]:
        """``fn(args) -> [shape per output]`` for tensors among ``out_values`` (others get
        ``None``); None when an output size is not a function of bound symbols (a
        data-dependent size)."""
        exprs: list = []
        layout: list = []
        for v in out_values:
            if isinstance(v, torch.Tensor):
                layout.append((len(exprs), v.dim()))
                exprs += [expr(s) for s in v.shape]
            else:
                layout.append(None)
        flat = self.function(exprs, "output_sizes")
        if flat is None:
            return None

        def shapes(args):
            sizes = flat(args)
            return [None if at is None else tuple(sizes[at[0]:at[0] + at[1]]) for at in layout]
        return shapes


def _compile(source: str, name: str) -> Callable:
    import math

    namespace: dict = {"torch": torch, "math": math}
    exec(compile(source, f"<arbiter.shapes.{name}>", "exec"), namespace)  # noqa: S102
    return namespace[name]


# -- torch.export's dynamic shapes -----------------------------------------------------
def export_dynamic_shapes(values: Sequence[Any], *, named: bool = True) -> Optional[tuple]:
    """``dynamic_shapes`` for ``torch.export.export`` of a graph with these inputs.

    One ``Dim`` per symbol (export identifies Dims by name), with the ShapeEnv's range:
    ``mark_dynamic``'s min/max come through. A dimension that is an expression of
    symbols (``s0*s1`` after a reshape) gets ``Dim.AUTO``, as do int inputs (export
    refuses named Dims for ints). ``named=False`` gives ``Dim.AUTO`` everywhere: export
    then infers the relations itself (and may specialize a dimension: the caller checks
    the artifact at a second shape). None for a graph without symbols."""
    from torch.export import Dim

    env = shape_env_of(values)
    if env is None:
        return None
    dims: dict = {}

    def dim_for(e):
        if e.is_number:
            return None
        if not (named and e.is_Symbol):
            return Dim.AUTO
        if e not in dims:
            lo, hi = bounds(e, env)
            kw = {"min": lo}
            if hi is not None:
                kw["max"] = hi
            dims[e] = Dim(_name(e), **kw)
        return dims[e]

    spec: list = []
    for v in values:
        if isinstance(v, torch.SymInt):
            spec.append(None if expr(v).is_number else Dim.AUTO)
        elif isinstance(v, torch.Tensor):
            per = {d: x for d, s in enumerate(v.shape)
                   if isinstance(s, torch.SymInt) and (x := dim_for(expr(s))) is not None}
            spec.append(per or None)
        else:
            spec.append(None)
    return tuple(spec)


# -- a second shape ----------------------------------------------------------------------
@dataclass
class SecondShape:
    """Another assignment of a graph's symbols, and why it is valid."""

    assignment: dict  # symbol -> int (every bound symbol of the inputs)
    first: dict  # the same symbols at the call it was derived from
    tried: int = 0
    notes: list = field(default_factory=list)

    def describe(self) -> str:
        return ", ".join(f"{_name(s)}: {self.first[s]} -> {v}"
                         for s, v in sorted(self.assignment.items(), key=lambda kv: _name(kv[0])))


#: Steps away from the first call's value tried for each symbol, in order. Only larger
#: sizes: integer inputs valid at the first size stay valid, and a smaller one is where
#: degenerate shapes are (an input smaller than a pooling window: Inductor's kernel for
#: max_pool2d's backward then divides by zero and kills the process, found by the probe).
_STEPS = (1, 2, 3, 4, 6, 8, 5, 7, 12, 16, 9, 10, 11, 24, 32)
_MAX_CANDIDATES = 4000


def second_assignment(values: Sequence[Any], args: Sequence[Any],
                      tied: bool = False, hold: Collection = ()) -> Optional[SecondShape]:
    """Values of the inputs' symbols larger than those of ``args`` (a real call), within
    the symbols' ranges and satisfying every guard and runtime assert of the ShapeEnv
    that involves them. Values of different symbols differ from each other and from the
    static sizes of the inputs where possible, so that a backend that fixed a size or
    merged two is caught. With ``tied``, symbols equal at ``args`` move together (a
    decoder's key/value length, its mask's and its positions' are separate symbols that
    the model needs equal, which no guard says: moved apart, eager itself fails or
    computes infinities). Symbols in ``hold`` keep their value (``held_symbols``). None
    when no such assignment is found, nothing moves, or a symbol cannot be read from the
    arguments."""
    reader = Reader(values)
    env = reader.env
    if env is None or reader.unbound:
        return None
    first = reader.bind(args)
    syms = sorted(first, key=_name)
    check = _condition(env, syms, first)
    if check is None:
        return None
    statics = _static_sizes(values)
    lows = {s: bounds(s, env)[0] for s in syms}
    moving = [s for s in syms if s not in hold]
    if not moving:
        return None
    # the symbols that move as one: each alone, or (tied) those of one first value
    groups = tied_groups({s: first[s] for s in moving}) if tied else [[s] for s in moving]
    kept = {s: first[s] for s in syms if s in hold}
    tried = 0
    for distinct in (True, False):
        for deltas in _candidate_deltas(len(groups)):
            cand = {s: first[s] + d for group, d in zip(groups, deltas) for s in group}
            cand.update(kept)
            if any(v < max(lows[s], 0) for s, v in cand.items()):
                continue
            if distinct:
                vals = [cand[g[0]] for g in groups]
                if len(set(vals)) < len(vals) or set(vals) & statics:
                    continue
            tried += 1
            try:
                ok = check(*(cand[s] for s in syms))
            except (ArithmeticError, ValueError, TypeError, NameError):
                ok = False
            if ok:
                return SecondShape(cand, first, tried)
            if tried > _MAX_CANDIDATES:
                return None
    return None


def held_symbols(values: Sequence[Any], args: Sequence[Any]) -> set:
    """The symbols whose value at ``args`` is a static size of some input: a size the
    model may need the symbol to equal, under another name no guard states (the batch of
    a decoder's step beside a tensor traced with that batch as a constant: moved, eager
    indexes past it). A second shape may keep them (``second_assignment``'s ``hold``)."""
    reader = Reader(values)
    if reader.env is None or reader.unbound:
        return set()
    statics = _static_sizes(values)
    return {s for s, v in reader.bind(args).items() if v in statics}


def _static_sizes(values: Sequence[Any]) -> set[int]:
    """The static sizes of the tensors among ``values`` (a graph's input values)."""
    return {int(s) for v in values if isinstance(v, torch.Tensor)
            for s in v.shape if not isinstance(s, torch.SymInt)}


def tied_groups(values: dict) -> list[list]:
    """The symbols of ``values`` (symbol -> int) grouped by equal value: groups in
    increasing value, each in ``values``' order."""
    return [[s for s in values if values[s] == v] for v in sorted(set(values.values()))]


def _candidate_deltas(n: int, limit: int = 20 * _MAX_CANDIDATES):
    """Delta vectors for ``n`` symbols, small steps first (at most ``limit``)."""
    if n == 0:
        return
    count = 0
    for level in range(len(_STEPS)):
        for combo in itertools.product(range(level + 1), repeat=n):
            if max(combo) == level:
                count += 1
                if count > limit:
                    return
                yield tuple(_STEPS[k] for k in combo)


def _condition(env, syms: Sequence[Any], first: dict) -> Optional[Callable]:
    """A compiled ``fn(*values of syms) -> bool``: ranges, guards and runtime asserts of
    ``env`` that involve ``syms``, other symbols fixed at their hints."""
    import sympy
    from torch.utils._sympy.printers import PythonPrinter

    hints = {}
    for k, v in (getattr(env, "backed_var_to_val", None) or {}).items():
        if v.is_Integer:
            hints[k] = v
    hints.update({s: sympy.Integer(v) for s, v in first.items()})
    mine = set(syms)
    conds = []
    for s in syms:
        lo, hi = bounds(s, env)
        conds.append(sympy.Ge(s, lo))
        if hi is not None:
            conds.append(sympy.Le(s, hi))
    exprs = [g.expr for g in env.guards]
    for asserts in getattr(env, "deferred_runtime_asserts", {}).values():
        exprs += [a.expr for a in asserts]
    for raw in exprs:
        e = env.simplify(raw)
        if not (e.free_symbols & mine):
            continue
        e = e.xreplace({k: v for k, v in hints.items() if k not in mine})
        if e in (sympy.true, sympy.false) or not (e.free_symbols <= mine):
            if e is sympy.false:
                return None  # a guard that already fails at the hints: cannot judge
            continue
        conds.append(e)
    printer = PythonPrinter()
    try:
        body = " and ".join(f"({printer.doprint(c)})" for c in conds) or "True"
    except Exception:  # noqa: BLE001
        return None
    params = ", ".join(_name(s) for s in syms)
    return _compile(f"def ok({params}):\n    return bool({body})", "ok")


def inputs_at(values: Sequence[Any], args: Sequence[Any], assignment: dict) -> list:
    """Inputs for the symbol ``assignment``: int inputs evaluated, tensors of the sizes
    and strides the metadata gives, filled by tiling the corresponding real argument
    (integer ids, masks and positive values stay in the ranges the call had)."""
    out = []
    for v, a in zip(values, args):
        if isinstance(v, torch.SymInt):
            out.append(int(expr(v).xreplace(assignment)))
        elif isinstance(v, torch.Tensor) and isinstance(a, torch.Tensor):
            size = [int(expr(s).xreplace(assignment)) for s in v.shape]
            stride = [int(expr(s).xreplace(assignment)) for s in _strides(v)]
            data = _tile(a.detach(), size)
            try:
                t = torch.empty_strided(size, stride, dtype=a.dtype, device=a.device)
                t.copy_(data)
            except RuntimeError:  # an overlapping (expanded) layout cannot be written
                t = data.contiguous()
            out.append(t)
        else:
            out.append(a)
    return out


def _tile(t: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """``t`` resized to ``size`` by repeating its elements along each dimension."""
    if t.dim() != len(size):
        return torch.zeros(size, dtype=t.dtype, device=t.device)
    for d, n in enumerate(size):
        old = t.shape[d]
        if old == n:
            continue
        if old == 0:
            shape = list(t.shape)
            shape[d] = n
            t = torch.zeros(shape, dtype=t.dtype, device=t.device)
            continue
        t = t.index_select(d, torch.arange(n, device=t.device) % old)
    return t
