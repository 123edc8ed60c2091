"""The graph passes every ATen graph gets before it is planned, in one list and order.

Each graph from AOTAutograd (compile) or ``torch.export`` (``arbiter.export``) goes
through ``apply`` once, in ``PASSES`` order:

1. ``hoist_size_arithmetic`` (run/lower.py): size arithmetic on symbolic inputs moved to
   the top, so no backend's run is cut around it. Only moves nodes.
2. ``drop_legacy_empty`` (run/legacy_cat.py): a cache's first ``cat(empty(0), key)``
   becomes one without the empty tensor, which ONNX and OpenVINO cannot concatenate.
3. ``write_caches_in_place`` (run/cache_writes.py), inference graphs: a static KV
   cache's functional write and its trailing ``copy_`` back become one in-place
   ``index_copy_`` into the user's buffer (large caches only).
4. ``fold_constants`` (run/fold.py), inference graphs: what reads no input (position
   ids, masks) computed once and made a constant.
5. ``split_dropout`` (decompose/dropout.py), config ``random: eager`` unless a rule
   names the dropout: eager draws dropout masks apart from the data.

Exported graphs (``arbiter.export``) get the passes that only move nodes (1). The others
rewrite nodes, while a saved program keeps the exported program untouched and its plan
names that program's nodes (arbiter/deploy/): a load reads the program again, and a plan
cut on a rewritten graph would not cover it. (An exported program is traced in eval mode,
so 5 finds nothing there anyway, and ``arbiter.export`` refuses a model that writes its
buffers, so 3 neither; 2 and 4 cost an exported decoder partitions, left so.)
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.fx

from ..decompose import split_dropout
from .cache_writes import write_caches_in_place
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
    Pass("write_caches_in_place", write_caches_in_place, inference_only=True),
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
