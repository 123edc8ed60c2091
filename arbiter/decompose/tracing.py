"""One node's decomposition traced as an ATen graph, and inlined in place of the node.

Traced on fake tensors of the node's own shapes: no tensor is computed.
"""
from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ..ops import is_getitem

log = logging.getLogger(__name__)


class NotDecomposable(Exception):
    """Why a node's decomposition cannot be traced (the reason is the message)."""


#: A decomposition that declines these arguments (returns NotImplemented: SDPA's with a
#: mask, say) leaves the op itself: the node is then not decomposed, and a backend judges
#: it as it is (its manifest entry), as before it asked for the decomposition.
KEEPS_OP = "its decomposition keeps the op itself"
#: A node of symbolic shapes is not decomposed either: decompositions are traced for
#: static shapes. It is handed over whole, and judged whole (its manifest entry, which
#: says whether the op may take symbols): a decomposition that cannot serve a symbolic
#: node leaves it to the backend's own support, never pushes it to eager.
SYMBOLIC_KEEPS = "its shapes are symbolic (decompositions are traced for static shapes)"


def tensor_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The node arguments of ``node`` (in args, kwargs order, each once)."""
    return list(node.all_input_nodes)


def cache_key(node: torch.fx.Node) -> tuple:
    def one(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            v = a.meta.get("val")
            if isinstance(v, torch.Tensor):
                return ("T", tuple(v.shape), tuple(v.stride()), v.dtype, v.device.type)
            return ("N", repr(v))
        return a if isinstance(a, (int, float, bool, str, type(None), torch.dtype,
                                   torch.device, torch.layout, torch.memory_format)) \
            else repr(a)

    flat, spec = pytree.tree_flatten((node.args, node.kwargs))
    try:
        return (node.target, tuple(map(one, flat)), str(spec))
    except TypeError:  # an unhashable argument: a key that never repeats
        return (node.target, id(node))


def trace_node(node: torch.fx.Node, decomps: dict) -> Any:
    """The traced decomposition of ``node`` (a GraphModule), or why not (a str)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    inputs = tensor_args(node)
    vals = []
    for n in inputs:
        v = n.meta.get("val")
        if not isinstance(v, torch.Tensor):
            return f"input {n.name} is not a tensor with metadata"
        if not all(isinstance(s, int) for s in (*v.shape, *v.stride())):
            return SYMBOLIC_KEEPS
        vals.append(v)
    flat, spec = pytree.tree_flatten((node.args, node.kwargs))
    if any(not isinstance(a, torch.fx.Node) and isinstance(a, (torch.SymInt, torch.SymFloat))
           for a in flat):
        return SYMBOLIC_KEEPS
    where = {n: k for k, n in enumerate(inputs)}
    target = node.target

    want = node.meta.get("val")

    def fn(*ts):
        args, kwargs = pytree.tree_unflatten(
            [ts[where[a]] if isinstance(a, torch.fx.Node) else a for a in flat], spec)
        out = target(*args, **kwargs)
        # the node's users (views) rely on its outputs' strides: the decomposition's
        # outputs are given the node's layout where it differs
        if isinstance(out, torch.Tensor) and isinstance(want, torch.Tensor):
            return _restride(out, want)
        if isinstance(out, (tuple, list)) and isinstance(want, (tuple, list)) \
                and len(out) == len(want):
            return type(out)(_restride(o, w) if isinstance(o, torch.Tensor)
                             and isinstance(w, torch.Tensor) else o
                             for o, w in zip(out, want))
        return out

    mode = FakeTensorMode()
    try:
        with mode:
            fakes = [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
                     for v in vals]
        gm = make_fx(fn, tracing_mode="fake", decomposition_table=decomps)(*fakes)
    except Exception as exc:  # noqa: BLE001 - the reason goes to the report
        log.debug("tracing the decomposition of %s failed", node.format_node(), exc_info=True)
        return f"its decomposition could not be traced ({type(exc).__name__}: {str(exc)[:160]})"
    ops = [m for m in gm.graph.nodes if m.op == "call_function"]
    if any(m.target is target for m in ops):
        return KEEPS_OP
    return gm


