"""Graph surgery: a plan's partitions become standalone graphs, one stitched graph calls them.

Each non-inline partition becomes its own GraphModule taking the values that flow in
(constants baked in as attributes) and returning, as a tuple, the values used outside it.
The stitched graph keeps the original placeholders and output, runs inline (eager)
partitions' ATen nodes in place, and calls every other partition through one
``call_function`` node followed by ``getitem``s: one Python call per partition, nothing
per eager node. A graph that is one partition's call skips the GraphModule (``Direct``).
Symbolic sizes: a partition reads them from its own tensor inputs
(``aten.sym_size.int``), so exporters see one named dimension per symbol; a symbol no
tensor input carries bare comes in as the graph's own SymInt input (docs/design.md,
"Dynamic shapes").
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from ..ops import attr_value
from ..shapes import expr as size_expr, free_symbols, is_symbolic
from ..plan.partition import Partition, Plan


@dataclass
class Subgraph:
    """One partition cut out as a standalone ATen graph."""

    partition: Partition
    gm: torch.fx.GraphModule
    inputs: list[torch.fx.Node]   # nodes of the original graph feeding it, in order
    outputs: list[torch.fx.Node]  # nodes of the original graph it produces for others


def extract(plan: Plan, partition: Partition,
            constants: dict[torch.fx.Node, torch.Tensor]) -> Subgraph:
    """Cut ``partition`` out of ``plan.graph_module``.

    ``constants`` maps placeholders of the graph to real tensors to bake in (frozen
    weights); ``get_attr`` nodes are baked in as well.
    """
    src = plan.graph_module
    members = set(partition.nodes)
    root = torch.nn.Module()
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    inputs: list[torch.fx.Node] = []

    def bring(n: torch.fx.Node) -> torch.fx.Node:
        if n in env:
            return env[n]
        if n.op == "get_attr" or n in constants:
            value = constants[n] if n in constants else attr_value(src, n.target)
            attr = f"_const_{len(root._buffers)}"
            root.register_buffer(attr, value, persistent=False)
            new = graph.get_attr(attr)
        else:
            new = graph.placeholder(n.name)
            inputs.append(n)
        new.meta = dict(n.meta)
        env[n] = new
        return new

    for node in partition.nodes:
        for inp in node.all_input_nodes:
            if inp not in members:
                bring(inp)
        env[node] = graph.node_copy(node, lambda n: env[n])

    outputs = []
    for node in partition.nodes:
        if any(u not in members for u in node.users):
            outputs.append(node)
    out = graph.output(tuple(env[n] for n in outputs))
    out.meta["val"] = tuple(n.meta.get("val") for n in outputs)
    if any(is_symbolic(n.meta.get("val")) for n in inputs):
        inputs = _symbolic_inputs(graph, inputs, src.graph)
    gm = torch.fx.GraphModule(root, graph, class_name=f"Partition{partition.id}")
    return Subgraph(partition, gm, inputs, outputs)


def _symbolic_inputs(graph: torch.fx.Graph, inputs: list[torch.fx.Node],
                     outer: torch.fx.Graph) -> list[torch.fx.Node]:
    """Rewrite a cut partition's symbolic inputs (see the module docstring); returns its
    inputs (nodes of the outer graph) in the new placeholder order."""
    phs = [n for n in graph.nodes if n.op == "placeholder"]
    src_of = dict(zip(phs, inputs))
    first = next((n for n in graph.nodes if n.op != "placeholder"), None)
    for p in phs:  # placeholders first, in input order (exporters expect it)
        if first is not None:
            first.prepend(p)
    sites: dict = {}  # symbol -> (tensor placeholder, dim)
    for p in phs:
        v = p.meta.get("val")
        if isinstance(v, torch.Tensor):
            for d, size in enumerate(v.shape):
                e = size_expr(size)
                if e.is_Symbol and e not in sites:
                    sites[e] = (p, d)
    anchor = next((n for n in graph.nodes if n.op != "placeholder"), None)
    for p in phs:
        v = p.meta.get("val")
        if not isinstance(v, torch.SymInt) or anchor is None:
            continue
        e = size_expr(v)
        if e.is_number or not e.free_symbols <= set(sites):
            continue
        try:
            with graph.inserting_before(anchor):
                new = _emit(graph, e, sites)
        except NotImplementedError:
            continue
        if isinstance(new, torch.fx.Node):
            new.meta["val"] = v
        p.replace_all_uses_with(new)
        graph.erase_node(p)
        del src_of[p]
    # symbols no input carries bare: bring the outer graph's SymInt input for each
    kept = [p for p in phs if p in src_of]
    bare = {size_expr(p.meta["val"]): p for p in kept
            if isinstance(p.meta.get("val"), torch.SymInt) and size_expr(p.meta["val"]).is_Symbol}
    needed = free_symbols(p.meta.get("val") for p in kept)
    outer_ints = _outer_symbol_inputs(outer)
    last = kept[-1] if kept else None
    for sym in sorted(needed - set(sites), key=str):
        src = outer_ints.get(sym)
        old = bare.get(sym)
        if src is None or (old is not None and _raw(old.meta["val"]) == sym):
            continue
        if src in src_of.values():
            continue
        if last is None:
            with graph.inserting_before(anchor):
                new = graph.placeholder(src.name)
        else:
            with graph.inserting_after(last):
                new = graph.placeholder(src.name)
        new.meta = dict(src.meta)
        last = new
        src_of[new] = src
        if old is not None:  # same symbol, but bound under another raw name: replace it
            old.replace_all_uses_with(new)
            graph.erase_node(old)
            del src_of[old]
    graph.lint()
    return [src_of[p] for p in graph.nodes if p.op == "placeholder"]


def _raw(value: torch.SymInt):
    return value.node._expr


def _outer_symbol_inputs(outer: torch.fx.Graph) -> dict:
    """symbol -> a placeholder of the outer graph that is that symbol, preferring one
    whose raw (unreplaced) expression is the symbol itself."""
    found: dict = {}
    for n in outer.nodes:
        if n.op != "placeholder" or not isinstance(n.meta.get("val"), torch.SymInt):
            continue
        v = n.meta["val"]
        e = size_expr(v)
        if not e.is_Symbol:
            continue
        if e not in found or (_raw(found[e].meta["val"]) != e and _raw(v) == e):
            found[e] = n
    return found


def _emit(graph: torch.fx.Graph, e, sites: dict):
    """FX nodes computing the sympy expression ``e`` from tensor placeholders' sizes."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv, Mod, PythonMod

    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        p, d = sites[e]
        node = graph.call_function(torch.ops.aten.sym_size.int, (p, d))
        node.meta["val"] = p.meta["val"].shape[d]
        return node
    if isinstance(e, (sympy.Mul, sympy.Add)):
        op = operator.mul if isinstance(e, sympy.Mul) else operator.add
        out = None
        for a in e.args:
            x = _emit(graph, a, sites)
            out = x if out is None else _binary(graph, op, out, x)
        return out
    if isinstance(e, FloorDiv):
        return _binary(graph, operator.floordiv, _emit(graph, e.args[0], sites),
                       _emit(graph, e.args[1], sites))
    if isinstance(e, (Mod, PythonMod)):
        return _binary(graph, operator.mod, _emit(graph, e.args[0], sites),
                       _emit(graph, e.args[1], sites))
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
        base = _emit(graph, e.base, sites)
        out = base
        for _ in range(int(e.exp) - 1):
            out = _binary(graph, operator.mul, out, base)
        return out
    raise NotImplementedError(f"size expression {e}")


