"""One backend's ``decompositions:`` (``Decompositions``), and the partition as it gets it.

Which of a partition's nodes the backend wants decomposed, their traced decompositions
(a bounded process-wide cache), and the partition as that backend gets it
(``for_backend``).
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Optional

import torch
import torch.fx

from ..ops import op_name, packet_name
from .tables import table
from .tracing import KEEPS_OP, SYMBOLIC_KEEPS, NotDecomposable, cache_key, inline, trace_node

log = logging.getLogger(__name__)

#: traced decompositions kept (per op, argument values and shapes)
CACHE_SIZE = 4096


def wants(names: Sequence[str], op: str) -> bool:
    """Whether a manifest's ``decompositions`` list (``names``) names ``op``."""
    return op in names or packet_name(op) in names


class Decompositions:
    """One backend's ``decompositions:``: which nodes it wants decomposed, and how."""

    def __init__(self, names: Sequence[str], decompositions: Optional[dict] = None):
        self.names = tuple(names)
        if decompositions is not None:  # a table of its own ({OpOverload: function})
            self.table = dict(decompositions)
        else:
            self.table = table(self.names) if self.names else {}

    def __bool__(self) -> bool:
        return bool(self.table)

    def applies(self, node: torch.fx.Node) -> bool:
        """Whether ``node`` is an op of the list with a decomposition in the table."""
        return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
                and node.target in self.table and wants(self.names, op_name(node.target)))

    def keeps(self, node: torch.fx.Node) -> bool:
        """Whether the decomposition of ``node`` declines its arguments (``KEEPS_OP``), or
        the node is symbolic (``SYMBOLIC_KEEPS``): the node is then handed over whole."""
        return self.kept_because(node) is not None

    def kept_because(self, node: torch.fx.Node) -> Optional[str]:
        """Why ``node`` is handed over whole (``KEEPS_OP`` or ``SYMBOLIC_KEEPS``), or None."""
        try:
            self.trace(node)
        except NotDecomposable as exc:
            return str(exc) if str(exc) in (KEEPS_OP, SYMBOLIC_KEEPS) else None
        return None

    def trace(self, node: torch.fx.Node) -> torch.fx.GraphModule:
        """The decomposition of ``node`` as an ATen graph: one placeholder per tensor
        argument (in ``tracing.tensor_args`` order), its output(s) as the node returns them,
        ``meta["val"]`` on every node. Raises ``NotDecomposable`` with the reason."""
        key = cache_key(node)
        try:
            hash(key)
        except TypeError:  # symbolic sizes (SymInt) are unhashable: not cached
            hit = trace_node(node, self.table)
            if isinstance(hit, str):
                raise NotDecomposable(hit) from None
            return hit
        with _LOCK:
            hit = _CACHE.get((id(self.table), key))
            if hit is not None:
                _CACHE.move_to_end((id(self.table), key))
        if hit is None:
            hit = trace_node(node, self.table)
            with _LOCK:
                _CACHE[(id(self.table), key)] = hit
                while len(_CACHE) > CACHE_SIZE:
                    _CACHE.popitem(last=False)
        if isinstance(hit, str):
            raise NotDecomposable(hit)
        return hit

    def apply(self, gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        """``gm`` with every node this backend wants decomposed replaced by its traced
        decomposition; ``gm`` itself when there is none (a copy otherwise: the caller's
        graph is what eager and the other backends run)."""
        if not self or not any(self.applies(n) and not self.keeps(n) for n in gm.graph.nodes):
            return gm
        import copy

        new = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph), class_name=type(gm).__name__)
        for node in list(new.graph.nodes):
            if self.applies(node) and not self.keeps(node):
                inline(new.graph, node, self.trace(node))
        new.graph.eliminate_dead_code()
        new.graph.lint()
        new.recompile()
        return new


_CACHE: "OrderedDict[tuple, Any]" = OrderedDict()
_LOCK = threading.Lock()
_BY_NAMES: dict[tuple, Decompositions] = {}


def for_names(names: Sequence[str]) -> Decompositions:
    """The (shared) ``Decompositions`` of one list of op names."""
    key = tuple(names)
    with _LOCK:
        hit = _BY_NAMES.get(key)
    if hit is None:
        hit = Decompositions(key)
        with _LOCK:
            hit = _BY_NAMES.setdefault(key, hit)
    return hit


def for_backend(gm: torch.fx.GraphModule, backend: Any) -> torch.fx.GraphModule:
    """The partition ``gm`` as ``backend`` (a ``registry.Backend``) gets it: the nodes its
    manifest's ``decompositions:`` names replaced by their decompositions."""
    names = _names(backend)
    return for_names(names).apply(gm) if names else gm


