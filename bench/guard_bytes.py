"""The frozen-weights guard's byte comparison: numpy against Python's own bytes.

``WeightGuard.matches`` (arbiter/run/freeze.py) compares every small frozen buffer with
its snapshot on every call. Two ways of doing it, on two buffer sets shaped like real
models' (random values, the sizes are what matters):

* ``resnet50``: its 106 BatchNorm statistics (running mean and variance, 64-2048
  channels, 212 KB);
* ``pt2e_cnn``: bench/quantized.py's PT2E CNN, 9 buffers (per-channel scales, zero
  points, int8 weights; 6 KB).

``numpy``: ``np.array_equal(np.concatenate(views), snapshot)`` (the guard until
2026-11-29); ``join``: ``b"".join(memoryviews) == snapshot`` (since). Timed hot (back
to back) and cold (each check right after a 16 MB sum, as a real call's check runs right
after the model's kernels). Mean us per check over --calls, in alternation.

    .venv/bin/python bench/guard_bytes.py [--calls 300]
"""
from __future__ import annotations

import argparse
import os
import time


def buffers(name: str):
    import torch

    if name == "resnet50":
        stages = [(64, 256, 3), (128, 512, 4), (256, 1024, 6), (512, 2048, 3)]
        chans = [64]
        for mid, out, blocks in stages:
            chans += [mid, mid, out] * blocks + [out]
        return [torch.randn(c) for c in chans[:53] for _ in range(2)]
    out = []
    for cin, cout, k in ((3, 16, 3), (16, 32, 3), (32, 10, 0)):
        shape = (cout, cin, k, k) if k else (cout, cin)
        out += [torch.randn(cout), torch.zeros(cout, dtype=torch.int64),
                torch.randint(-128, 127, shape, dtype=torch.int8)]
    return out


def main() -> int:
    import numpy as np
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    big = torch.randn(4 * 1024 * 1024)
    clock = time.perf_counter
    print("| buffers | bytes | state | numpy us | join us | numpy / join |")
    print("|---|---:|---|---:|---:|---:|")
    for name in ("resnet50", "pt2e_cnn"):
        views = [t.reshape(-1).view(torch.uint8).numpy() for t in buffers(name)]
        snap_np = np.concatenate(views)
        mvs = [memoryview(v) for v in views]
        snap_b = b"".join(mvs)
        ways = {"numpy": lambda: np.array_equal(np.concatenate(views), snap_np),
                "join": lambda: b"".join(mvs) == snap_b}
        assert all(f() for f in ways.values())
        for state, between in (("hot", lambda: None), ("cold", lambda: big.sum())):
            spent = dict.fromkeys(ways, 0.0)
            for _ in range(args.calls):
                for k, f in ways.items():
                    between()
                    start = clock()
                    f()
                    spent[k] += clock() - start
            us = {k: v / args.calls * 1e6 for k, v in spent.items()}
            print(f"| {name} ({len(views)}) | {snap_np.nbytes} | {state} | {us['numpy']:.1f} "
                  f"| {us['join']:.1f} | {us['numpy'] / us['join']:.1f}x |")
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
