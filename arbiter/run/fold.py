"""What an inference graph computes from no input at all, computed once when it compiles.

Nodes that read no placeholder (no input, no weight), such as GPT-2's causal mask and
position ids or T5's relative-position buckets, give the same values on every call, but
are integer and boolean arithmetic a backend may refuse (OpenVINO holds int64 in 32
bits), and the graph was cut around them. ``fold_constants`` computes them once with
real tensors and the values the rest of the graph reads become constants (``get_attr``,
as a frozen weight), so the partitioner never sees them. Not folded: random ops,
``empty*``, mutating ops, ops with several outputs, a value the graph returns or a view
reads (the caller gets a tensor of its own every call), anything past ``MAX_BYTES`` in
all, what depends on a symbolic size. Inference graphs only. docs/design.md ("Folded
set-up").
"""
from __future__ import annotations

import logging
import operator

import torch
import torch.fx

from ..ops import attr_value, real_tensors

log = logging.getLogger(__name__)

#: Folded constants of one graph take at most this much memory.
MAX_BYTES = 16 * 2 ** 20
PREFIX = "_arbiter_folded_"


def fold_constants(gm: torch.fx.GraphModule) -> int:
    """Fold ``gm``'s input-independent nodes (see the module) in place; the number of
    nodes folded (0: ``gm`` untouched)."""
    free = _independent(gm)
    _keep_outputs_fresh(free)
    frontier = [n for n in gm.graph.nodes if n in free
                and any(u not in free for u in n.users)]
    if not frontier:
        return 0
    try:
        values = _evaluate(gm, free)
    except Exception as exc:  # noqa: BLE001 - never fail the user's compile for it
        log.warning("folding the graph's input-independent nodes failed (%s: %s); they "
                    "stay in the graph", type(exc).__name__, exc)
        return 0
    k = 0
    for n in frontier:
        while hasattr(gm, f"{PREFIX}{k}"):  # a get_attr's target is an attribute too
            k += 1
        name = f"{PREFIX}{k}"
        gm.register_buffer(name, values[n])
        with gm.graph.inserting_before(n):
            const = gm.graph.get_attr(name)
        # the value's description only: a constant computes nothing in any module (the
        # report's module rows follow the nodes that do)
        const.meta = {key: n.meta[key] for key in ("val", "tensor_meta") if key in n.meta}
        n.replace_all_uses_with(const, delete_user_cb=lambda u: u not in free)
    folded = 0
    for n in reversed(list(gm.graph.nodes)):
        if n in free and not n.users:
            gm.graph.erase_node(n)
            folded += 1
    gm.graph.lint()
    gm.recompile()
    log.info("folded %d input-independent node(s) into %d constant(s)", folded,
             len(frontier))
    return folded


def _foldable(n: torch.fx.Node) -> bool:
    op = n.target
    if n.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
        return False
    schema = op._schema
    if torch.Tag.nondeterministic_seeded in op.tags or schema.is_mutable \
            or "empty" in schema.name or len(schema.returns) != 1:
        return False
    val = n.meta.get("val")
    return isinstance(val, torch.Tensor) and not _symbolic(val)


def _symbolic(t: torch.Tensor) -> bool:
    return any(isinstance(s, torch.SymInt) for s in t.shape)


def _independent(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """Nodes computed from constants alone, within MAX_BYTES."""
    free: set[torch.fx.Node] = set()
    consts = {n for n in gm.graph.nodes if n.op == "get_attr"}
    total = 0
    for n in gm.graph.nodes:
        if not _foldable(n) or not all(a in free or a in consts for a in n.all_input_nodes):
            continue
        val = n.meta["val"]
        size = val.numel() * val.element_size()
        if total + size > MAX_BYTES:
            continue
        free.add(n)
        total += size
    return free


def _keep_outputs_fresh(free: set[torch.fx.Node]) -> None:
    """Unfold what the output or a view (or a non-ATen op such as ``getitem``) reads,
    and then what reads an unfolded node, until nothing folded is read so (the caller
    must never hold a folded constant) and every folded node's inputs are folded or
    constants (a view unfolded under a folded node left it unable to compute: Llama's
    rotary set-up at a batch-2 recompile, "KeyError: unsqueeze", nothing folded)."""
    changed = True
    while changed:
        changed = False
        for n in list(free):
            if any(a.op != "get_attr" and a not in free for a in n.all_input_nodes):
                free.discard(n)
                changed = True
                continue
            for u in n.users:
                if u in free:
                    continue
                if u.op != "call_function" or u.target is operator.getitem \
                        or not isinstance(u.target, torch._ops.OpOverload) \
                        or u.target.is_view:  # aten.alias included
                    free.discard(n)
                    changed = True
                    break


def _evaluate(gm: torch.fx.GraphModule, free: set[torch.fx.Node]) -> dict:
    """The folded nodes' values, real tensors, outside the compile's fake mode."""
    env: dict = {}

    def value(a):
        if isinstance(a, torch.fx.Node):
            if a.op == "get_attr":
                return attr_value(gm, a.target)
            return env[a]
        return a

    with real_tensors(), torch.no_grad():
        for n in gm.graph.nodes:
            if n in free:
                args = torch.fx.node.map_aggregate(n.args, value)
                kwargs = torch.fx.node.map_aggregate(n.kwargs, value)
                env[n] = n.target(*args, **kwargs)
    return env
