"""``arbiter demo``: a real model split across backends, its report and its speed.

Compiles the model with the given config (the embedded default if none) twice: for
inference (weights frozen into the pieces) and for training (forward and backward
graphs). Checks outputs and gradients against eager, prints the capability report, and
times eager against arbiter (medians of interleaved rounds, this machine's load shown).
"""
from __future__ import annotations

import copy
import os
import statistics
import time
from typing import Any

import torch


def _median_ms(fn, rounds: int, inner: int) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) / inner * 1e3)
    return statistics.median(samples)


def _max_err(a: Any, b: Any) -> float:
    if isinstance(a, torch.Tensor):
        return (a.float() - b.float()).abs().max().item() if a.numel() else 0.0
    return max((_max_err(x, y) for x, y in zip(a, b)), default=0.0)


def run_demo(model_name: str = "gpt2_tiny", config: Any = None, rounds: int = 5) -> int:
    from ..arbiter import Arbiter
    from .examples import load_model

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    model, inputs = load_model(model_name)
    print(f"== torch-arbiter demo: {model_name}, config: {config or 'embedded default'}")

    # -- inference ----------------------------------------------------------------
    model.eval()
    be = Arbiter(config)
    compiled = torch.compile(model, backend=be)
    with torch.no_grad():
        ref = model(*inputs)
        start = time.perf_counter()
        out = compiled(*inputs)
        first = time.perf_counter() - start
        err = _max_err(out, ref)
        print(f"\n-- inference: first call (compile) {first:.1f} s, max |arbiter - eager| = {err:.2e}")
        print(be.report())
        for _ in range(3):  # warm up both
            model(*inputs)
            compiled(*inputs)
        inner = max(1, int(200 / max(0.01, _median_ms(lambda: model(*inputs), 3, 1))))
        eager_ms, arb_ms = [], []
        for _ in range(rounds):  # interleaved rounds: both see the same machine load
            eager_ms.append(_median_ms(lambda: model(*inputs), 1, inner))
            arb_ms.append(_median_ms(lambda: compiled(*inputs), 1, inner))
    e, a = statistics.median(eager_ms), statistics.median(arb_ms)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\n-- speed ({rounds} interleaved rounds x {inner} calls, {torch.get_num_threads()} "
          f"threads, load avg {load:.2f}): eager {e:.3f} ms, arbiter {a:.3f} ms, "
          f"ratio {a / e:.2f} (below 1 is faster)")

    # -- training -----------------------------------------------------------------
    model.train()
    twin = copy.deepcopy(model)
    be_train = Arbiter(config)
    compiled = torch.compile(model, backend=be_train)
    torch.manual_seed(1)  # same dropout masks: random ops run eagerly, in eager's order
    start = time.perf_counter()
    out = compiled(*inputs)
    loss = out.float().pow(2).mean()
    loss.backward()
    first = time.perf_counter() - start
    torch.manual_seed(1)
    ref = twin(*inputs).float().pow(2).mean()
    ref.backward()
    gerr = max(_max_err(p.grad, q.grad) for p, q in zip(model.parameters(), twin.parameters())
               if p.grad is not None)
    print(f"\n-- training step: first forward+backward (compile) {first:.1f} s, "
          f"max |grad arbiter - grad eager| = {gerr:.2e}")
    report = be_train.report()
    print(report)
    used = sorted({p.backend for g in report.graphs for p in g.partitions})
    print(f"\nbackends that ran partitions: {', '.join(used)}")
    ok = err < 1e-3 and gerr < 1e-3
    print("demo " + ("OK: outputs and gradients match eager" if ok else "FAILED: mismatch vs eager"))
    return 0 if ok else 1
