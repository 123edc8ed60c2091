"""Measuring this machine's calibration (policy `calibrated`; plan/predict.py reads it).

Per backend, small ATen graphs, one op class each, are compiled with the backend's own
``compile`` (the config's options; eager runs them in place) and timed: the minimum of a
few samples of at least ``SAMPLE_S`` each (on a shared machine noise only adds). Weights
are constants of the graph, as a frozen model's are. ``CELLS`` lists them, most telling
first: the per-call cost (a chain of 8 tiny ops), a small and a large linear layer (the
small one says what a tiny graph's matmuls cost), the large sizes of the other classes,
then a small convolution; the cells are taken in that order for every backend before the next
cell, so a budget that runs out leaves every backend with the cells that decide most.

A cell a backend cannot take whole (its manifest, through the same partitioner as a
plan) or fails to compile is recorded as refused: its class is priced by the static
table there. What the budget left untried is tried the next time a calibration is needed.
"""
from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.fx

from ..plan.cost import node_work
from ..plan.partition import partition_graph
from ..plan.predict import BackendCalibration, op_class

log = logging.getLogger(__name__)

#: One timing sample lasts at least this long.
SAMPLE_S = 0.003
#: Samples per cell (the minimum is kept): at least SAMPLES, and up to MAX_SAMPLES until
#: each backend's two fastest are within STABLE of each other (a loaded machine).
SAMPLES = 5
MAX_SAMPLES = 15
STABLE = 0.05
#: A progress line on stderr once calibrating has taken this long.
PROGRESS_AFTER_S = 2.0


def _chain(x):
    for i in range(8):
        x = x * 1.0001 if i % 2 else x + 0.5
    return (x,)


def _linear(m: int, k: int, n: int):
    w, b = torch.randn(n, k) / k ** 0.5, torch.randn(n)
    return (lambda x: (torch.nn.functional.linear(x, w, b),)), (torch.randn(m, k),)


def _conv(c: int, hw: int):
    w, b = torch.randn(c, c, 3, 3) / (9 * c) ** 0.5, torch.randn(c)
    return ((lambda x: (torch.nn.functional.conv2d(x, w, b, padding=1),)),
            (torch.randn(1, c, hw, hw),))


def _attention():
    q, k, v = (torch.randn(1, 12, 128, 64) for _ in range(3))
    return (lambda q, k, v: (torch.nn.functional.scaled_dot_product_attention(q, k, v),),
            (q, k, v))


def _elementwise():
    def f(x):
        y = torch.nn.functional.gelu(x * 0.5 + 0.1)
        return ((torch.tanh(y) - x) * y + 1.0,)
    return f, (torch.randn(128, 3072),)


def _norm():
    w, b = torch.randn(768), torch.randn(768)
    return ((lambda x: (torch.nn.functional.layer_norm(x, (768,), w, b),)),
            (torch.randn(128, 768),))


def _reduction():
    return ((lambda x: (torch.softmax(x, -1), x.sum(-1))), (torch.randn(12, 128, 128),))


#: (cell name, op class, builder of (function, inputs)), most telling first.
CELLS: list[tuple[str, str, Callable[[], tuple[Callable, tuple]]]] = [
    ("call", "call", lambda: (_chain, (torch.randn(8),))),
    ("linear 16x256x256", "linear", lambda: _linear(16, 256, 256)),
    ("linear 128x768x768", "linear", lambda: _linear(128, 768, 768)),
    ("conv 64ch 56x56", "conv", lambda: _conv(64, 56)),
    ("attention 12x128x64", "attention", _attention),
    ("elementwise 128x3072", "elementwise", _elementwise),
    ("layer_norm 128x768", "norm", _norm),
    ("softmax+sum 12x128x128", "reduction", _reduction),
    ("conv 16ch 28x28", "conv", lambda: _conv(16, 28)),
]


