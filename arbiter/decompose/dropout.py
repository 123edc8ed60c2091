"""Dropout split apart from its random draw (config ``random: eager``).

The mask is drawn by an eager op of its own (``dropout_mask_op``); the multiplications
are left for any backend to take.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

import torch
import torch.fx

from ..ops import is_getitem
from .per_backend import Decompositions
from .tracing import NotDecomposable, inline

log = logging.getLogger(__name__)

#: dtypes whose dropout is split (``split_dropout``): for float16/bfloat16 eager's
#: ``mul_(scale)`` rounds otherwise than ``mul.Tensor`` (measured: same mask, other output)
SPLIT_DROPOUT_DTYPES = (torch.float32, torch.float64)

_MASK_OP: Any = None
_LOCK = threading.Lock()


def dropout_mask_op() -> Any:
    """``arbiter.dropout_mask(size, stride, p, dtype) -> Tensor(bool)``: the mask eager's
    CPU ``native_dropout`` draws for an input of that geometry and dtype (``empty_like``,
    ``bernoulli_(1 - p)``, as bool), reading no tensor. Tagged ``nondeterministic_seeded``,
    so it is a random op (``ops.is_random``) like the dropout it comes from: it runs in
    place, in the order of the graph's random ops. Defined on first use."""
    global _MASK_OP
    with _LOCK:
        if _MASK_OP is None:
            lib = torch.library.Library("arbiter", "FRAGMENT")  # noqa: TOR901 - kept below
            lib.define("dropout_mask(int[] size, int[] stride, float p, ScalarType dtype) "
                       "-> Tensor", tags=(torch.Tag.nondeterministic_seeded,))
            lib.impl("dropout_mask", _draw_mask, "CompositeExplicitAutograd")
            torch.library.register_fake("arbiter::dropout_mask", _fake_mask, lib=lib)
            _LIBS.append(lib)
            _MASK_OP = torch.ops.arbiter.dropout_mask.default
    return _MASK_OP


_LIBS: list = []  # the library fragment lives as long as the process


def _draw_mask(size, stride, p, dtype):
    drawn = torch.empty_strided(size, stride, dtype=dtype)
    drawn.bernoulli_(1.0 - p)
    return drawn.to(torch.bool)


def _fake_mask(size, stride, p, dtype):
    return torch.empty_strided(size, stride, dtype=torch.bool)


def _native_dropout_split(x, p, train):
    """``native_dropout`` as eager's CPU kernel computes it, with its random draw apart:
    ``mask = dropout_mask(...)`` (no input), ``out = x * mask * (1 / (1 - p))`` (0 when
    ``p == 1``). Bit-equal to eager's outputs and RNG stream for float32/float64 inputs
    on the CPU with static shapes; NotImplemented otherwise (the op stays whole)."""
    aten = torch.ops.aten
    if (train is not None and not train) or x.dtype not in SPLIT_DROPOUT_DTYPES \
            or x.device.type != "cpu" or x.numel() == 0 \
            or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        return NotImplemented
    from torch._prims_common import is_non_overlapping_and_dense_or_false as dense

    # eager's mask is empty_like(x), filled in memory order: x's own layout where x is
    # dense (a non-dense x, rare before a dropout, stays whole)
    if not dense(x):
        return NotImplemented
    mask = dropout_mask_op()(list(x.shape), list(x.stride()), float(p), x.dtype)
    keep = 1.0 - p
    scale = 0.0 if keep == 0 else 1.0 / keep
    out = aten.mul.Tensor(aten.mul.Tensor(x, aten._to_copy.default(mask, dtype=x.dtype)), scale)
    return out, mask


_DROPOUT = Decompositions(("aten.native_dropout.default",),
                          {torch.ops.aten.native_dropout.default: _native_dropout_split})


def split_dropout(gm: torch.fx.GraphModule) -> int:
    """Rewrite ``gm`` in place (config ``random: eager``): each ``native_dropout`` that
    ``_native_dropout_split`` takes becomes a ``dropout_mask`` node (the only random
    one, reading nothing) and the multiplications by the mask and the scale (compute
    any backend may take). Each mask node moves up to just after the previous random
    node (or the graph's inputs): random ops keep their relative order (eager's RNG
    stream; ``plan.partition`` chains them), and the partitioner can draw every mask
    in one eager partition before the compute instead of cutting it at every dropout.
    Returns how many were split; dropouts of symbolic shapes, float16/bfloat16, other
    devices or ``train=False`` stay as they are."""
    from ..ops import is_random

    target = torch.ops.aten.native_dropout.default
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]
    if not nodes:
        return 0
    split = 0
    for node in nodes:
        if not all(is_getitem(u) and isinstance(u.args[1], int) for u in node.users):
            log.debug("%s stays whole: read whole, not through getitem", node.name)
            continue
        try:
            sub = _DROPOUT.trace(node)
            inline(gm.graph, node, sub)
        except NotDecomposable as exc:
            log.debug("%s stays whole: %s", node.name, exc)
            continue
        split += 1
    if not split:
        return 0
    mask = dropout_mask_op()
    anchor = None
    for n in list(gm.graph.nodes):
        if n.op in ("placeholder", "get_attr"):
            anchor = n
        elif n.op == "call_function" and n.target is mask:
            if anchor is None:  # no input: to the top
                first = next(iter(gm.graph.nodes))
                if first is not n:
                    first.prepend(n)
            elif anchor.next is not n:
                anchor.append(n)
            anchor = n
        elif n.op == "call_function" and is_random(n):
            anchor = n
    gm.graph.lint()
    gm.recompile()
    log.debug("split %d of %d native_dropout into an eager mask and compute", split, len(nodes))
    return split

