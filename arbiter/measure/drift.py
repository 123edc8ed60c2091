"""The drift watch (config `accuracy.every_n`, docs/precision.md) over a lowered placement.

A graph whose chosen placement runs at a lower precision is checked against float32
eager one call in N (the first included), by the config's bound on the graph's outputs
(bound.py), the bound the user stated. A check outside it returns eager's result for
that call and sends every lowered partition back to float32: each piece is demoted to
the next backend of its chain (the variant's base backend) on its next call, with a
warning and a fallback at stage ``verify`` in the report, and the graph's
``accuracy.drift`` says what happened. Calls between two checks are not checked: a
drift shows in at most ``every_n - 1`` calls before one catches it.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Optional

from .permodule import PrecisionOutcome
from .precision import Acceptance
from .timing import pieces_of

log = logging.getLogger(__name__)


class DriftWatch:
    """The installed callable of a graph running lowered pieces, checked every N calls."""

    def __init__(self, fn: Callable, lowered: tuple[str, ...], acceptance: Acceptance,
                 every_n: int, outcome: PrecisionOutcome, label: str):
        self._fn = fn
        self._lowered = lowered
        self._acc = acceptance
        self._every = every_n
        self._outcome = outcome
        self._label = label
        self._calls = 0
        self._lock = threading.Lock()
        self.active = True  # False once the lowered pieces were sent back to float32
        self.__name__ = getattr(fn, "__name__", "drift_watch")

    def __call__(self, *args: Any) -> Any:
        if not self.active:
            return self._fn(*args)
        with self._lock:
            due = self._calls % self._every == 0
            self._calls += 1
        if not due:
            return self._fn(*args)
        sample = self._acc.sample(args)
        out = self._fn(*args)
        got = self._acc.bound.judge([sample.ref], [list(out)])
        o = self._outcome
        o.checks += 1
        if o.worst is None or got.score > (o.worst.get("score") or 0.0):
            o.worst = got.as_dict()
        if got.ok:
            return out
        self._demote(got.why)
        return type(out)(sample.ref) if isinstance(out, (tuple, list)) else sample.ref

    def _demote(self, why: str) -> None:
        """Every lowered piece back to float32 (see the module docstring)."""
        self.active = False
        reason = f"the graph's outputs drifted outside the bound ({why})"
        names = []
        for piece in pieces_of(self._fn):
            if piece.record.backend in self._lowered:
                names.append(f"partition {piece.record.partition_id} on "
                             f"{piece.record.backend}")
                piece.demote("verify", reason)
        line = f"check {self._outcome.checks}: {reason}; back to float32: " + (
            ", ".join(names) or "none was still lowered")
        self._outcome.drift.append(line)
        log.warning("%s: %s", self._label, line)


def watch(fn: Callable, lowered: tuple[str, ...], acceptance: Acceptance, accuracy: Any,
          outcome: Optional[PrecisionOutcome], label: str) -> tuple[Callable, PrecisionOutcome]:
    """``fn`` watched when it runs lowered pieces (else as is), and the outcome the watch
    writes to."""
    outcome = outcome if outcome is not None else PrecisionOutcome()
    if not lowered or accuracy is None:
        return fn, outcome
    return DriftWatch(fn, lowered, acceptance, int(accuracy.every_n), outcome, label), outcome
