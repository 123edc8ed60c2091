"""Frozen weights, guarded: a compiled inference graph never answers with stale weights.

With ``freeze_weights`` an inference graph hands its parameters and buffers to the
backends as constants, which they fold and prepack. But Dynamo reuses one compiled graph
for every module instance of a class, and weights change after the first call
(``load_state_dict``, an optimizer step, BatchNorm statistics). ``FrozenGraph`` checks,
on every call, the frozen arguments the stitched module still receives
(``WeightGuard``: each one's data pointer and version counter against the frozen
tensor's, which is kept alive; buffers up to ``VALUE_CHECK_BYTES`` also byte for byte,
in one bytes comparison). On a change it re-freezes (rebuilds the pieces around the new
weights), at most ``refreeze_limit`` times, then takes the weights as inputs for good;
each event is logged and kept for the report (``WeightEvent``). Not seen: a write
through ``p.data`` to a parameter or a large buffer. docs/design.md ("Frozen weights").
"""
from __future__ import annotations

import logging
import operator
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.fx

log = logging.getLogger(__name__)

_data_ptr = torch.Tensor.data_ptr
_version = operator.attrgetter("_version")


@dataclass
class WeightEvent:
    """One change of a graph's frozen weights, and what was done about it."""

    reason: str  # which argument changed, and how
    action: str  # "re-frozen" or "weights as inputs"


#: Buffers up to this size are also compared by value on every call (see the module).
VALUE_CHECK_BYTES = 64 * 1024


class WeightGuard:
    """Whether the arguments at ``positions`` are still the tensors frozen (see module).

    ``inputs``: (name, kind) of each, kind ``parameter``, ``buffer`` or ``input``
    (``lowering.input_names``). Buffers of at most ``VALUE_CHECK_BYTES`` are compared by
    value as well: BatchNorm's eager kernel updates its running statistics in place
    without bumping their version counter (its schema does not mark them as written)."""

    def __init__(self, positions: Sequence[int], tensors: Sequence[torch.Tensor],
                 inputs: Sequence[tuple[str, str]]):
        self.positions = list(positions)
        self.names = [name for name, _ in inputs]
        # keep the frozen tensors alive: their memory cannot then be reused by another
        # tensor, so an equal data pointer means the same memory
        self._tensors = list(tensors)
        self._ptrs = list(map(_data_ptr, tensors))
        self._versions = list(map(_version, tensors))
        self._pick = operator.itemgetter(*self.positions)
        small = [k for k, ((_, kind), t) in enumerate(zip(inputs, tensors))
                 if kind == "buffer" and t.numel() * t.element_size() <= VALUE_CHECK_BYTES]
        self._valued = [self.positions[k] for k in small]
        self._snapshots = [tensors[k].clone() for k in small]
        # The contiguous ones on the CPU are compared in one go: a call reaches the value
        # check only when every argument has its frozen tensor's data pointer (and
        # Dynamo's guards its shape, strides and dtype), so its bytes are the frozen
        # tensor's memory, read here through byte views made once. Not torch's copy and
        # comparison: for ResNet-50's 300 KB they wake its OpenMP pool (3 ms per call
        # against ONNX Runtime's spinning threads). Not numpy's either (concatenate,
        # array_equal), which cost 12 us for the PT2E CNN's 9 small buffers in a tight
        # loop but 92-112 us inside a real call, right after the model's kernels left
        # the caches cold: its Python-level checks and ufunc dispatch. Python's own
        # ``b"".join`` of the views and one bytes comparison (memcmp) take 1.2 us / 13-14
        # us there (bench/README.md, "freeze_guard.py"). Bytes, not values: a NaN equals
        # itself (by value, a buffer holding NaN was re-frozen at every call).
        byte_views = [_bytes_of(tensors[k]) for k in small]
        self._byte_views = [memoryview(v) for v in byte_views if v is not None]
        self._byte_snapshot = b"".join(self._byte_views) if self._byte_views else None
        self._one_by_one = [(i, snap) for i, snap, v in
                            zip(self._valued, self._snapshots, byte_views) if v is None]

    def _args(self, args: Sequence[Any]) -> list:
        got = self._pick(args)
        return [got] if len(self.positions) == 1 else list(got)

    def matches(self, args: Sequence[Any]) -> bool:
        ts = self._args(args)
        try:
            if list(map(_data_ptr, ts)) != self._ptrs or \
                    list(map(_version, ts)) != self._versions:
                return False
        except (TypeError, AttributeError):  # not a tensor where a weight was
            return False
        if self._byte_snapshot is not None and \
                b"".join(self._byte_views) != self._byte_snapshot:
            return False
        for i, snap in self._one_by_one:
            if not torch.equal(args[i], snap):
                return False
        return True

    def why(self, args: Sequence[Any]) -> str:
        """What changed, for the log and the report (called only after a mismatch)."""
        found = []
        valued = dict(zip(self._valued, self._snapshots))
        for i, name, t, ptr, version in zip(self.positions, self.names, self._args(args),
                                            self._ptrs, self._versions):
            if not isinstance(t, torch.Tensor):
                found.append(f"{name}: a {type(t).__name__} where a tensor was frozen")
            elif t.data_ptr() != ptr:
                found.append(f"{name}: another tensor (new data pointer)")
            elif t._version != version:
                found.append(f"{name}: changed in place (version {version} -> {t._version})")
            elif i in valued and not _same_values(t, valued[i]):
                found.append(f"{name}: changed in place (new values, same version)")
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        return (f"{len(found)} of {len(self.names)} frozen weight(s) changed: "
                f"{'; '.join(found[:3])}{more}")


