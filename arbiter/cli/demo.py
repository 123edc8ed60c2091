"""`arbiter demo`: a real model split across backends, its report and its speed.

Compiles the model with the given config (the embedded default if none) twice: for
inference (weights frozen into the pieces) and for training (forward and backward
graphs). Checks outputs and gradients against eager, prints the capability report, and
times eager against arbiter as the benches do: interleaved rounds, each side's median and
spread, this machine's load; on a machine too busy to time it says so instead of giving a
ratio (arbiter/cli/timing.py).
"""
from __future__ import annotations

import copy
import os
import time
from typing import Any


def add_arguments(parser) -> None:
    from .models import MODEL_ARG, models_epilog

    parser.epilog = models_epilog()
    parser.add_argument("--model", default="gpt2_tiny", metavar="MODEL",
                        help=f"{MODEL_ARG}; default gpt2_tiny")
    parser.add_argument("--config", default=None,
                        help="config file or shipped name (default, cpu, cpu_all); default: "
                             "the embedded default config")
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved timing rounds of eager and arbiter (default 5)")
    parser.add_argument("--round-s", type=float, default=0.5, metavar="S",
                        help="about how many seconds each side runs per round (default 0.5)")


def run(args) -> int:
    return run_demo(args.model, args.config, rounds=args.rounds, round_s=args.round_s)


def _max_err(a: Any, b: Any) -> float:
    import torch

    if isinstance(a, torch.Tensor):
        return (a.float() - b.float()).abs().max().item() if a.numel() else 0.0
    return max((_max_err(x, y) for x, y in zip(a, b)), default=0.0)


def run_demo(model_name: str = "gpt2_tiny", config: Any = None, rounds: int = 5,
             round_s: float = 0.5) -> int:
    import torch

    from ..arbiter import Arbiter
    from .examples import load_model
    from .report import named, write_text
    from .timing import comparison, interleaved

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
        write_text(named(be.report(), model_name, config))
        for _ in range(3):  # warm up both
            model(*inputs)
            compiled(*inputs)
        timed, load = interleaved({"eager": lambda: model(*inputs),
                                   "arbiter": lambda: compiled(*inputs)},
                                  rounds=rounds, round_s=round_s)
    print("\n-- " + comparison(timed, load, "eager", "arbiter",
                               note=f", {torch.get_num_threads()} torch threads"))

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
    write_text(named(report, model_name, config))
    used = sorted({p.backend for g in report.graphs for p in g.partitions})
    print(f"\nbackends that ran partitions: {', '.join(used)}")
    ok = err < 1e-3 and gerr < 1e-3
    print("demo " + ("OK: outputs and gradients match eager" if ok else "FAILED: mismatch vs eager"))
    return 0 if ok else 1
