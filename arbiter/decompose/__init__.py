"""Per-backend decompositions: a node is decomposed only for the backend that asked.

A manifest's ``decompositions:`` lists ops the backend runs through their decomposition
(``torch._decomp``, or arbiter's own where PyTorch has none), e.g. ONNX Runtime's
``native_layer_norm_backward``. Two backends' wishes never meet: in planning
(``arbiter.plan.capability``) a node of such an op is offered to that backend when every
node of its decomposition, traced on fake tensors of the node's own shapes, is one the
backend can run; in compiling (``run.compiling.compile_for``) the partition handed to
that backend has those nodes replaced (``for_backend``), while the chain's next
backends, eager and ``verify`` get it as planned. The config's ``decompositions:``
applies to the whole graph before partitioning (``arbiter.run.lower``). Traced
decompositions are cached, bounded, per op, arguments and shapes. docs/design.md
("Training: per-backend decompositions").
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