def _bytes_of(t: torch.Tensor):
    """A flat uint8 numpy view of ``t``'s memory, or None where ``t`` is not one plain
    contiguous block on the CPU (a reshape would copy it, and the copy would never change)."""
    t = t.detach()
    if t.device.type != "cpu" or not t.is_contiguous() or t.is_conj() or t.is_neg() \
            or t.layout != torch.strided:
        return None
    try:
        return t.reshape(-1).view(torch.uint8).numpy()
    except (RuntimeError, TypeError):
        return None


def _np():
    import numpy

    return numpy


def _same_values(t: torch.Tensor, snapshot: torch.Tensor) -> bool:
    """The byte comparison of ``matches`` where both are plain blocks, else ``torch.equal``."""
    a, b = _bytes_of(t), _bytes_of(snapshot)
    if a is None or b is None:
        return bool(torch.equal(t, snapshot))
    return bool(_np().array_equal(a, b))


class FrozenGraph:
    """The callable of an inference graph whose weights are frozen; see the module.

    ``rebuild(constants)`` returns the graph's callable built around ``constants``
    (placeholder -> tensor; ``{}``: weights as inputs). ``events`` is where the changes
    are kept (the graph's record, read by the report)."""

    def __init__(self, fn: Callable, constants: dict[torch.fx.Node, torch.Tensor],
                 positions: dict[torch.fx.Node, int],
                 rebuild: Callable[[dict], Callable], events: list[WeightEvent],
                 label: str, refreeze_limit: int):
        self._positions = positions
        self._rebuild = rebuild
        self._label = label
        self._limit = refreeze_limit
        self.events = events
        self._lock = threading.Lock()
        # (guard, fn) read in one attribute load, so a call never pairs one set of
        # weights' check with another set's pieces while another thread re-freezes
        self._state: tuple[Optional[WeightGuard], Callable] = (self._guard(constants), fn)
        self.__name__ = f"frozen_{label}"

    def _guard(self, constants: dict) -> WeightGuard:
        nodes = list(constants)
        return WeightGuard([self._positions[n] for n in nodes], [constants[n] for n in nodes],
                           [n.meta.get("arbiter_input", (n.name, "input")) for n in nodes])

    @property
    def weights_as_inputs(self) -> bool:
        return self._state[0] is None

    def __call__(self, *args: Any) -> Any:
        guard, fn = self._state
        if guard is None or guard.matches(args):
            return fn(*args)
        return self._changed(args)(*args)

    def _changed(self, args: Sequence[Any]) -> Callable:
        with self._lock:
            guard, fn = self._state
            if guard is None or guard.matches(args):  # another thread got here first
                return fn
            why = guard.why(args)
            refrozen = sum(e.action == "re-frozen" for e in self.events)
            if refrozen < self._limit:
                constants = {n: args[i].detach() for n, i in self._positions.items()}
                action = "re-frozen"
                fn = self._rebuild(constants)
                self._state = (self._guard(constants), fn)
                log.warning("%s: %s; re-freezing (%d of at most %d; `refreeze_limit`)",
                            self._label, why, refrozen + 1, self._limit)
            else:
                action = "weights as inputs"
                fn = self._rebuild({})
                self._state = (None, fn)
                log.warning("%s: %s; re-frozen %d time(s) already (`refreeze_limit`): from "
                            "now on this graph takes its weights as inputs", self._label,
                            why, refrozen)
            self.events.append(WeightEvent(why, action))
            return fn


def placeholder_positions(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, int]:
    """Placeholder -> its position among the graph's inputs."""
    return {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
