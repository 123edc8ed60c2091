"""Per-backend decompositions: a node is decomposed only for the backend that asked.

A manifest's ``decompositions:`` lists ops the backend runs through PyTorch's own
decomposition (``torch._decomp``), e.g. ONNX Runtime's ``native_layer_norm_backward``,
which its exporter has no translation for. Two backends' wishes never meet:

* planning (``arbiter.plan.capability``): a node of such an op is offered to that backend when
  every node of its decomposition, traced on fake tensors of the node's own shapes
  (``trace``; no tensor is computed), is a node that backend can run. Other backends are
  asked about the node as it is;
* compiling (``arbiter.run.piece``): the partition handed to that backend has those
  nodes replaced by their decompositions (``for_backend``); the next backends of the
  partition's chain, eager ATen and ``verify`` get the partition as planned.

The config's ``decompositions:`` still applies to the whole graph, before partitioning
(``arbiter.run.lower``): that is the user's choice for every backend.

A traced decomposition is kept per op, argument values and tensor shapes/strides (a
transformer's layers share one), in a bounded process-wide cache.

Rooms: ``own`` (arbiter's own decompositions, where PyTorch's table has none),
``tables`` (the table of a list of op names), ``tracing`` (a node's decomposition traced
on fake tensors and inlined), ``per_backend`` (one backend's ``decompositions:``, the
shared cache, ``for_backend``), ``dropout`` (config ``random: eager``: the mask drawn
apart from the data).
"""
from __future__ import annotations

from .dropout import SPLIT_DROPOUT_DTYPES, dropout_mask_op, split_dropout
from .own import extra
from .per_backend import (CACHE_SIZE, Decompositions, for_backend, for_names, for_symbolic,
                          wants)
from .tables import resolve_op, table
from .tracing import KEEPS_OP, SYMBOLIC_KEEPS, NotDecomposable

__all__ = ["CACHE_SIZE", "KEEPS_OP", "SPLIT_DROPOUT_DTYPES", "SYMBOLIC_KEEPS", "Decompositions",
           "NotDecomposable", "dropout_mask_op", "extra", "for_backend", "for_names", "for_symbolic",
           "resolve_op", "split_dropout", "table", "wants"]
