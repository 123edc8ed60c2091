"""``cat`` without the 1-D empty tensors it skips by a legacy rule.

``torch.cat`` ignores a tensor of shape ``(0,)`` whatever the other inputs' rank: the
first key/value concatenation of transformers' ``DynamicCache`` (GPT-2's, LLaMA's and
every decoder's caches start empty) is ``cat([empty(0), key], -2)``. ONNX's and
OpenVINO's Concat take no such input (OpenVINO: "Axis -2 out of the tensor rank range
[-1, 0]"), so OpenVINO's validator refused these cats and a four-layer LLaMA-style model
ran as nine partitions, OpenVINO and eager in turn, 0.86-0.95x eager's speed.

``drop_legacy_empty`` rewrites such a ``cat`` to one of the other inputs only, which
computes the same values: when at least one input is left, all left have the result's
dtype (the skipped tensor takes part in type promotion, so a float64 ``(0,)`` beside
float32 keys makes float64: that cat is left as it is), and a single input left becomes a
contiguous copy (``cat`` returns a new tensor, never a view of its input). Static shapes
only (a symbolic size that might be 0 is not judged).
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
