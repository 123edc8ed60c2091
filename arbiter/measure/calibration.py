"""Where this machine's calibration comes from, and where it is kept (policy `calibrated`).

``Calibrations.get()`` gives each available backend's ``BackendCalibration``
(plan/predict.py), from, in order: a calibration file (config ``calibration.file``, else
``$ARBITER_CALIBRATION``; written by ``arbiter calibrate --out FILE``), pinned and never
measured further; this process's memory, then the persistent cache (kind
``calibration``, one entry per backend keyed by the machine, torch's thread count and
version, and the backend's name, version and options); else measuring what is missing
(``calibration_cells.Calibrator``) within ``calibration.time_budget_s``, never in a dry
run. One taken under load is provisional (``PROVISIONAL``) and measured again when the
machine is quieter. A backend with no calibration is priced by the static table
(plan/cost.py). docs/policies.md ("`calibrated`") says when and why.
"""
from __future__ import annotations

import json
import logging
import math
import os
import platform
import threading
import time
from dataclasses import replace
from typing import Any, Optional

import torch

from ..backend import Backend
from ..cache import Cache
from ..errors import ArbiterError
from .loadavg import load_average, load_per_core
from ..ops import real_tensors
from ..plan.predict import INT8_CLASSES, BackendCalibration, predict
from .calibration_cells import CELLS, Calibrator, Measured
from .feedback import Feedback, correction, observations
from .feedback import forget as forget_feedback

log = logging.getLogger(__name__)

KIND = "calibration"
ENV_FILE = "ARBITER_CALIBRATION"
FORMAT = 1
#: A calibration file larger than this is refused (it is read whole).
MAX_FILE_BYTES = 1 << 20

_MEMO: dict[str, Measured] = {}  # cache key -> measured, for this process
_LOCK = threading.Lock()


def machine() -> dict:
    """What identifies this machine's speed: CPU model, core count, architecture."""
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            for line in f.read(1 << 16).decode(errors="replace").splitlines():
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "arch": platform.machine()}


def key_parts(backend: Backend, threads: int) -> dict:
    return {"kind": KIND, "format": FORMAT, "machine": machine(), "threads": threads,
            **backend.cache_parts()}


def _key(parts: dict) -> str:
    import hashlib

    return hashlib.sha256(json.dumps({"torch": torch.__version__, **parts}, sort_keys=True,
                                     default=str).encode()).hexdigest()


def read_file(path: str) -> dict[str, Measured]:
    """A calibration file's backends (``write_file``'s shape); ArbiterError naming the
    file and what is wrong otherwise."""
    try:
        size = os.path.getsize(path)
        if size > MAX_FILE_BYTES:
            raise ArbiterError(f"calibration file {path}: {size} bytes, more than the "
                               f"{MAX_FILE_BYTES} a calibration may have")
        with open(path) as f:
            raw = json.load(f)
    except (OSError, ValueError) as exc:
        raise ArbiterError(f"calibration file {path}: cannot read it ({exc}); write one "
                           "with `arbiter calibrate --out FILE`") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT \
            or not isinstance(raw.get("backends"), dict):
        raise ArbiterError(f"calibration file {path}: not a calibration of format {FORMAT} "
                           "(keys `format`, `backends`); write one with `arbiter calibrate "
                           "--out FILE`")
    out = {}
    for name, entry in raw["backends"].items():
        m = Measured.from_json(entry.get("measured") if isinstance(entry, dict) else None)
        if m is None:
            raise ArbiterError(f"calibration file {path}: backend {name!r}: `measured` must "
                               "hold times_us, work and refused mappings")
        out[name] = m
    return out


#: A calibration measured at a load average above this per core is provisional: it
#: describes the load as much as the machine (on a shared 2-core machine, predictions
#: were off by up to 200x), and the next compile that finds the machine below it measures
#: again.
PROVISIONAL = 0.5


def provisional(m: Measured) -> bool:
    """Whether ``m`` was measured under load (``PROVISIONAL``)."""
    return m.load is not None and m.load > PROVISIONAL


def quieter_now() -> bool:
    """Whether this machine's load per core is now at most ``PROVISIONAL`` (so below
    what a provisional calibration was measured at)."""
    now = load_per_core()
    return not math.isnan(now) and now <= PROVISIONAL


def taken_words(m: Optional[Measured]) -> str:
    """When and at what load ``m`` was measured, and whether it is provisional."""
    if m is None:
        return "not measured"
    when = m.taken.replace("T", " ") if m.taken else "at an unrecorded time"
    load = f"load {m.load:.2f} per core" if m.load is not None else "load unrecorded"
    return f"taken {when}, {load}" + (
        " (provisional: taken under load, measured again when the machine is quieter)"
        if provisional(m) else "")


