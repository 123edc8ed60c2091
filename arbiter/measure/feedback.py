"""First calls' measured times, fed back to correct this machine's predictions.

The calibration prices a plan op by op (plan/predict.py); a whole graph's measured time
differs (fusion, layouts, an exporter's choices, the load of the moment): under load the
zoo's predictions were off by up to 200x. Every time a first call times a candidate that
runs on one backend alone (``only X``, eager whole), the ratio of its measured time to its
uncorrected prediction is kept for that backend, in memory and in the persistent cache
(kind ``calibration-feedback``, keyed as the backend's calibration and tied to that
calibration, its time and what it measured: a new calibration starts afresh), the last
``KEEP`` of them. Once a backend has ``MIN_SEEN``, its predictions are multiplied by
their geometric mean (within ``1/LIMIT`` to ``LIMIT``): predictions converge to what
this machine measures. A pinned calibration file is used as it is, so plans from it stay
reproducible.
"""
from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable
from typing import Any, Optional

log = logging.getLogger(__name__)

KIND = "calibration-feedback"
#: Ratios kept per backend (the newest).
KEEP = 16
#: Ratios a backend needs before its predictions are corrected.
MIN_SEEN = 2
#: The correction stays within [1/LIMIT, LIMIT].
LIMIT = 16.0

_MEMO: dict[str, dict] = {}  # cache key -> {"calibration": str, "ratios": [float]}
_LOCK = threading.Lock()


def correction(ratios: list[float]) -> float:
    """The factor predictions are multiplied by: the geometric mean of ``ratios``
    (measured over predicted) within the limits, 1.0 with fewer than ``MIN_SEEN``."""
    if len(ratios) < MIN_SEEN:
        return 1.0
    mean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    return min(LIMIT, max(1.0 / LIMIT, mean))


class Feedback:
    """One planner's record of measured-over-predicted ratios, per backend."""

    def __init__(self, cache: Any, keys: dict[str, str]):
        """``keys``: backend -> its calibration's cache key."""
        self._cache = cache
        self._keys = dict(keys)

    def ratios(self, backend: str, calibration: str) -> list[float]:
        """The ratios kept for ``backend`` under its calibration (``calibration``: which
        one it is, its time and a hash of what it measured)."""
        key = self._keys.get(backend)
        if key is None:
            return []
        with _LOCK:
            entry = _MEMO.get(key)
            if entry is None and self._cache is not None:
                raw = self._cache.get_json(KIND, key)
                entry = raw if _valid(raw) else None
                if entry is not None:
                    _MEMO[key] = entry
        if entry is None or entry["calibration"] != calibration:
            return []
        return list(entry["ratios"])

    def observe(self, backend: str, calibration: str, ratio: float) -> None:
        """Keep one more ratio for ``backend`` under ``calibration``."""
        key = self._keys.get(backend)
        if key is None or not (math.isfinite(ratio) and ratio > 0):
            return
        kept = self.ratios(backend, calibration)[-(KEEP - 1):] + [ratio]
        entry = {"calibration": calibration, "ratios": kept}
        with _LOCK:
            _MEMO[key] = entry
        if self._cache is not None:
            self._cache.put_json(KIND, key, entry)


def _valid(raw: Any) -> bool:
    return isinstance(raw, dict) and isinstance(raw.get("calibration"), str) \
        and isinstance(raw.get("ratios"), list) and len(raw["ratios"]) <= KEEP \
        and all(isinstance(r, (int, float)) and math.isfinite(r) and r > 0
                for r in raw["ratios"])


def single_backend(candidate: Any, only: str) -> Optional[str]:
    """The one backend ``candidate`` runs every computing partition on, when it is an
    ``only X`` candidate (label prefix ``only``), else None."""
    from ..plan.evidence import is_compute

    names = [label[len(only):] for label in candidate.labels if label.startswith(only)]
    if not names:
        return None
    used = {p.backend for p in candidate.plan.partitions if any(map(is_compute, p.nodes))}
    return names[0] if used == {names[0]} else None


def observations(candidates: Iterable[Any], only: str,
                 predicted: Callable[[Any], Optional[float]]) -> list[tuple[str, float]]:
    """(backend, measured over predicted) of each timed single-backend candidate;
    ``predicted(plan)``: its uncorrected prediction in ms, None where the calibration
    lacks a backend it uses."""
    out = []
    for c in candidates:
        if c.measured_ms is None or c.lowered:
            continue
        backend = single_backend(c, only)
        raw = predicted(c.plan) if backend is not None else None
        if raw:
            out.append((backend, c.measured_ms / raw))
    return out


def forget() -> None:
    """Drop this process's memory of ratios (tests)."""
    with _LOCK:
        _MEMO.clear()
