"""What the frozen-weights guard (arbiter/run/freeze.py) costs per call, and what freezing buys.

For each model, compiled under the default config (inference, ``torch.no_grad``):

* ``guard us``: ``WeightGuard.matches`` on the real arguments of a call (median of
  rounds of many checks): two attribute reads per frozen weight, plus a value
  comparison per small buffer;
* ``call ms``: the whole compiled call (Dynamo, AOTAutograd, guard, pieces);
* ``share``: guard / call;
* ``unguarded ms``: the same compiled call with the check skipped (``FrozenGraph``'s
  check patched out in this process only), timed in turns with the guarded call; the
  difference is the guard's cost seen end to end (noise included);
* ``weights as inputs ms``: the same model under ``freeze_weights: false``, timed in
  the same rounds: what a graph pays once it stops freezing (``refreeze_limit``).

    .venv/bin/python bench/freeze_guard.py [--models mlp bert_base resnet50] [--rounds 7]
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import arbiter  # noqa: E402
from arbiter.cli import examples  # noqa: E402
from arbiter.run.freeze import WeightGuard  # noqa: E402


def per_call_s(fn, target_s: float) -> float:
    fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        if time.perf_counter() - t0 > target_s:
            return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "bert_base", "resnet50"])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    factories = {**examples.EXAMPLES, **examples.ZOO}
    print(f"load average at start: {os.getloadavg()}")
    rows = []
    for name in args.models:
        model, inputs = factories[name]()
        model.eval()
        seen: list = []
        orig = WeightGuard.matches

        def spy(self, a, _orig=orig):
            seen.append((self, a))
            return _orig(self, a)

        torch._dynamo.reset()
        with torch.no_grad():
            WeightGuard.matches = spy
            frozen = torch.compile(model, backend=arbiter.Arbiter(None))
            frozen(*inputs)
            WeightGuard.matches = orig
            guard, call_args = seen[-1]
            loose = torch.compile(model, backend=arbiter.Arbiter(
                arbiter.load_config(None).model_copy(update={"freeze_weights": False})))
            loose(*inputs)
            target = 0.3 if name == "mlp" else 2.0
            guard_s, call_s, skip_s, loose_s = [], [], [], []
            skip = lambda self, a: True  # noqa: E731
            for _ in range(args.rounds):
                guard_s.append(per_call_s(lambda: guard.matches(call_args), 0.2))
                call_s.append(per_call_s(lambda: frozen(*inputs), target))
                WeightGuard.matches = skip
                skip_s.append(per_call_s(lambda: frozen(*inputs), target))
                WeightGuard.matches = orig
                loose_s.append(per_call_s(lambda: loose(*inputs), target))
        med = statistics.median
        g, c, s, lo = med(guard_s) * 1e6, med(call_s) * 1e3, med(skip_s) * 1e3, med(loose_s) * 1e3
        rows.append((name, len(guard.positions), len(guard._valued), g, c, g / (c * 1e3), s, lo))
    print(f"load average at end: {os.getloadavg()}")
    print("| model | frozen weights | buffers checked by value | guard us | call ms | share "
          "| unguarded ms | weights as inputs ms (vs frozen) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, n, v, g, c, share, s, lo in rows:
        print(f"| {name} | {n} | {v} | {g:.1f} | {c:.3f} | {share:.2%} | {s:.3f} | "
              f"{lo:.3f} ({lo / c:.2f}x) |")


if __name__ == "__main__":
    main()
