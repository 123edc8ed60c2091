"""`arbiter calibrate`: measure this machine's calibration now (policy `calibrated`).

    arbiter calibrate [--config C] [--out FILE] [--budget S] [--again]

Each available backend of the config (default: the embedded default's) is timed on small
graphs of each op class and on a tiny one (its per-call cost); the result goes to the
persistent cache, keyed by this machine, the thread count and the backends' versions and
options, where policy `calibrated` finds it (otherwise it measures on first need, within
`calibration.time_budget_s`). `--out` also writes it to a file a config's
`calibration.file` (or $ARBITER_CALIBRATION) pins. Run it on a quiet machine: under load
the numbers describe the load.
"""
from __future__ import annotations

import os
import time


def add_arguments(parser) -> None:
    parser.add_argument("--config", default=None,
                        help="a config (path or shipped name); default the embedded default")
    parser.add_argument("--out", default=None, help="also write the calibration to this file")
    parser.add_argument("--budget", type=float, default=None,
                        help="stop starting compiles after this many seconds (default: none)")
    parser.add_argument("--again", action="store_true",
                        help="measure everything again (default: only what is missing)")


def run(args) -> int:
    from ..arbiter import Arbiter
    from ..measure.calibration import Calibrations, backend_row, taken_words, write_file
    from ..measure.loadavg import load_average

    be = Arbiter(args.config)
    be.apply_resources()
    calib = Calibrations(be.planner, be.cache, budget_s=args.budget, again=args.again,
                         pinned=False)
    load = load_average()
    start = time.perf_counter()
    measured = calib.measured()
    took = time.perf_counter() - start
    rows = calib.get()
    for name in calib.names:
        print(f"{name:12s} {backend_row(rows.get(name))}")
        print(f"{'':12s} {taken_words(measured.get(name))}")
        for cell, why in measured.get(name).refused.items() if name in measured else ():
            print(f"{'':12s} {cell}: not measured ({why})")
    print(f"{took:.1f} s ({calib.source}: "
          + ("measured now" if calib.source == "measured" else "nothing measured now; "
             "`--again` measures everything again")
          + f"); load average {load:.2f} now on {os.cpu_count()} cores"
          + ("" if be.cache is not None else
                                       "; the cache is off: nothing was kept"))
    if args.out:
        write_file(args.out, measured, be.backends)
        print(f"wrote {args.out}")
    return 0