def _binary(graph: torch.fx.Graph, op, a, b):
    if not isinstance(a, torch.fx.Node) and not isinstance(b, torch.fx.Node):
        return op(a, b)
    node = graph.call_function(op, (a, b))
    va = a.meta["val"] if isinstance(a, torch.fx.Node) else a
    vb = b.meta["val"] if isinstance(b, torch.fx.Node) else b
    node.meta["val"] = op(va, vb)
    return node


def stitch(plan: Plan, runners: dict[int, tuple[Subgraph, Callable]],
           inline: set[int]) -> Callable:
    """One GraphModule that runs the partitions in plan order; a ``Direct`` call of the
    one partition when that is all the graph does (``direct``).

    ``runners[pid] = (subgraph, callable)`` for partitions run by a backend; partitions
    in ``inline`` keep their ATen nodes in place.
    """
    src = plan.graph_module
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    root = torch.nn.Module()
    for node in src.graph.nodes:
        if node.op == "placeholder":
            env[node] = graph.node_copy(node)
        elif node.op == "get_attr":
            value = attr_value(src, node.target)
            name = node.target.replace(".", "_")
            if isinstance(value, torch.Tensor):
                root.register_buffer(name, value, persistent=False)
            else:
                setattr(root, name, value)
            env[node] = graph.get_attr(name)
            env[node].meta = dict(node.meta)
    for part in plan.partitions:
        if part.id in inline:
            for node in part.nodes:
                env[node] = graph.node_copy(node, lambda n: env[n])
            continue
        sub, fn = runners[part.id]
        call = graph.call_function(fn, tuple(env[n] for n in sub.inputs))
        call.name = f"partition_{part.id}_{part.backend}"
        for k, node in enumerate(sub.outputs):
            got = graph.call_function(operator.getitem, (call, k))
            got.meta = dict(node.meta)
            env[node] = got
    for node in src.graph.nodes:
        if node.op == "output":
            graph.node_copy(node, lambda n: env[n])
    graph.lint()
    gm = torch.fx.GraphModule(root, graph, class_name="Stitched")
    return direct(gm) or gm


