"""Attention rows a mask leaves no key: eager's zeros, where a backend computed NaN.

A query sees no key when its float mask (what SDPA hands the kernel: -inf where a bool
mask was False) is -inf across its row: a left-padded sequence's first queries under a
causal mask, a batch row that is all padding. The CPU kernel returns 0 there and a
logsumexp of 0. OpenVINO's attention and ONNX Runtime's export of the kernel (taken whole
by a symbolic partition: its traced decompositions are for static shapes) computed a
softmax over nothing, NaN, which went on into a KV cache and that sequence's logits;
only calls with such a row showed it, so a first-use check on another call passed.

``guard_masked_rows`` rewrites each such node in place: its mask clamped to the dtype's
lowest finite value (added to a score, the same weight of exactly 0 as -inf beside any
visible key), its output multiplied by whether the row has a key above -inf, its
logsumexp (where read: a backward) set to 0 in rows without one. A mask that is a
constant without such a row is left alone (a causal mask alone).
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from .tracing import traced_call

FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def guard_masked_rows(graph: torch.fx.Graph, owner: Any) -> bool:
    """Rewrite ``graph``'s flash attentions with a float mask (see the module); ``owner``
    holds its ``get_attr`` constants. Returns whether anything changed."""
    changed = False
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is FLASH:
            changed |= _guard(graph, node, owner)
    return changed


def _guard(graph: torch.fx.Graph, node: torch.fx.Node, owner: Any) -> bool:
    mask = node.kwargs.get("attn_mask")
    if not isinstance(mask, torch.fx.Node):
        return False
    val = mask.meta.get("val")
    if not isinstance(val, torch.Tensor) or not val.is_floating_point():
        return False
    if mask.op == "get_attr":
        held = getattr(owner, str(mask.target), None)
        if isinstance(held, torch.Tensor) and bool((held > float("-inf")).any(-1).all()):
            return False
    aten = torch.ops.aten

    def call(op, *args, **kwargs):
        return traced_call(graph, op, *args, quiet=True, **kwargs)

    outputs = {u.args[1]: u for u in node.users
               if u.op == "call_function" and u.target is operator.getitem}
    with graph.inserting_before(node):
        clamped = call(aten.clamp.default, mask, torch.finfo(val.dtype).min)
        seen = call(aten.ne.Scalar, mask, float("-inf"))
        rows = call(aten.any.dim, seen, -1, True)  # (..., length, 1): a key to attend to
        keep = call(aten._to_copy.default, rows, dtype=val.dtype)
    node.update_kwarg("attn_mask", clamped)
    if 0 in outputs:
        _after(graph, outputs[0], lambda out: call(aten.mul.Tensor, out, keep))
    if 1 in outputs:  # the logsumexp (batch, heads, length): 0 where no key, as eager's
        _after(graph, outputs[1], lambda lse: call(
            aten.where.ScalarOther, call(aten.squeeze.dim, rows, -1), lse, 0.0))
    return True


def _after(graph: torch.fx.Graph, node: torch.fx.Node, make) -> None:
    """Route ``node``'s users through ``make(node)``, inserted right after it (before
    the node that follows it: nodes made in one go keep their order)."""
    users = list(node.users)
    if not users:
        return
    with graph.inserting_before(node.next):
        new = make(node)
    for u in users:
        u.replace_input_with(node, new)