def for_symbolic(gm: torch.fx.GraphModule, backend: Any) -> torch.fx.GraphModule:
    """A symbolic partition as ``backend`` gets it: decompositions are traced for static
    shapes only, so none is applied; where its manifest wants the flash attention
    decomposed (its own translation of the op is not eager's), grouped attention heads
    are repeated (``repeat_grouped_heads``) and rows its mask leaves no key get eager's
    zeros (``masked_rows``: ONNX Runtime's export computed NaN there, silently, on the
    calls that had such a row)."""
    names = _names(backend)
    out = repeat_grouped_heads(gm, names)
    return _rows_guarded(out, out is gm) if wants(names, _FLASH) else out


def _rows_guarded(gm: torch.fx.GraphModule, shared: bool) -> torch.fx.GraphModule:
    """``gm`` with ``masked_rows.guard_masked_rows`` applied (on a copy where ``shared``:
    the partition's graph serves the other entries of its chain); ``gm`` where nothing
    applies."""
    import copy

    from .masked_rows import FLASH, guard_masked_rows

    if not any(n.target is FLASH for n in gm.graph.nodes):
        return gm
    new = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph), class_name=type(gm).__name__) \
        if shared else gm
    if guard_masked_rows(new.graph, new):
        new.graph.lint()
        new.recompile()
        return new
    return gm


def _names(backend: Any) -> tuple:
    """The ``decompositions:`` of ``backend``'s manifest; () without one."""
    try:
        return tuple(backend.manifest().decompositions or ())
    except Exception:  # noqa: BLE001 - no manifest (a probe's ad-hoc backend): none wanted
        log.debug("%s: no manifest, nothing decomposed for it", getattr(backend, "name", backend),
                  exc_info=True)
        return ()


_FLASH = "aten._scaled_dot_product_flash_attention_for_cpu.default"


def repeat_grouped_heads(gm: torch.fx.GraphModule, names: Sequence[str]) -> torch.fx.GraphModule:
    """A symbolic partition whose backend wants the CPU flash attention decomposed (its
    own translation does not take grouped-query attention: ONNX Runtime's export made a
    MatMul of 8 query heads against 2 key heads, "ShapeInferenceError: Incompatible
    dimensions", and every decode step of a Llama-style model fell back), with each such
    node's key and value heads repeated over their groups in the graph (``unsqueeze``,
    ``expand``, ``reshape``, as ``decompose.own`` does for static shapes), so the node
    the backend translates has as many key/value heads as query heads. Static head
    counts only; ``gm`` itself when nothing applies (a copy otherwise)."""
    from .own import head_groups

    if not wants(names, _FLASH):
        return gm
    todo = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or op_name(n.target) != _FLASH or len(n.args) < 3:
            continue
        vals = [getattr(a, "meta", {}).get("val") for a in n.args[:3]]
        if all(isinstance(v, torch.Tensor) for v in vals):
            groups = head_groups(*vals)
            if groups is not None and groups > 1:
                todo.append((n.name, groups))
    if not todo:
        return gm
    import copy

    new = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph), class_name=type(gm).__name__)
    by_name = {n.name: n for n in new.graph.nodes}
    aten = torch.ops.aten
    for name, groups in todo:
        node = by_name[name]
        with new.graph.inserting_before(node):
            for k in (1, 2):
                t = node.args[k]
                val = t.meta["val"]
                dims = [s if isinstance(s, int) else
                        new.graph.call_function(aten.sym_size.int, (t, i))
                        for i, s in enumerate(val.shape)]
                b, h, length, d = dims
                wide = new.graph.call_function(aten.expand.default, (
                    new.graph.call_function(aten.unsqueeze.default, (t, 2)),
                    [b, h, groups, length, d]))
                node.update_arg(k, new.graph.call_function(
                    aten.reshape.default, (wide, [b, h * groups, length, d])))
    new.graph.lint()
    new.recompile()
    _propagate_meta(new)
    return new


def _propagate_meta(gm: torch.fx.GraphModule) -> None:
    """``meta["val"]`` for the nodes a rewrite added, from their inputs' fake values."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    mode = next((v.fake_mode for v in vals if hasattr(v, "fake_mode")), None)
    if mode is None:
        return
    try:
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*vals)
    except Exception:  # noqa: BLE001 - exporters re-trace; metadata is a convenience
        log.debug("fake propagation after the head rewrite failed", exc_info=True)

