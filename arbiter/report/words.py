"""Counted nouns, counted compute and candidates' names: below the model and its renderings.

``plural`` ("1 node", "2 nodes"), ``tensor_op_count`` (size arithmetic left out) and
``named`` (a policy's candidate label in words): what the model's own summary shares with
the renderings (``cells``, ``choice``, ``text``, ``html``).
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


#: The candidate labels a policy gives (arbiter/plan/policy.py: PRIORITY, ONLY).
PLAN, ONLY = "priority", "only "


def named(label: str) -> str:
    """A candidate in words: ``priority`` the config-order plan, ``only X`` X alone."""
    if label == PLAN:
        return "the config-order plan"
    if label.startswith(f"{PLAN} with "):
        return f"the config-order plan with {label.removeprefix(PLAN + ' with ')}"
    if label.startswith(ONLY):
        return f"{label.removeprefix(ONLY)} alone"
    return label
