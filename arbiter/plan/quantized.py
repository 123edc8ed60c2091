"""A quantized graph's units: a dequantize never leaves the op it feeds.

A model quantized with PyTorch's PT2E flow computes in float between
``dequantize_per_tensor``/``_per_channel`` nodes (integer codes in, floats out) and
``quantize_per_tensor`` nodes; a backend runs the layer in int8 only when it sees the
dequantize with the convolution or matmul it feeds (ONNX Runtime fuses
DequantizeLinear -> Conv -> QuantizeLinear into QLinearConv; OpenVINO's frontend makes a
quantize and its dequantize one FakeQuantize). A boundary between them would hand one
partition the dequantized floats: the int8 layer becomes a float one, and a backend
that needs the pair (OpenVINO) cannot take the half it gets. So each dequantize, the
quantize it reads, the ops that only move its values (``ops.DATA_MOVES``: a weight's
transpose) and the ops that compute with them are one unit: the partitioner gives them
one candidate list (what every member can run, in the order of the first compute op's
list), and they go to one backend, eager included.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch.fx

from ..ops import (DATA_MOVES, is_dequantize, is_getitem, is_quantization, is_quantize,
                   op_name, packet_name)


def _find(parent: list[int], i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def dequantize_units(nodes: Sequence[torch.fx.Node], index: dict) -> list[list[int]]:
    """The units of ``nodes`` (partitionable nodes, ``index`` node -> position): each a
    sorted list of positions, a dequantize with the quantize it reads and the nodes it
    feeds (through data moves); only units of two nodes or more, in graph order."""
    if not any(is_dequantize(n) for n in nodes):
        return []
    parent = list(range(len(nodes)))

    def union(a: int, b: int) -> None:
        ra, rb = _find(parent, a), _find(parent, b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    for i, n in enumerate(nodes):
        if not is_dequantize(n):
            continue
        codes = n.args[0] if n.args else None
        j = index.get(codes)
        if j is not None and is_quantize(codes):
            union(i, j)
        todo = [n]
        while todo:  # the readers of its values, through ops that only move them
            for user in todo.pop().users:
                k = index.get(user)
                if k is None or is_getitem(user):  # a getitem follows its producer
                    continue
                union(i, k)
                if packet_name(op_name(user.target)) in DATA_MOVES:
                    todo.append(user)
    units: dict[int, list[int]] = {}
    for i in range(len(nodes)):
        units.setdefault(_find(parent, i), []).append(i)
    return [members for members in units.values() if len(members) > 1]


def shared_candidates(members: Sequence[int], allowed: Sequence[Optional[list]],
                      nodes: Sequence[torch.fx.Node]) -> Optional[list]:
    """One candidate list for a unit: the backends every member may run, in the order of
    its first compute node's list (not a quantize or dequantize, not a data move); None
    when a member has no list of its own."""
    lists = [allowed[i] for i in members]
    if any(a is None for a in lists):
        return None
    lead = next((i for i in members if not is_quantization(nodes[i])
                 and packet_name(op_name(nodes[i].target)) not in DATA_MOVES), members[0])
    common = set(lists[0]).intersection(*lists[1:])
    return [b for b in allowed[lead] if b in common]


def in_eager(plan, inline: set[str]) -> tuple[int, int]:
    """(the quantize/dequantize nodes ``plan`` (a ``partition.Plan``) runs in a backend of
    ``inline`` (eager ATen), all of them): the int8 layers it leaves as float compute."""
    left = total = 0
    for p in plan.partitions:
        for n in p.nodes:
            if is_quantization(n):
                total += 1
                left += p.backend in inline
    return left, total


def int8_rivals(best, rest: Sequence, inline: set[str]) -> list:
    """Of ``rest`` (policy candidates: ``.plan``, ``.estimate_ms``), those to time beside
    ``best`` in a quantized graph: each that runs some of its quantize/dequantize nodes on
    a backend and leaves no more of them in eager than ``best`` does (fewest left first,
    then by estimate). The calibration has no int8 cells: its prediction for a quantized
    unit is its float ops' time, which ranks neither an int8 kernel nor a float
    dequantize each call. A PT2E CNN went to "openvino alone", which takes none of its
    units (all of it ran in eager, twice ONNX Runtime's time), and then to ONNX Runtime,
    whose last convolution stays float, at 3x Inductor's int8 kernels."""
    left, total = in_eager(best.plan, inline)
    if not total:
        return []
    scored = []
    for i, c in enumerate(rest):
        c_left, _ = in_eager(c.plan, inline)
        if c_left < total and c_left <= left:
            scored.append((c_left, c.estimate_ms, i))
    return [rest[i] for *_, i in sorted(scored)]
