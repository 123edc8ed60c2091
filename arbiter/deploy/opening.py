"""A saved program's ATen side read back: weights, ATen program, plan and subgraphs.

Its weights (views of one buffer; a matrix stored transposed given back as the
transposed view the program takes), the weights its artifacts share (shared.py), the
ATen program (safe_program.py) and the plan rebuilt on it from the saved node names,
each compiled partition's subgraph cut out."""
from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ArbiterError
from ..plan.partition import Partition, Plan
from ..run import passes
from ..run.split import Subgraph, extract
from .archive import Archive
from .format import SavedManifest
from .safe_program import from_bytes
from .shared import SharedWeights
from .tensor_file import tensors
from .tracing import AtenGraph, aten_graph


@dataclass
class Opened:
    graph: AtenGraph
    plan: Plan
    subs: dict[int, Subgraph]  # compiled partitions' subgraphs, by partition id
    shared: SharedWeights


def open_program(archive: Archive, saved: SavedManifest,
                 in_background: Callable[[Callable[[], Any]], Any]) -> Opened:
    """The program of ``archive`` (``saved``: its manifest); ``in_background(fn)`` runs
    ``fn`` meanwhile (a future): the transposed weights the artifacts take are made then."""
    path = archive.path
    weights = _untransposed(tensors(archive.read_buffer("weights.safetensors"),
                                    f"{path}: weights.safetensors"),
                            saved.stored_transposed, path)
    shared = SharedWeights(weights, path)
    made = in_background(lambda: shared.prefetch(saved.shared_weights))
    ep = from_bytes(archive.read("program.json"), weights, f"{path}: program.json")
    graph = aten_graph(ep)
    passes.apply(graph.gm, "inference", exported=True)  # as arbiter.export's graph got them
    parts = saved.plan.partitions
    by_name = _match_nodes(graph.gm, parts, path)
    partitions = []
    for p in parts:
        try:
            nodes = [by_name[n] for n in p.nodes]
        except KeyError as exc:
            raise ArbiterError(f"{path}: partition {p.id} names node {exc}, which the saved "
                               "program does not have") from None
        partitions.append(Partition(p.id, p.ran or p.planned, nodes))
    plan = Plan(graph.gm, partitions, support={})
    subs = {p.id: extract(plan, part, graph.constants)
            for p, part in zip(parts, partitions) if not p.inline}
    made.result()
    return Opened(graph, plan, subs, shared)


def _untransposed(weights: dict[str, torch.Tensor], keys: list[str], path: str
                  ) -> dict[str, torch.Tensor]:
    """``weights`` with each matrix ``keys`` names (stored transposed: saving.py) as a
    transposed view of what was stored: the ATen program's layout, no copy."""
    if len(set(keys)) != len(keys):
        raise ArbiterError(f"{path}: manifest.json's stored_transposed is not a list of "
                           "distinct names")
    for k in keys:
        w = weights.get(k)
        if w is None or w.dim() != 2:
            raise ArbiterError(f"{path}: manifest.json's stored_transposed names {k!r}, "
                               "which is not a matrix of weights.safetensors")
        weights[k] = w.t()
    return weights


def _match_nodes(gm: torch.fx.GraphModule, parts: list, path: str) -> dict:
    """Node name -> node of the loaded graph. torch's deserializer makes a ``getitem`` for
    every output of a multi-output op, used or not; those no saved partition holds are
    removed (else they would become partition outputs). Any other node missing from the
    plan means the plan is not this program's."""
    saved = {n for p in parts for n in p.nodes}
    erased = False
    for n in reversed(list(gm.graph.nodes)):
        if n.op == "call_function" and n.name not in saved and not n.users and \
                n.target is operator.getitem:
            gm.graph.erase_node(n)
            erased = True
    stray = [n.name for n in gm.graph.nodes if n.op == "call_function" and n.name not in saved]
    if stray:
        raise ArbiterError(f"{path}: the saved plan does not cover nodes "
                           f"{', '.join(stray[:5])} of the saved program")
    if erased:
        gm.recompile()
    return {n.name: n for n in gm.graph.nodes}
