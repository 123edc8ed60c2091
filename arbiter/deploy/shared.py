"""The program's weights, shared with the partitions' saved artifacts.

A saved program holds its weights once, in ``weights.safetensors``. A backend whose
artifact would carry a copy of some (an ONNX model's initializers) asks
``SharedWeights.find`` at save time whether the program holds a tensor with exactly
those bytes and stores its key instead; at load ``SharedWeights.get`` gives the tensor
back (the ``shared`` argument of ``Backend.save_artifact`` and ``load_artifact``).
Matching is by content (dtype, shape, a sha256 of the bytes), never by name. A matrix the
export transposed is found as a program weight's transpose (``"t:"`` before the key),
and one no artifact takes untransposed is stored transposed (format version 3), so no
copy is made at load either way. Any other change (folded, cast) is not found and stays
in the artifact. docs/deploy.md ("The file").
"""
from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from typing import Any, Optional

import torch

from ..errors import ArbiterError

#: a tensor smaller than this is kept in the artifact (not worth a reference)
MIN_BYTES = 4096
#: a reference to a program weight's transpose
TRANSPOSED = "t:"


def _raw(t: torch.Tensor) -> memoryview:
    """The tensor's bytes in row-major order, without a copy where it is contiguous."""
    return memoryview(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())


def _digest(t: torch.Tensor) -> tuple:
    return (t.dtype, tuple(t.shape), hashlib.sha256(_raw(t)).digest())


class SharedWeights:
    """The program's weights by key (``weights.safetensors``'s names), found by content
    (see the module)."""

    def __init__(self, weights: dict[str, torch.Tensor], where: str = "the program"):
        self.weights = weights
        self.where = where
        self._index: Optional[dict[tuple, str]] = None
        self.refs: set[str] = set()  # what ``find`` answered (transposes with their "t:")
        self._made: dict[str, torch.Tensor] = {}  # ``prefetch``'s transposes, until ``get``

    def find(self, t: torch.Tensor) -> Optional[str]:
        """The key of a program weight with ``t``'s dtype, shape and bytes, or None."""
        if t.numel() * t.element_size() < MIN_BYTES:
            return None
        if self._index is None:  # hashed once, on the first question
            self._index = {}
            for key, w in self.weights.items():
                if isinstance(w, torch.Tensor) and w.numel() * w.element_size() >= MIN_BYTES:
                    self._index.setdefault(_digest(w), key)
                    if w.dim() == 2:
                        self._index.setdefault(_digest(w.t()), TRANSPOSED + key)
        ref = self._index.get(_digest(t))
        if ref is not None:
            self.refs.add(ref)
        return ref

    @property
    def found(self) -> set[str]:
        """The keys of the weights some artifact refers to (a transpose's, its own)."""
        return {ref.removeprefix(TRANSPOSED) for ref in self.refs}

    def prefetch(self, refs: Any) -> None:
        """Make the transposes among ``refs`` (the saved program's list) ahead of ``get``:
        a load runs this in a thread while it reads the ATen program (a transpose of a
        matrix stored untransposed copies it: BERT-base's 76 were 340 MB in version 2
        files; one stored transposed is a view). Anything unknown is left to ``get``."""
        for ref in refs if isinstance(refs, list) else ():
            if isinstance(ref, str) and ref.startswith(TRANSPOSED) and ref not in self._made:
                w = self.weights.get(ref.removeprefix(TRANSPOSED))
                if isinstance(w, torch.Tensor) and w.dim() == 2:
                    self._made[ref] = w.t().contiguous()

    def get(self, ref: str) -> torch.Tensor:
        """The tensor ``find`` answered ``ref`` for (an ``ArbiterError`` naming it when the
        program holds no such weight)."""
        made = self._made.pop(ref, None) if isinstance(ref, str) else None
        if made is not None:  # given once: the artifact keeps (or copies) what it needs
            return made
        key = ref.removeprefix(TRANSPOSED) if isinstance(ref, str) else None
        t = self.weights.get(key) if key is not None else None
        if not isinstance(t, torch.Tensor) or (key != ref and t.dim() != 2):
            raise ArbiterError(f"{self.where}: a saved artifact refers to weight {ref!r}, "
                               "which the saved program does not hold")
        return t.t().contiguous() if key != ref else t


def with_shared(method: Callable, *args: Any, shared: SharedWeights) -> Any:
    """``method(*args, shared=shared)`` where the backend's method takes ``shared``; a
    backend written before it was added is called without it (its artifacts hold their
    own copies)."""
    try:
        takes = "shared" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        takes = False
    return method(*args, shared=shared) if takes else method(*args)