def _restride(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t`` laid out with ``like``'s strides (dense, a permutation of a contiguous
    layout): permute, make contiguous, permute back. Raises when ``like``'s layout is not
    such a permutation (the node is then not decomposed)."""
    if tuple(t.shape) != tuple(like.shape) or _same_layout(t, like):
        return t
    order = sorted(range(like.dim()), key=lambda d: (-like.stride()[d], d))
    back = [order.index(d) for d in range(like.dim())]
    out = t.permute(order).contiguous().permute(back)
    if not _same_layout(out, like):
        raise NotDecomposable("its decomposition's output has other strides than the op's, "
                              f"{tuple(t.stride())} for {tuple(like.stride())}")
    return out


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal strides on every dimension of size above 1."""
    return all(n <= 1 or x == y for n, x, y in zip(a.shape, a.stride(), b.stride()))


def inline(graph: torch.fx.Graph, node: torch.fx.Node, sub: torch.fx.GraphModule) -> None:
    """Replace ``node`` in ``graph`` by the nodes of ``sub`` (from ``Decompositions.trace``)."""
    inputs = tensor_args(node)
    mode = _fake_mode_of(node)
    env: dict[torch.fx.Node, Any] = {}
    placeholders = [m for m in sub.graph.nodes if m.op == "placeholder"]
    for p, arg in zip(placeholders, inputs):
        env[p] = arg
    result: Any = None
    with graph.inserting_before(node):
        for m in sub.graph.nodes:
            if m.op == "placeholder":
                continue
            if m.op == "output":
                result = pytree.tree_map(lambda a: env[a] if isinstance(a, torch.fx.Node) else a,
                                         m.args[0])
                break
            if m.op == "get_attr":  # a constant the decomposition made (a scalar tensor)
                name = f"_decomp_const_{len(list(graph.owning_module.named_buffers()))}"
                graph.owning_module.register_buffer(name, getattr(sub, m.target), persistent=False)
                env[m] = graph.get_attr(name)
            else:
                env[m] = graph.node_copy(m, lambda a: env[a])
            env[m].meta = dict(m.meta)
            if mode is not None and "val" in m.meta:
                env[m].meta["val"] = _in_mode(m.meta["val"], mode)
    if isinstance(result, (tuple, list)):
        for user in list(node.users):
            if not (is_getitem(user) and isinstance(user.args[1], int)):
                raise NotDecomposable(f"{node.name} is read whole, not through getitem")
            user.replace_all_uses_with(result[user.args[1]])
            graph.erase_node(user)
    else:
        node.replace_all_uses_with(result)
    graph.erase_node(node)


def traced_call(graph: torch.fx.Graph, op: Any, *args: Any, quiet: bool = False,
                **kwargs: Any) -> torch.fx.Node:
    """A new ``op`` node of ``graph`` (at its insert point) with its traced value where
    every node among ``args`` has one (what a rewrite's backend reads of it; exporters
    trace again). ``quiet``: a value that fails to compute is left out (values of two fake
    modes, say) rather than raised."""
    out = graph.call_function(op, args, kwargs)
    vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in args]
    if all(not isinstance(a, torch.fx.Node) or isinstance(v, torch.Tensor)
           for a, v in zip(args, vals)):
        try:
            out.meta["val"] = op(*vals, **kwargs)
        except Exception:  # noqa: BLE001 - re-raised unless quiet
            if not quiet:
                raise
    return out


def _fake_mode_of(node: torch.fx.Node) -> Any:
    """The fake mode of ``node``'s traced value (or of its inputs'), None if none."""
    from torch._subclasses.fake_tensor import FakeTensor

    for n in (node, *node.all_input_nodes):
        for v in pytree.tree_leaves(n.meta.get("val")):
            if isinstance(v, FakeTensor):
                return v.fake_mode
    return None


def _in_mode(val: Any, mode: Any) -> Any:
    """``val``'s fake tensors of static sizes made again in ``mode`` (same sizes, strides,
    dtype, device). A traced decomposition is kept between graphs (``Decompositions``
    keys it by the node's signature), so its values are of the first graph's fake mode;
    copied as they were into a later graph, that graph's partitions held inputs of two
    modes, which Inductor refuses (two models of one architecture compiled in one
    process: their dropout masks)."""
    from torch._subclasses.fake_tensor import FakeTensor

    def one(v: Any) -> Any:
        if not isinstance(v, FakeTensor) or v.fake_mode is mode or any(
                isinstance(d, torch.SymInt) for d in (*v.shape, *v.stride())):
            return v
        with mode:
            return torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype,
                                       device=v.device)

    return pytree.tree_map(one, val)
