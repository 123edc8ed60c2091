"""Timing callables against each other as the benches do (bench/zoo.py), for ``arbiter demo``.

Interleaved rounds (in each round every callable runs its own K calls in turn, so all
see the same machine load), K per callable from a probe (about ``round_s`` seconds of
its calls), each call timed; a callable's time is the median of its round medians, its
spread the lowest and highest round median. The machine's load is read before and
after; a comparison on a machine too busy to time says so instead of giving a ratio.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

from ..measure.loadavg import load_average
from ..report.cells import plural

#: a machine is too busy to time when its load average per usable CPU passes this
BUSY_LOAD_PER_CPU = 1.5
#: ... or when a callable's round medians spread over more than this share of its median
BUSY_SPREAD = 0.25


@dataclass
class Timed:
    name: str
    calls: int = 0  # per round
    rounds_ms: list[float] = field(default_factory=list)  # each round's median call

    @property
    def median_ms(self) -> float:
        return statistics.median(self.rounds_ms)

    @property
    def spread(self) -> float:
        """(highest - lowest round median) / median."""
        return (max(self.rounds_ms) - min(self.rounds_ms)) / self.median_ms

    def line(self) -> str:
        return (f"{self.name} {self.median_ms:.3f} ms (rounds {min(self.rounds_ms):.3f}-"
                f"{max(self.rounds_ms):.3f}, {plural(self.calls, 'call')} each)")


@dataclass
class Load:
    average: tuple[float, float]  # 1-minute load average before and after
    cpus: int  # CPUs this process may use
    others: int  # other processes using CPU (-1: unknown)

    def line(self) -> str:
        others = (f", {plural(self.others, 'other busy process', 'other busy processes')}"
                  if self.others >= 0 else "")
        return (f"load average {self.average[0]:.2f} before, {self.average[1]:.2f} after, "
                f"on {plural(self.cpus, 'CPU')}{others}")


def other_busy_processes() -> int:
    """Processes of other sessions using CPU now (ps, >= 5% CPU), this one excluded;
    -1 when ``ps`` cannot tell."""
    try:
        out = subprocess.run(["ps", "-eo", "pid,pcpu"], capture_output=True, text=True,
                             timeout=10).stdout.splitlines()[1:]
    except (OSError, subprocess.SubprocessError):
        return -1
    me = os.getpid()
    return sum(1 for ln in out if len(ln.split()) == 2 and int(ln.split()[0]) != me
               and float(ln.split()[1]) >= 5.0)


def _calls(fn: Callable[[], object], k: int) -> list[float]:
    times = []
    for _ in range(k):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def interleaved(fns: dict[str, Callable[[], object]], rounds: int = 5, round_s: float = 0.5,
                max_calls: int = 2000) -> tuple[dict[str, Timed], Load]:
    """Time each of ``fns`` (warmed up already) in ``rounds`` interleaved rounds."""
    from ..backend import usable_cpus

    before = load_average()
    others = other_busy_processes()
    timed = {}
    for name, fn in fns.items():  # the probe: how many calls make about round_s seconds
        one = statistics.median(_calls(fn, 3))
        timed[name] = Timed(name, calls=max(1, min(max_calls, round(round_s * 1e3 /
                                                                    max(one, 1e-6)))))
    for _ in range(max(1, rounds)):
        for name, fn in fns.items():
            timed[name].rounds_ms.append(statistics.median(_calls(fn, timed[name].calls)))
    return timed, Load((before, load_average()), usable_cpus(), others)


def too_busy(timed: dict[str, Timed], load: Load) -> Optional[str]:
    """Why this machine was too busy for the timings to compare, or None."""
    why = []
    worst = max(load.average)
    if worst > BUSY_LOAD_PER_CPU * load.cpus:
        why.append(f"load average {worst:.2f} on {plural(load.cpus, 'CPU')}")
    for t in timed.values():
        if len(t.rounds_ms) > 1 and t.spread > BUSY_SPREAD:
            why.append(f"{t.name}'s rounds spread over {t.spread:.0%} of its median")
    return "; ".join(why) or None


def comparison(timed: dict[str, Timed], load: Load, base: str, other: str,
               note: str = "") -> str:
    """The speed lines: each side's median and spread, the machine's load, and the ratio,
    or, on a machine too busy, that there is none to give."""
    rounds = len(timed[base].rounds_ms)
    lines = [f"speed, {rounds} interleaved rounds{note} ({load.line()}):"]
    lines += [f"  {timed[n].line()}" for n in (base, other)]
    busy = too_busy(timed, load)
    if busy:
        lines.append(f"  no ratio: this machine is too busy to time ({busy}); run `arbiter "
                     "demo` again on a quiet machine for a speed comparison")
    else:
        ratio = timed[other].median_ms / timed[base].median_ms
        lines.append(f"  {other} / {base}: {ratio:.2f} (below 1: {other} is faster)")
    return "\n".join(lines)
