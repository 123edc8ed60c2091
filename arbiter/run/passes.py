"""The graph passes every ATen graph gets before it is planned, in one list and order.

Each graph from AOTAutograd (compile) or ``torch.export`` (``arbiter.export``) goes
through ``apply`` once, in ``PASSES`` order:

1. ``hoist_size_arithmetic`` (run/lower.py): size arithmetic on symbolic inputs moved to
   the top, so no backend's run is cut around it. Only moves nodes.
2. ``drop_legacy_empty`` (run/legacy_cat.py): a cache's first ``cat(empty(0), key)``
   becomes one without the empty tensor, which ONNX and OpenVINO cannot concatenate.
3. ``fold_constants`` (run/fold.py), inference graphs: what reads no input (position
   ids, masks) computed once and made a constant.
4. ``split_dropout`` (decompose/dropout.py), config ``random: eager`` unless a rule
   names the dropout: eager draws dropout masks apart from the data.

Exported graphs (``arbiter.export``) get the passes that only move nodes (1). The others
rewrite nodes, while a saved program keeps the exported program untouched and its plan
names that program's nodes (arbiter/deploy/): a load reads the program again, and a plan
cut on a rewritten graph would not cover it. (An exported program is traced in eval mode,
so 4 finds nothing there anyway; 2 and 3 cost an exported decoder partitions, left so.)
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.fx

from ..decompose import split_dropout
from .fold import fold_constants
from .legacy_cat import drop_legacy_empty
from .lower import hoist_size_arithmetic


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[torch.fx.GraphModule], object]
    inference_only: bool = False
    rewrites: bool = True  # replaces nodes (exported graphs skip it: see the module)
    optional: bool = False  # runs only when the caller asks for it by name


PASSES = (
    Pass("hoist_size_arithmetic", hoist_size_arithmetic, rewrites=False),
    Pass("drop_legacy_empty", drop_legacy_empty),
    Pass("fold_constants", fold_constants, inference_only=True),
    Pass("split_dropout", split_dropout, optional=True),
)


def apply(gm: torch.fx.GraphModule, kind: str, *, exported: bool = False,
          wanted: tuple[str, ...] = ()) -> list[str]:
    """Run ``PASSES`` on ``gm`` (a graph of ``kind``: inference, forward, backward) in
    place, as the module says; ``wanted``: the optional passes to run. Returns the names
    of those run."""
    ran = []
    for p in PASSES:
        if (p.optional and p.name not in wanted) or (p.inference_only and kind != "inference") \
                or (exported and p.rewrites):
            continue
        p.run(gm)
        ran.append(p.name)
    return ran
