"""Cold vs warm compile with the persistent cache, in two fresh processes.

    .venv/bin/python bench/cache_warm.py [--models gpt2_tiny] [--policies priority measure]

For each (model, policy): a new empty cache directory; process 1 compiles and runs the
model once (cold), process 2 does the same with the same cache (warm). "Compile" is the
first call of the compiled model (Dynamo, AOTAutograd, planning, every piece's compile
and, under `measure`, the timing of the candidates), minus one eager call; "arbiter's
part" leaves out Dynamo's tracing (which no cache of ours can skip): the time in the
backend call (AOTAutograd, planning) plus the first call of what it returned (piece
compiles, measuring), less one eager run. Inductor's own
caches are pointed into the same fresh directory (TORCHINDUCTOR_CACHE_DIR), so the cold
process is cold for Inductor too. Target (issue 4): warm <= 10% of cold.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def worker(model_name: str, policy: str) -> None:
    import torch

    import arbiter
    from arbiter.cli.examples import EXAMPLES

    torch.set_num_threads(2)
    model, inputs = EXAMPLES[model_name]()
    model.eval()
    with torch.no_grad():
        model(*inputs)  # the first eager call pays one-time set-up; time the second
        t0 = time.perf_counter()
        ref = model(*inputs)
        eager_s = time.perf_counter() - t0
        be = arbiter.Arbiter({"backends": ["onnxruntime", "inductor"], "policy": policy})
        spent = [0.0]

        def backend(gm, example_inputs):
            # The backend's share: lowering and planning now, pieces' compiles (and
            # measure's timing) on the first call. Dynamo's own tracing is not in it.
            t = time.perf_counter()
            compiled = be(gm, example_inputs)
            spent[0] += time.perf_counter() - t
            first = [True]

            def call(*a):
                if not first[0]:
                    return compiled(*a)
                t = time.perf_counter()
                out = compiled(*a)
                spent[0] += time.perf_counter() - t - eager_s  # less the run itself
                first[0] = False
                return out
            return call

        fn = torch.compile(model, backend=backend)
        t0 = time.perf_counter()
        out = fn(*inputs)
        first = time.perf_counter() - t0
    err = (out - ref).abs().max().item() if isinstance(out, torch.Tensor) else None
    outcome = be.graphs[0].outcome
    print(json.dumps({"compile_s": first - eager_s, "backend_s": spent[0],
                      "hits": be.cache.hits if be.cache else 0,
                      "chosen": outcome.chosen or "priority", "max_err": err}))


def run(model: str, policy: str, cache_dir: str) -> dict:
    env = dict(os.environ, ARBITER_CACHE_DIR=cache_dir,
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache_dir, "inductor"))
    out = subprocess.run([sys.executable, __file__, "--worker", model, policy], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["gpt2_tiny"])
    ap.add_argument("--policies", nargs="*", default=["priority", "measure"])
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "POLICY"))
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker)
        return 0
    load = os.getloadavg()[0]
    print(f"load average {load:.2f} (2 cores, shared: timings are noisy)")
    print("| model | policy | first call cold s | warm s | warm/cold | arbiter's part cold s | "
          "warm s | warm/cold | cache hits (warm) | chosen | max err |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for model in args.models:
        for policy in args.policies:
            with tempfile.TemporaryDirectory(prefix="arbiter-cache-") as d:
                cold = run(model, policy, d)
                warm = run(model, policy, d)
            print(f"| {model} | {policy} | {cold['compile_s']:.2f} | {warm['compile_s']:.2f} | "
                  f"{warm['compile_s'] / cold['compile_s']:.1%} | {cold['backend_s']:.2f} | "
                  f"{warm['backend_s']:.2f} | {warm['backend_s'] / cold['backend_s']:.1%} | "
                  f"{warm['hits']} | "
                  f"{warm['chosen']} | {warm['max_err']:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