@dataclass
class Measured:
    """What one backend's calibration holds so far (the cache keeps it as JSON)."""

    times_us: dict[str, float]  # cell name -> microseconds per call
    work: dict[str, float]  # cell name -> its class's work (FLOPs or bytes)
    refused: dict[str, str]  # cell name -> why not measured
    seconds: float = 0.0  # spent measuring, compiles included
    load: Optional[float] = None  # load average per core when measuring began

    def tried(self) -> set[str]:
        return set(self.times_us) | set(self.refused)

    def complete(self) -> bool:
        return self.tried() >= {name for name, _, _ in CELLS}

    def calibration(self, inline: bool) -> Optional[BackendCalibration]:
        """The prediction's view; None until the per-call cell is measured."""
        call = self.times_us.get("call")
        if call is None:
            return None
        # the chain is 8 tiny nodes: in place (eager) it is 8 dispatches, compiled one call
        call_us, node_us = (0.0, call / 8) if inline else (call, 0.0)
        cells: dict[str, list] = {}
        for name, cls, _ in CELLS:
            if name == "call" or name not in self.times_us or not self.work.get(name):
                continue
            us = self.times_us[name] - call_us  # the call's own cost is not the class's
            cells.setdefault(cls, []).append((self.work[name], max(us, 1e-3)))
        return BackendCalibration(round(call_us, 3), round(node_us, 3),
                                  {k: tuple(sorted(v)) for k, v in cells.items()})

    def to_json(self) -> dict:
        return {"times_us": self.times_us, "work": self.work, "refused": self.refused,
                "seconds": round(self.seconds, 2), "load": self.load}

    @classmethod
    def from_json(cls, raw: Any) -> Optional["Measured"]:
        if not isinstance(raw, dict):
            return None
        try:
            return cls({str(k): float(v) for k, v in raw.get("times_us", {}).items()},
                       {str(k): float(v) for k, v in raw.get("work", {}).items()},
                       {str(k): str(v) for k, v in raw.get("refused", {}).items()},
                       float(raw.get("seconds", 0.0)),
                       None if raw.get("load") is None else float(raw["load"]))
        except (TypeError, ValueError, AttributeError):
            return None


def cell_work(gm: torch.fx.GraphModule, cls: str) -> float:
    """The work of the class's nodes in a cell's graph (FLOPs, else bytes moved)."""
    total = 0.0
    for n in gm.graph.nodes:
        if n.op == "call_function" and op_class(n) == cls:
            flops, moved = node_work(n)
            total += flops if flops else moved
    return total


#: A calibration begun above this load average per core is said to be noisy.
LOADED = 1.5


def _load_per_core() -> float:
    try:
        import os

        return round(os.getloadavg()[0] / (os.cpu_count() or 1), 2)
    except (AttributeError, OSError):
        return 0.0


def calls_per_sample(fn: Callable, args: tuple) -> int:
    """How many calls of ``fn`` one sample takes (at least SAMPLE_S); warms it up."""
    fn(*args)
    n, t = 1, 0.0
    while t < SAMPLE_S:
        n *= 2
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*args)
        t = time.perf_counter() - t0
    return n


def time_us(fns: dict[str, Callable], args: tuple) -> dict[str, float]:
    """Microseconds per call of each of ``fns``: interleaved rounds (each round one sample
    of each, so load falls on all alike; SAMPLES, then more up to MAX_SAMPLES while a
    backend's two fastest differ by more than STABLE), the minimum kept (on a shared
    machine noise only adds)."""
    inner = {k: calls_per_sample(f, args) for k, f in fns.items()}
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(MAX_SAMPLES):
        if r >= SAMPLES and all(_stable(xs) for xs in samples.values()):
            break
        for k, f in fns.items():
            n = inner[k]
            t0 = time.perf_counter()
            for _ in range(n):
                f(*args)
            samples[k].append((time.perf_counter() - t0) / n * 1e6)
    return {k: min(xs) for k, xs in samples.items()}


def _stable(xs: list[float]) -> bool:
    a, b = sorted(xs)[:2]
    return b <= a * (1 + STABLE)


