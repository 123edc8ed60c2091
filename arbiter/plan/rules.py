"""The config's op rules (``pin``, ``exclude_ops``) against lowered graphs.

A rule names an op as written in the config: ``aten.x.overload`` or ``aten.x`` (every
overload). A rule may name an op that never reaches the partitioner: ``aten.softmax.int``
is lowered to ``aten._softmax.default``, and an op in ``decompositions:`` is gone before
partitioning. Such a rule does nothing; ``unmatched_message`` says so, naming the ops
that do occur (closest first).
"""
from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable

import torch.fx

from ..ops import is_getitem, op_name, packet_name

#: ops listed in a message before "and N more"
MAX_LISTED = 40


def names(rule_op: str, op: str) -> bool:
    """Whether the rule's op (``aten.x`` or ``aten.x.overload``) names ``op``."""
    return rule_op == op or rule_op == packet_name(op)


def graph_ops(gm: torch.fx.GraphModule) -> set[str]:
    """The op names of a graph's compute nodes (``aten.x.overload``)."""
    return {op_name(n.target) for n in gm.graph.nodes
            if n.op == "call_function" and not is_getitem(n)}


def pending_backward_ops() -> set[str] | None:
    """The ops of the backward graph of the forward graph being compiled now (called from
    inside its compile), or None where it is not found (another torch).

    AOTAutograd splits its joint graph into forward and backward before it compiles the
    forward, and compiles the backward only at the first backward call, which may never
    come (a forward with gradients on and no backward): a rule can be judged at the
    forward without waiting. The backward graph is a local (``bw_module``) of
    AOTAutograd's frame below the forward's compile."""
    frame = sys._getframe(1)
    while frame is not None:
        graph = frame.f_locals.get("bw_module") if "aot" in frame.f_code.co_filename else None
        if isinstance(graph, torch.fx.GraphModule):
            return graph_ops(graph)
        frame = frame.f_back
    return None


def unmatched_message(kind: str, rule_op: str, backend: str, seen: Iterable[str],
                      decomposed: Iterable[str] = (), where: str = "") -> str:
    """Why a rule applies to no node: the op is decomposed, or another op occurs."""
    seen = sorted(set(seen))
    rule = f"pin {rule_op} -> {backend}" if kind == "pin" else f"exclude_ops {rule_op}"
    head = f"{rule} applies to no node{where}"
    gone = [d for d in decomposed if names(rule_op, d) or names(d, rule_op)]
    if gone:
        return (f"{head}: {rule_op} is decomposed before partitioning (config "
                f"`decompositions:` or a backend manifest's), so its nodes are other ops")
    packets = sorted({packet_name(o) for o in seen})
    base = rule_op.split(".")[1] if rule_op.count(".") else rule_op
    bases = {p.split(".", 1)[-1]: p for p in packets}  # without the namespace
    close = [bases[b] for b in difflib.get_close_matches(base, list(bases), n=3, cutoff=0.6)]
    close += [p for b, p in bases.items() if base.strip("_") in b and p not in close][:3]
    listed = ", ".join(packets[:MAX_LISTED]) + (
        f" and {len(packets) - MAX_LISTED} more" if len(packets) > MAX_LISTED else "")
    hint = f"; did you mean {' or '.join(close)}?" if close else "."
    return f"{head}: no {rule_op} node after lowering{hint} Ops there: {listed or 'none'}"
