"""Graph surgery: a plan's partitions become standalone graphs, and one stitched graph
calls them.

Each non-inline partition becomes its own GraphModule taking the values that flow in
(constants baked in as attributes) and returning, as a tuple, the values used outside it.
The stitched graph keeps the original placeholders and output, runs inline (eager)
partitions' ATen nodes in place, and calls every other partition through one
``call_function`` node followed by ``getitem``s: FX generates straight-line Python for
it, so stitching costs one Python call per partition and nothing per eager node.
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from ..plan.partition import Partition, Plan


@dataclass
class Subgraph:
    """One partition cut out as a standalone ATen graph."""

    partition: Partition
    gm: torch.fx.GraphModule
    inputs: list[torch.fx.Node]   # nodes of the original graph feeding it, in order
    outputs: list[torch.fx.Node]  # nodes of the original graph it produces for others


def extract(plan: Plan, partition: Partition,
            constants: dict[torch.fx.Node, torch.Tensor]) -> Subgraph:
    """Cut ``partition`` out of ``plan.graph_module``.

    ``constants`` maps placeholders of the graph to real tensors to bake in (frozen
    weights); ``get_attr`` nodes are baked in as well.
    """
    src = plan.graph_module
    members = set(partition.nodes)
    root = torch.nn.Module()
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    inputs: list[torch.fx.Node] = []

    def bring(n: torch.fx.Node) -> torch.fx.Node:
        if n in env:
            return env[n]
        if n.op == "get_attr" or n in constants:
            value = constants[n] if n in constants else _fetch_attr(src, n.target)
            attr = f"_const_{len(root._buffers)}"
            root.register_buffer(attr, value, persistent=False)
            new = graph.get_attr(attr)
        else:
            new = graph.placeholder(n.name)
            inputs.append(n)
        new.meta = dict(n.meta)
        env[n] = new
        return new

    for node in partition.nodes:
        for inp in node.all_input_nodes:
            if inp not in members:
                bring(inp)
        env[node] = graph.node_copy(node, lambda n: env[n])

    outputs = []
    for node in partition.nodes:
        if any(u not in members for u in node.users):
            outputs.append(node)
    out = graph.output(tuple(env[n] for n in outputs))
    out.meta["val"] = tuple(n.meta.get("val") for n in outputs)
    gm = torch.fx.GraphModule(root, graph, class_name=f"Partition{partition.id}")
    return Subgraph(partition, gm, inputs, outputs)


def _fetch_attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def stitch(plan: Plan, runners: dict[int, tuple[Subgraph, Callable]],
           inline: set[int]) -> torch.fx.GraphModule:
    """One GraphModule that runs the partitions in plan order.

    ``runners[pid] = (subgraph, callable)`` for partitions run by a backend; partitions
    in ``inline`` keep their ATen nodes in place.
    """
    src = plan.graph_module
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    root = torch.nn.Module()
    for node in src.graph.nodes:
        if node.op == "placeholder":
            env[node] = graph.node_copy(node)
        elif node.op == "get_attr":
            value = _fetch_attr(src, node.target)
            name = node.target.replace(".", "_")
            if isinstance(value, torch.Tensor):
                root.register_buffer(name, value, persistent=False)
            else:
                setattr(root, name, value)
            env[node] = graph.get_attr(name)
            env[node].meta = dict(node.meta)
    for part in plan.partitions:
        if part.id in inline:
            for node in part.nodes:
                env[node] = graph.node_copy(node, lambda n: env[n])
            continue
        sub, fn = runners[part.id]
        call = graph.call_function(fn, tuple(env[n] for n in sub.inputs))
        call.name = f"partition_{part.id}_{part.backend}"
        for k, node in enumerate(sub.outputs):
            got = graph.call_function(operator.getitem, (call, k))
            got.meta = dict(node.meta)
            env[node] = got
    for node in src.graph.nodes:
        if node.op == "output":
            graph.node_copy(node, lambda n: env[n])
    graph.lint()
    return torch.fx.GraphModule(root, graph, class_name="Stitched")
