"""The machine's load average, as arbiter records it beside what it measures.

One reader for all of them: the calibration, ``arbiter calibrate``, the CLI's timings.
"""
from __future__ import annotations

import math
import os


def load_average() -> float:
    """The 1-minute load average, NaN where the system has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return float("nan")


def load_per_core() -> float:
    """The 1-minute load average per CPU, rounded to 0.01; 0.0 where the system has none."""
    load = load_average()
    return 0.0 if math.isnan(load) else round(load / (os.cpu_count() or 1), 2)
