"""The decompositions of a list of op names: PyTorch's table, and arbiter's own.

Where both name the same op, arbiter's own (``own.extra``) win: PyTorch's may produce
prims.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from .own import extra


def resolve_op(name: str) -> Any:
    """``aten.x.overload`` -> the OpOverload; ``aten.x`` -> the OpOverloadPacket."""
    ns, base, *rest = name.split(".")
    packet = getattr(getattr(torch.ops, ns), base)
    return getattr(packet, rest[0]) if rest else packet


def table(names: Iterable[str]) -> dict:
    """PyTorch's decompositions of the ops named (``aten.x`` means every overload), and
    arbiter's own (``extra()``) for ops PyTorch's table lacks."""
    from torch._decomp import get_decompositions

    ops = [resolve_op(n) for n in names]
    out = get_decompositions(ops)
    for op, fn in extra().items():  # arbiter's own win: PyTorch's may produce prims
        if op in ops or op.overloadpacket in ops:
            out[op] = fn
    return out
