"""A training step split into forward and backward, eager against arbiter, in one process
(where bench/training.py's step time goes), with the partitions each graph got.

    .venv/bin/python bench/training_phases.py resnet18 ['{"policy": "measure", ...}']

The model comes from bench/training.py (`bert`, `gpt2`, `resnet18`); the optional second
argument is an arbiter config as JSON (default: the shipped `default` config). Two
warm-up steps, then the median of 5 forward and 5 backward times for each.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import build  # noqa: E402

import arbiter  # noqa: E402


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "resnet18"
    config = json.loads(sys.argv[2]) if len(sys.argv) > 2 else "default"
    model, x = build(name)
    be = arbiter.Arbiter(config)
    compiled = torch.compile(model, backend=be)

    def step(fn) -> tuple[float, float]:
        t0 = time.perf_counter()
        loss = fn(x).pow(2).mean()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        return t1 - t0, t2 - t1

    for _ in range(2):
        step(compiled)
    print(f"load average {os.getloadavg()}")
    for label, fn in (("eager", model), ("arbiter", compiled)):
        runs = [step(fn) for _ in range(5)]
        fwd = statistics.median(r[0] for r in runs) * 1e3
        bwd = statistics.median(r[1] for r in runs) * 1e3
        print(f"{label}: forward {fwd:.1f} ms, backward {bwd:.1f} ms")
    for g in be.report(advice=False).graphs:
        print(g.kind, g.nodes, "nodes:", [(p.backend, p.nodes) for p in g.partitions])


if __name__ == "__main__":
    main()
