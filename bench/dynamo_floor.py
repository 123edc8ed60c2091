"""torch.compile's own per-call cost on the varying-length encoder, warm and after real work.

    .venv/bin/python bench/dynamo_floor.py [--rounds 9] [--calls 100]

bench/dynamic_shapes.py's model (transformers BertModel, hidden 256, 4 layers; batch 4,
length 32, eval, no_grad), compiled by backends that compute nothing at call time: the
graph's outputs are computed once at compile time and returned on every call. What such
a call costs is the least any ``torch.compile`` backend, arbiter included, adds to a call:

* ``dynamo+const``: Dynamo's frame evaluation and guards around the precomputed outputs;
* ``dynamo+aot+const``: the same behind AOTAutograd's runtime wrapper (arbiter lowers
  through AOTAutograd);
* each also under ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)`` (PyTorch's
  own opt-in: only the guards that tell compiled graphs apart run; the user's choice, never
  arbiter's).

Each is timed two ways: ``warm``, calls back to back (what a micro-benchmark sees), and
``after work``, each call right after the model's eager forward at length 128 (what a
serving loop sees: the previous request's compute has taken the caches). Medians and
minimums over ``--rounds`` rounds of ``--calls`` calls, the variants taking turns.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def const_backend(with_aot: bool):
    import torch

    def backend(gm, example_inputs):
        if not with_aot:
            with torch.no_grad():
                outs = gm(*example_inputs)
            return lambda *a: outs

        from torch._functorch.aot_autograd import aot_module_simplified

        def fw(g, ex):
            with torch.no_grad():
                outs = g(*ex)
            return lambda *a: outs
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw)
    return backend


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--one", choices=["dynamo+const", "dynamo+aot+const"],
                    help="this backend only, in this process (else each in its own)")
    a = ap.parse_args()
    if a.one is None:  # one process each: one Dynamo cache holding one compiled frame
        import subprocess

        load0 = os.getloadavg()
        print(f"# bench/dynamo_floor.py, {a.threads} threads, {a.rounds} rounds of "
              f"{a.calls} calls; load average {load0[0]:.2f} at the start")
        print("| variant | median us | min us |")
        print("|---|---:|---:|")
        for one in ("dynamo+const", "dynamo+aot+const"):
            subprocess.run([sys.executable, __file__, "--one", one, "--rounds", str(a.rounds),
                            "--calls", str(a.calls), "--threads", str(a.threads)], check=True)
        print(f"load average {os.getloadavg()[0]:.2f} at the end")
        return 0
    warnings.simplefilter("ignore")
    import torch

    from dynamic_shapes import build_model

    torch.set_num_threads(a.threads)
    model, inputs = build_model()
    x, work_x = inputs[32], inputs[128]
    with torch.no_grad():
        c = torch.compile(model, backend=const_backend(a.one == "dynamo+aot+const"),
                          dynamic=False)
        c(x)
        variants = {f"{a.one}{' skip_guard_eval_unsafe' if skip else ''}, "
                    f"{'after work' if after else 'warm'}": (skip, after)
                    for skip in (False, True) for after in (False, True)}
        samples = {k: [] for k in variants}
        t = time.perf_counter()
        model(work_x)
        work_ms = (time.perf_counter() - t) * 1e3
        for r in range(a.rounds):
            keys = list(variants)
            keys = keys[r % len(keys):] + keys[:r % len(keys)]
            for k in keys:
                skip, after = variants[k]
                with torch.compiler.set_stance(skip_guard_eval_unsafe=skip):
                    c(x)
                    ts = []
                    for _ in range(a.calls):
                        if after:
                            model(work_x)
                        s = time.perf_counter_ns()
                        c(x)
                        ts.append(time.perf_counter_ns() - s)
                samples[k].append((statistics.median(ts), min(ts)))
    for k, v in samples.items():
        print(f"| {k} (work between calls {work_ms:.0f} ms) | "
              f"{statistics.median(m for m, _ in v) / 1e3:.0f} | "
              f"{min(m for _, m in v) / 1e3:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