def write_file(path: str, measured: dict[str, Measured], backends: dict) -> None:
    """A calibration file: the machine, threads and each backend's measurements."""
    load = load_average()
    data = {"format": FORMAT, "machine": machine(), "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "written": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "load": None if math.isnan(load) else round(load, 2),
            "backends": {n: {"version": _version(backends[n]), "measured": m.to_json()}
                         for n, m in measured.items()}}
    with open(path, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")


def _version(backend: Backend) -> Optional[str]:
    try:
        return backend.version()
    except Exception:  # noqa: BLE001 - a version is not worth a failure
        return None


class Calibrations:
    """The calibration one planner's policy reads (see the module docstring)."""

    def __init__(self, planner: Any, cache: Optional[Cache], file: Optional[str] = None,
                 budget_s: Optional[float] = 60.0, measure: bool = True,
                 progress: bool = True, again: bool = False, pinned: bool = True):
        """``again``: measure every cell anew; ``pinned=False``: ignore a calibration
        file (``arbiter calibrate`` measures the machine whatever pins it)."""
        self._planner = planner
        self._cache = cache
        self._file = (file or os.environ.get(ENV_FILE) or None) if pinned else None
        self._again = again
        self._budget_s = budget_s
        self._measure = measure
        self._progress = progress
        self._got: Optional[dict[str, Measured]] = None
        self._feedback: Optional[Feedback] = None  # set by _load, unless pinned
        self.source = ""  # "file <path>", "measured", "cache": the report says it
        self.measuring_s = 0.0  # spent measuring (a graph's planning time leaves it out)

    @property
    def pinned_file(self) -> Optional[str]:
        """The calibration file pinned (config ``calibration.file``, else
        ``$ARBITER_CALIBRATION``), or None: then the cache's (or measured) is used."""
        return self._file

    @property
    def names(self) -> list[str]:
        p = self._planner
        return [n for n in p.backends if n not in p.unavailable]

    def measured(self, measure: bool = True) -> dict[str, Measured]:
        """Each available backend's measurements (measuring what is missing, once);
        ``measure=False``: what is known without measuring (kept only when complete)."""
        with _LOCK:
            if self._got is not None:
                return self._got
            if not measure:
                saved, self._measure = self._measure, False
                try:
                    got = self._load()
                finally:
                    self._measure = saved
                if len(got) == len(self.names) and all(m.complete() for m in got.values()):
                    self._got = got
                return got
            self._got = self._load()
            return self._got

    def get(self, measure: bool = True) -> dict[str, BackendCalibration]:
        """The prediction's view of ``measured``: backend -> calibration (a backend
        without its per-call cell is left out: the static table prices it)."""
        measured = self.measured(measure)
        out = {}
        for name, c in self._uncorrected(measured).items():
            ratios = self._feedback.ratios(name, _identity(measured[name])) \
                if self._feedback is not None else []
            out[name] = replace(c, observed=correction(ratios), observed_n=len(ratios))
        return out

    def _uncorrected(self, measured: dict[str, Measured]) -> dict[str, BackendCalibration]:
        """Each backend's calibration as measured (no feedback), those with a per-call
        cell."""
        out = {}
        for name, m in measured.items():
            c = m.calibration(self._planner.backends[name].inline_aten)
            if c is not None:
                out[name] = c
        return out

    def observe(self, candidates: Any, only: str) -> None:
        """Feed a first call's timed candidates back (measure/feedback.py): each one
        on a single backend corrects that backend's later predictions. Nothing with a
        pinned calibration file."""
        if self._feedback is None or self._got is None:
            return
        raw = self._uncorrected(self._got)

        def predicted(plan: Any) -> Optional[float]:
            got = predict(plan, self._planner.inline, raw)
            return None if got.uncalibrated or got.ms <= 0 else got.ms

        for backend, ratio in observations(candidates, only, predicted):
            m = self._got.get(backend)
            if m is not None:
                self._feedback.observe(backend, _identity(m), ratio)
                log.info("calibration of %s: a candidate measured %.2fx its prediction; "
                         "fed back", backend, ratio)

    def cached(self) -> dict[str, BackendCalibration]:
        """What the file, memory or cache holds for this planner's backends, nothing
        measured."""
        return self.get(measure=False)

    def _load(self) -> dict[str, Measured]:
        if self._file:
            pinned = read_file(self._file)
            self.source = f"file {self._file}"
            return {n: m for n, m in pinned.items() if n in self.names}
        threads = torch.get_num_threads()
        keys = {n: _key(key_parts(self._planner.backends[n], threads)) for n in self.names}
        self._feedback = Feedback(self._cache, keys)
        have: dict[str, Measured] = {}
        for n, k in keys.items():
            if self._again:
                break
            m = _MEMO.get(k)
            if m is None and self._cache is not None:
                m = Measured.from_json(self._cache.get_json(KIND, k))
            if m is not None and provisional(m) and quieter_now():
                log.info("calibration of %s: taken at a load of %.2f per core (provisional); "
                         "the machine is quieter now: measured again", n, m.load)
                m = None
            if m is not None:
                have[n] = m
        self.source = "cache"
        if not self._measure or all(m.complete() for m in have.values()) \
                and len(have) == len(keys):
            return have
        return self._complete(keys, have)

    def _complete(self, keys: dict[str, str], have: dict[str, Measured]) -> dict[str, Measured]:
        """Measure what ``have`` lacks (within the budget), keep it, return it all."""
        missing = [n for n in keys if n not in have or not have[n].complete()]
        start = time.perf_counter()
        got = _measure_outside_compile(lambda: Calibrator(self._planner, self._budget_s,
                                                self._progress).run(missing, have))
        if got is None:
            return have
        log.info("calibration of %s: %.1f s (%d cells each)", ", ".join(missing),
                 time.perf_counter() - start, len(CELLS))
        self.source = "measured"
        self.measuring_s += time.perf_counter() - start
        for n, m in got.items():
            _MEMO[keys[n]] = m
            if self._cache is not None:
                self._cache.put_json(KIND, keys[n], m.to_json())
            have[n] = m
        return have


def _identity(m: Measured) -> str:
    """Which calibration ``m`` is (feedback is tied to it): when it was taken and a hash
    of what it measured (two taken within one second differ by their times)."""
    import hashlib

    digest = hashlib.sha256(json.dumps(m.to_json(), sort_keys=True, default=str).encode())
    return f"{m.taken or ''}|{digest.hexdigest()[:16]}"


def _measure_outside_compile(run: Any) -> Optional[dict]:
    """``run()`` outside any compile's modes, or None (logged) when it raised. A
    calibration first needed inside a compile (Dynamo's backend call: AOTAutograd's
    FakeTensorMode and tracing context) measures real tensors and compiles graphs of its
    own, so it runs with those modes and that context set aside (``ops.real_tensors``).
    A calibration that fails leaves the static cost table to price the backends
    (plan/cost.py) and is not tried again in this process; the user's compile goes on."""
    if _FAILED:
        return None
    try:
        with real_tensors():
            return run()
    except Exception as exc:  # noqa: BLE001 - never fail the user's compile for it
        _FAILED.append(f"{type(exc).__name__}: {exc}")
        log.warning("calibration failed (%s); the static cost table prices the backends "
                    "it lacks in this process", _FAILED[-1])
        return None


_FAILED: list[str] = []  # a calibration that raised, once per process


def forget() -> None:
    """Drop this process's memory of calibrations (tests)."""
    with _LOCK:
        _MEMO.clear()
        _FAILED.clear()
    forget_feedback()


def backend_row(calib: Optional[BackendCalibration]) -> str:
    """One backend's calibration in a few words (``arbiter backends``): its per-call (or
    per-node) cost, each class's rate at its largest calibrated size, and its factor for
    whole blocks of each kind."""
    if calib is None:
        return "not calibrated"
    parts = [f"call {calib.call_us:.1f} us" if calib.call_us else
             f"node {calib.node_us:.1f} us"]
    for cls, cells in calib.cells.items():
        w, us = cells[-1]
        rate = w / us / 1e3  # work per us -> G per s
        flops = INT8_CLASSES.get(cls, cls) in ("linear", "conv", "attention")
        unit = "GFLOP/s" if flops else "GB/s"
        parts.append(f"{cls} {rate:.3g} {unit}")
    parts += [f"{kind} blocks x{f:.2f} of op by op" for kind, f in calib.factors.items()]
    if calib.observed_n:
        parts.append(f"predictions x{calib.observed:.2f} from {calib.observed_n} timings "
                     "of first calls here" if calib.observed != 1.0 else
                     f"{calib.observed_n} timing(s) of first calls here, too few to "
                     "correct its predictions")
    return ", ".join(parts)