class Direct:
    """A stitched graph that is one partition's call and nothing else, called directly.

    ``GraphModule.__call__`` (``nn.Module``'s call machinery, the generated ``forward``,
    one ``getitem`` per output) costs about 2 us a call, as much as a small partition's
    whole run on ONNX Runtime (bench/README.md, ``per_call_floor.py``). This does the
    same work: it picks the partition's inputs from the graph's, calls it, and returns
    the graph's outputs (the partition's, or graph inputs returned as they are) as the
    stitched module would, a tuple. ``gm`` is that stitched module (what ``graph``
    shows, and what runs the same thing the slow way)."""

    def __init__(self, gm: torch.fx.GraphModule, fn: Callable, picks: list[int],
                 outs: list[tuple[bool, int]]):
        self.gm = gm
        self.graph = gm.graph
        self._fn = fn
        self._picks = picks
        self._pick = operator.itemgetter(*picks) if len(picks) > 1 else None
        self._outs = outs
        # every output of the partition, in order, and nothing else: its list as a tuple
        self._whole = outs == [(True, k) for k in range(len(outs))]

    def __call__(self, *args: Any) -> tuple:
        picks = self._picks
        if self._pick is not None:
            got = self._fn(*self._pick(args))
        elif picks:
            got = self._fn(args[picks[0]])
        else:
            got = self._fn()
        if self._whole and len(got) == len(self._outs):
            return tuple(got)
        return tuple(got[k] if mine else args[k] for mine, k in self._outs)


def direct(gm: torch.fx.GraphModule) -> "Direct | None":
    """``gm`` as a ``Direct`` call when it is placeholders, one call of a partition, its
    ``getitem``s and an output tuple of those and of placeholders; else None."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    calls = [n for n in nodes if n.op == "call_function" and n.target is not operator.getitem]
    outputs = [n for n in nodes if n.op == "output"]
    if len(calls) != 1 or len(outputs) != 1 or \
            any(n.op not in ("placeholder", "call_function", "output") for n in nodes):
        return None
    call = calls[0]
    if call.kwargs or not all(a in placeholders for a in call.args):
        return None
    getitems = {}
    for n in nodes:
        if n.op == "call_function" and n.target is operator.getitem:
            if n.args[0] is not call or n.kwargs or not isinstance(n.args[1], int):
                return None
            getitems[n] = n.args[1]
    result = outputs[0].args[0]
    if not isinstance(result, tuple) or outputs[0].kwargs:
        return None
    position = {n: i for i, n in enumerate(placeholders)}
    outs = []
    for r in result:
        if r in getitems:
            outs.append((True, getitems[r]))
        elif r in position:
            outs.append((False, position[r]))
        else:
            return None
    return Direct(gm, call.target, [position[a] for a in call.args], outs)
