"""Per-call cost of the runtime's output metadata check
(arbiter.run.checks.verify.check_meta), as a ratio to a 4x8 float32 ``torch.add`` timed in
the same run (absolute times on a shared machine are noise; the ratio is what to compare).

    .venv/bin/python bench/check_meta_overhead.py
"""
from __future__ import annotations

import os
import sys
import timeit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from arbiter.run.checks.verify import check_meta, output_specs  # noqa: E402


def main() -> None:
    n = 200_000
    for k in (1, 4):
        gm = make_fx(lambda x: tuple(x * i for i in range(k)), tracing_mode="fake")(
            torch.randn(4, 8))
        specs = output_specs(gm)
        outs = [torch.randn(4, 8) for _ in range(k)]
        base = min(timeit.repeat(lambda: torch.add(outs[0], 1), number=n, repeat=5)) / n
        for devices in (True, False):
            t = min(timeit.repeat(lambda: check_meta(outs, specs, devices),
                                  number=n, repeat=5)) / n
            print(f"{k} output(s), devices={devices}: check_meta {t * 1e6:.2f} us, "
                  f"torch.add {base * 1e6:.2f} us, ratio {t / base:.2f}")


if __name__ == "__main__":
    main()
