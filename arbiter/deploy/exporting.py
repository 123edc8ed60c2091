"""``arbiter.export``: a model exported by torch.export and compiled by arbiter at once.

torch.export, then the compile path's planning, building, checks and report
(``Arbiter.compile_exported``), compiled at once on the example inputs."""
from __future__ import annotations

from typing import Any, Optional

import torch

from ..arbiter import Arbiter
from ..config import ConfigLike
from ..errors import ArbiterError
from ..run.owner import Owner
from .program import Program, Source
from .signature import from_program
from .tracing import aten_graph, trace


def export(model: Any, args: tuple, kwargs: Optional[dict] = None,
           dynamic_shapes: Any = None, config: ConfigLike = None) -> Program:
    """``model`` exported with ``torch.export`` and compiled by arbiter for inference.

    ``args``/``kwargs``/``dynamic_shapes`` are ``torch.export.export``'s; ``config`` is an
    arbiter config (a path, a shipped config's name, a dict, a Config; None: the default).
    The partitions compile here, on ``args`` (the config's ``verify`` and a symbolic
    partition's second-shape check included). Returns a ``Program``: call it, read its
    ``report()``, ``save()`` it (docs/deploy.md)."""
    arb = Arbiter(config)
    if arb.dry_run:
        raise ArbiterError("arbiter.export compiles: a dry-run Arbiter cannot export")
    kwargs = dict(kwargs or {})
    ep = trace(model, args, kwargs, dynamic_shapes, list(arb.config.decompositions))
    graph = aten_graph(ep)
    signature = from_program(ep, graph.input_names, graph.input_values)
    outputs = next(n for n in graph.gm.graph.nodes if n.op == "output").args[0]
    if ep.call_spec.out_spec.num_leaves != len(outputs):
        raise ArbiterError(f"the model returns {ep.call_spec.out_spec.num_leaves} values, of "
                           f"which {len(outputs)} are tensors the program computes; "
                           "arbiter.export takes models whose outputs are all tensors")
    name = type(model).__name__ if isinstance(model, torch.nn.Module) else \
        getattr(model, "__qualname__", type(model).__name__)
    owner = Owner(name, ("export", id(graph.gm)))
    fn, record = arb.compile_exported(graph.gm, graph.constants, owner)

    def report() -> Any:
        return arb.report(owner, advice=False)

    from torch.utils._pytree import tree_flatten

    flat_in, _ = tree_flatten((args, kwargs))
    program = Program(fn, signature, graph.weights, report)
    # every partition compiles (and is checked, as the config says) now; its outputs are
    # what a load must reproduce (loading.py's check)
    flat_out, _ = tree_flatten(program(*args, **kwargs))
    program._source = Source(ep, arb, record,
                             ([t.detach().clone() for t in flat_in],
                              [t.detach().clone() for t in flat_out
                               if isinstance(t, torch.Tensor)]), name)
    return program
