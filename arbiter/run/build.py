"""A plan made callable: a lazily compiled piece per partition, stitched into one graph.

One ``Piece`` per partition that a backend compiles (its chain's links from
``Planner.chain_for`` in the modes its shapes call for, ``dynamic.shape_links``, made
runnable by ``assemble``), inline (eager) partitions run in place, all stitched into one
GraphModule (``split.stitch``). ``instantiate``, ``entry_of`` and ``new_piece`` serve the
loader too (arbiter/deploy/).

Pieces are shared through a dict the caller keeps per graph, by (chain, nodes): a
partition that two candidate plans of a graph have in common compiles once (policy
`measure` times several plans of one graph).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch

from ..config import Config, VerifyOptions
from ..backend import Backend
from ..plan.partition import Plan
from ..plan.planner import Planner
from ..registry import get_backend_class
from .chain import Entry, Link, Mode, link_of
from .dynamic import PerShape, Symbolic, shape_links
from .checks.first_use import FirstUse
from .piece import Piece, PieceRecord
from .split import extract, stitch


def instantiate(config: Config, name: str) -> Backend:
    """The backend ``name`` with the config's options for it and, where the config names
    one, its user manifest (``arbiter probe --out``): what compiling and loading run."""
    cls = get_backend_class(name)
    backend = cls(cls.Options.model_validate(config.options_for(name)))
    if name in config.manifests:
        backend.use_manifest(config.manifests[name])
    return backend


def entry_of(link: Link, backend: Backend, *, limit: int, tolerances: Any = None,
             graph_label: str = "") -> Entry:
    """The runnable entry of ``link`` around ``backend`` (the backend it names):
    ``limit``: shapes.max_specializations (per shape), ``tolerances``: the second-shape
    check's (symbolic)."""
    if link.mode is Mode.SYMBOLIC:
        return Symbolic(backend, tolerances)
    if link.mode is Mode.PER_SHAPE:
        return PerShape(backend, limit, graph_label)
    if link.mode is Mode.STATIC:
        return Entry(backend)
    raise ValueError(f"{link.label}: a {link.mode.value} entry is made by its loader")


def assemble(links: Sequence[Link], backends: dict[str, Backend], *, limit: int,
             tolerances: Any = None, graph_label: str = "") -> list[Entry]:
    """The runnable chain of ``links``; ``backends``: name -> backend (variants by their
    own names)."""
    return [entry_of(k, backends[k.name], limit=limit, tolerances=tolerances,
                     graph_label=graph_label) for k in links]


def new_piece(part_id: int, planned: str, gm: torch.fx.GraphModule, chain: Sequence[Entry],
              graph_label: str, config: Config, verify: Optional[VerifyOptions] = None,
              **extra: Any) -> Piece:
    """The piece running ``gm`` down ``chain``, with its record; ``verify``: its checks
    (None: the config's); ``extra``: Piece's other options."""
    record = PieceRecord.of_links(part_id, planned, [e.link for e in chain])
    return Piece(record, gm, chain, graph_label, verify=verify or config.verify,
                 compile_timeout_s=config.compile_timeout_s, **extra)


#: Pieces of one graph's plans: (chain's backend names, node names) -> (its
#: ``split.extract`` result, the piece).
Pieces = dict


class Builder:
    """Builds the plans of one Arbiter (its planner and config)."""

    def __init__(self, planner: Planner, config: Config, *, dry_run: bool,
                 lowered_verify: Optional[VerifyOptions], first_use: FirstUse,
                 track: Callable[[Piece], None]):
        """``lowered_verify``: the checks of a lower-precision variant while it runs
        (config `accuracy`); ``track``: called with every new piece (``set_timing``).
        A dry run makes no pieces: every partition runs inline, in eager."""
        self._planner = planner
        self._config = config
        self._dry_run = dry_run
        self._lowered_verify = lowered_verify
        self._first_use = first_use
        self._track = track

    def build(self, plan: Plan, constants: dict, label: str,
              pieces: Pieces) -> tuple[Callable, dict[int, PieceRecord]]:
        """The stitched module of ``plan`` (``constants``: the frozen weights baked into
        its partitions) and its partitions' records, reusing pieces from ``pieces``
        (updated)."""
        config = self._config
        records: dict[int, PieceRecord] = {}
        runners = {}
        inline = set()
        every = {**self._planner.backends, **self._planner.variants}
        for part in plan.partitions:
            chain = self._planner.chain_for(plan, part)
            if chain[0].inline_aten or self._dry_run:
                record = PieceRecord.of_links(part.id, part.backend,
                                              [link_of(b) for b in chain])
                record.backend = part.backend if not self._dry_run else ""
                records[part.id] = record
                inline.add(part.id)
                continue
            names = tuple(n.name for n in part.nodes)
            key = (tuple(b.name for b in chain), names)
            if key not in pieces:
                sub = extract(plan, part, constants)
                # symbolic shapes: the modes the chain's backends take them in (dynamic.py)
                per_shape = {b for n in part.nodes for b in plan.support[n].per_shape}
                links = shape_links(chain, sub.gm, per_shape, config.shapes.max_specializations)
                entries = assemble(links, every, limit=config.shapes.max_specializations,
                                   tolerances=config.verify.tolerances, graph_label=label)
                piece = new_piece(part.id, part.backend, sub.gm, entries, label, config,
                                  lowered_verify=self._lowered_verify,
                                  first_use=self._first_use)
                piece.node_names = names  # measure/ keys per-partition timings by it
                self._track(piece)
                pieces[key] = (sub, piece)
            sub, piece = pieces[key]
            records[part.id] = piece.record
            runners[part.id] = (sub, piece)
        return stitch(plan, runners, inline), records
