"""Counted nouns and counted compute, below the report's model and all its renderings.

``plural`` ("1 node", "2 nodes") and ``tensor_op_count`` (size arithmetic left out): what
the model's own summary shares with the renderings (``cells``, ``text``, ``html``).
"""
from __future__ import annotations

from typing import Optional


def plural(n: int, noun: str, nouns: Optional[str] = None) -> str:
    """``1 node``, ``2 nodes``, ``0 nodes`` (``nouns``: an irregular plural)."""
    return f"{n} {noun}" if n == 1 else f"{n} {nouns or noun + 's'}"


#: Op name prefixes of size arithmetic on symbolic ints (``sym_size``, ``s0 * s1``): no
#: tensor compute (a report's "ran: ..." shares leave them out).
SIZE_ARITHMETIC = ("_operator.", "operator.", "aten.sym_", "torch.sym_", "math.")


def tensor_op_count(ops: dict[str, int]) -> int:
    """Nodes of ``ops`` (op name -> count) that compute tensors: size arithmetic left out."""
    return sum(n for op, n in ops.items() if not op.startswith(SIZE_ARITHMETIC))
