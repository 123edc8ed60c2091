"""A static KV cache's write made in place, so a decode step does not copy whole caches.

AOTAutograd hands a decode step of a static cache (transformers' ``StaticCache``) to
arbiter as a functional graph: the step's keys and values are written into a new cache
tensor (``index_copy(cache, 2, positions, k)``), which attention reads, and a ``copy_``
at the graph's end writes it back into the user's buffer. Run that way, every step moves
each whole cache twice (the backend writes a new one, ``copy_`` copies it back): with a
real model's cache (thousands of positions, dozens of layers) that is gigabytes per
token, where the step's own work writes one position. ``write_caches_in_place``
rewrites the pattern to what eager runs: ``index_copy_`` into the user's buffer where
the functional write was (an in-place op: it runs in eager ATen, between the backend's
partitions) and the read of the written cache from that buffer; the trailing ``copy_``
goes. It applies only where nothing else reads the cache, and only to caches of at least
``MIN_BYTES``: below that the copies cost less than the partition cut the in-place
write makes (a backend call, tens of microseconds).
"""
from __future__ import annotations

import logging

import torch
import torch.fx

log = logging.getLogger(__name__)

aten = torch.ops.aten

#: A cache tensor smaller than this keeps the functional write (see the module).
MIN_BYTES = 1 << 20

#: functional write -> its in-place twin (the same arguments)
IN_PLACE = {aten.index_copy.default: aten.index_copy_.default,
            aten.index_put.default: aten.index_put_.default}


def write_caches_in_place(gm: torch.fx.GraphModule) -> int:
    """Rewrite ``gm``'s whole-cache writes in place (see the module); the number
    rewritten."""
    done = 0
    for node in list(gm.graph.nodes):
        back = _written_back(node)
        if back is None:
            continue
        with gm.graph.inserting_before(node):
            inplace = gm.graph.call_function(IN_PLACE[node.target], node.args, node.kwargs)
        inplace.meta = dict(node.meta)
        gm.graph.erase_node(back)
        node.replace_all_uses_with(inplace)
        gm.graph.erase_node(node)
        done += 1
    if done:
        gm.graph.lint()
        gm.recompile()
        log.info("%d cache write(s) made in place (each whole cache was copied twice "
                 "per call)", done)
    return done


def _written_back(node: torch.fx.Node) -> torch.fx.Node | None:
    """The trailing ``copy_(cache, node)`` when ``node`` is a functional write into the
    graph input ``cache`` that nothing else reads, of at least ``MIN_BYTES``; else None."""
    if node.op != "call_function" or node.target not in IN_PLACE or not node.args:
        return None
    if node.target is aten.index_put.default and (
            node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)):
        return None  # accumulating: not a write
    cache = node.args[0]
    if not isinstance(cache, torch.fx.Node) or cache.op != "placeholder":
        return None
    val = cache.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    numel = val.numel()
    if not isinstance(numel, int):  # symbolic sizes: a dynamic cache, not this pattern
        return None
    if numel * val.element_size() < MIN_BYTES:
        return None
    others = [u for u in cache.users if u is not node]
    if len(others) != 1:
        return None
    back = others[0]
    if back.target is not aten.copy_.default or back.args[:2] != (cache, node) \
            or back.users:
        return None
    return back
