"""A plan made callable: one lazily compiled ``Piece`` per partition that a backend
compiles (its chain from ``Planner.chain_for``, with per-shape views under symbolic
shapes, ``dynamic.shape_chain``), inline (eager) partitions run in place, all stitched
into one GraphModule (``split.stitch``).

Pieces are shared through a dict the caller keeps per graph, by (chain, nodes): a
partition that two candidate plans of a graph have in common compiles once (policy
`measure` times several plans of one graph).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Optional

from ..config import Config, VerifyOptions
from ..plan.partition import Plan
from ..plan.planner import Planner
from .dynamic import chain_labels, shape_chain
from .checks.first_use import FirstUse
from .piece import Piece, PieceRecord
from .split import extract, stitch

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
        for part in plan.partitions:
            chain = self._planner.chain_for(plan, part)
            if chain[0].inline_aten or self._dry_run:
                record = PieceRecord(part.id, part.backend, [b.name for b in chain])
                record.backend = part.backend if not self._dry_run else ""
                records[part.id] = record
                inline.add(part.id)
                continue
            names = tuple(n.name for n in part.nodes)
            key = (tuple(b.name for b in chain), names)
            if key not in pieces:
                sub = extract(plan, part, constants)
                # symbolic shapes: views of the chain's backends (run/dynamic.py)
                per_shape = {b for n in part.nodes for b in plan.support[n].per_shape}
                chain = shape_chain(chain, sub.gm, per_shape,
                                    config.shapes.max_specializations,
                                    config.verify.tolerances, label)
                record = PieceRecord(part.id, part.backend, chain_labels(chain))
                piece = Piece(record, sub.gm, chain, label, verify=config.verify,
                              compile_timeout_s=config.compile_timeout_s,
                              lowered_verify=self._lowered_verify,
                              first_use=self._first_use)
                piece.node_names = names  # measure/ keys per-partition timings by it
                self._track(piece)
                pieces[key] = (sub, piece)
            sub, piece = pieces[key]
            records[part.id] = piece.record
            runners[part.id] = (sub, piece)
        return stitch(plan, runners, inline), records
