"""``cat`` without the 1-D empty tensors it skips by a legacy rule.

``torch.cat`` ignores a tensor of shape ``(0,)`` whatever the other inputs' rank, and a
decoder's key/value cache starts so (``cat([empty(0), key], -2)``); ONNX's and
OpenVINO's Concat take no such input, so the graph was cut around those cats.
``drop_legacy_empty`` rewrites such a ``cat`` to its other inputs only, which computes
the same values: when all inputs left have the result's dtype (the skipped tensor takes
part in type promotion: a float64 ``(0,)`` beside float32 keys makes float64, and that
cat is left as it is); a single input left becomes a contiguous copy (``cat`` never
returns a view). Static shapes only. docs/design.md ("A cache's first cat").
"""
from __future__ import annotations

import logging

import torch
import torch.fx

log = logging.getLogger(__name__)


def _legacy_empty(val) -> bool:
    return isinstance(val, torch.Tensor) and val.dim() == 1 and \
        isinstance(val.shape[0], int) and val.shape[0] == 0


def drop_legacy_empty(gm: torch.fx.GraphModule) -> int:
    """Rewrite ``gm``'s cats (see the module) in place; the number rewritten."""
    aten = torch.ops.aten
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.cat.default:
            continue
        tensors = node.args[0] if node.args else node.kwargs.get("tensors")
        out = node.meta.get("val")
        if not isinstance(tensors, (list, tuple)) or not isinstance(out, torch.Tensor):
            continue
        vals = [t.meta.get("val") if isinstance(t, torch.fx.Node) else None for t in tensors]
        if any(not isinstance(v, torch.Tensor) for v in vals):
            continue
        kept = [t for t, v in zip(tensors, vals) if not _legacy_empty(v)]
        kept_vals = [v for v in vals if not _legacy_empty(v)]
        if len(kept) == len(tensors) or not kept or out.dim() <= 1 or \
                any(v.dtype != out.dtype or v.dim() != out.dim() for v in kept_vals):
            continue
        with gm.graph.inserting_before(node):
            if len(kept) == 1:
                new = gm.graph.call_function(aten.clone.default, (kept[0],),
                                             {"memory_format": torch.contiguous_format})
            else:
                dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
                new = gm.graph.call_function(aten.cat.default, (kept, dim))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        for t in tensors:  # an empty tensor made in the graph for this cat alone
            if isinstance(t, torch.fx.Node) and t.op == "call_function" and not t.users \
                    and not t.is_impure():
                gm.graph.erase_node(t)
        done += 1
    if done:
        gm.recompile()
        log.debug("%d cat(s) without their legacy empty inputs", done)
    return done