class Calibrator:
    """Measures cells for some backends within a time budget, with progress on stderr.

    ``planner``: the config's (its backends with their options; ``table_for`` and
    ``plan`` say whether a backend takes a cell's graph whole). ``progress``: print a line
    on stderr once past PROGRESS_AFTER_S."""

    def __init__(self, planner: Any, budget_s: Optional[float], progress: bool = True):
        self._planner = planner
        self._budget_s = budget_s
        self._progress = progress
        self._start = time.perf_counter()
        self._shown_at = 0.0

    def run(self, names: list[str], have: dict[str, Measured]) -> dict[str, Measured]:
        """Complete ``have`` (backend -> what is measured so far) for ``names``: every
        cell not tried yet, cell by cell across the backends, until the budget is spent."""
        from torch.fx.experimental.proxy_tensor import make_fx

        out = {n: have.get(n) or Measured({}, {}, {}) for n in names}
        load = _load_per_core()
        for m in out.values():
            m.load = load if m.load is None else max(m.load, load)
        if load > LOADED:
            log.warning("calibrating at a load average of %.1f per core: other work shares "
                        "this machine, and the calibration will describe that load (here, "
                        "on a shared 2-core machine, it was off by up to 3.5x on whole "
                        "models); run `arbiter calibrate --again` when it is quiet", load)
        for name, cls, build in CELLS:
            todo = [b for b in names if name not in out[b].tried()]
            if not todo:
                continue
            with torch.no_grad():
                fn, args = build()
                gm = make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*args)
            work = cell_work(gm, cls) if cls != "call" else 0.0
            fns: dict[str, Callable] = {}
            for b in todo:
                if self._spent():
                    log.info("calibration: budget of %.0f s spent; the rest is measured "
                             "when next needed", self._budget_s)
                    break
                self._show(f"calibrating {b}: {name} ({self._elapsed():.0f} s so far)")
                t0 = time.perf_counter()
                got = self._compiled(b, gm, args)
                out[b].seconds += time.perf_counter() - t0
                if isinstance(got, str):
                    out[b].refused[name] = got
                    log.info("calibration: %s %s not measured: %s", b, name, got)
                else:
                    fns[b] = got
            if not fns:
                continue
            t0 = time.perf_counter()
            try:
                with torch.no_grad():
                    times = time_us(fns, args)
            except Exception as exc:  # noqa: BLE001 - one failing run: each alone
                log.info("calibration: %s failed to run together (%s); each alone", name, exc)
                times = {}
                for b, f in fns.items():
                    try:
                        with torch.no_grad():
                            times.update(time_us({b: f}, args))
                    except Exception as e:  # noqa: BLE001 - priced statically
                        out[b].refused[name] = f"{type(e).__name__}: {str(e)[:200]}"
            spent = (time.perf_counter() - t0) / max(1, len(fns))
            for b, us in times.items():
                out[b].times_us[name], out[b].work[name] = round(us, 3), work
                out[b].seconds += spent
                log.info("calibration: %s %s %.1f us", b, name, us)
            if self._spent():
                return out
        return out

    def _compiled(self, name: str, gm: torch.fx.GraphModule, args: tuple):
        """``gm`` compiled by backend ``name`` (called once), or why not."""
        planner = self._planner
        backend = planner.backends[name]
        if not backend.inline_aten:
            fallback = planner.backends[planner.fallback_name]
            plan = partition_graph(gm, planner.table_for([backend, fallback]), 1)
            if [p.backend for p in plan.partitions] != [name]:
                return "its manifest does not take this graph whole"
        try:
            with torch.no_grad():
                fn = gm if backend.inline_aten else backend.compile(gm, list(args))
                fn(*args)
                return fn
        except Exception as exc:  # noqa: BLE001 - a backend failing a cell prices it statically
            return f"{type(exc).__name__}: {str(exc)[:200]}"

    def _elapsed(self) -> float:
        return time.perf_counter() - self._start

    def _spent(self) -> bool:
        return self._budget_s is not None and self._elapsed() > self._budget_s

    def _show(self, msg: str) -> None:
        log.info(msg)
        elapsed = self._elapsed()
        if self._progress and elapsed > PROGRESS_AFTER_S \
                and elapsed - self._shown_at >= PROGRESS_AFTER_S:
            print(f"arbiter: {msg} (once per machine; `arbiter calibrate` does it ahead)",
                  file=sys.stderr, flush=True)
            self._shown_at = elapsed
