"""Cold vs warm compile with the persistent cache, in two fresh processes.

    .venv/bin/python bench/cache_warm.py [--models gpt2_tiny] [--policies priority measure]
    .venv/bin/python bench/cache_warm.py --config default cpu_all --models bert_base resnet50
    .venv/bin/python bench/cache_warm.py --config cpu_all --policies measure --models distilbert

For each (model, config, policy): a new empty cache directory; process 1 compiles and runs
the model once (cold), process 2 does the same with the same cache (warm). "Compile" is
the first call of the compiled model (Dynamo, AOTAutograd, planning, every piece's compile
and, under `measure`, the timing of the candidates), minus one eager call; "arbiter's
part" leaves out Dynamo's tracing (which no cache of ours can skip): the time in the
backend call (AOTAutograd, planning) plus the first call of what it returned (piece
compiles, measuring), less one eager run. Inductor's own
caches are pointed into the same fresh directory (TORCHINDUCTOR_CACHE_DIR), so the cold
process is cold for Inductor too. Models: the zoo's (``arbiter.cli.examples.ZOO``) or the
examples'. ``--config``: shipped configs or YAML paths (default: ``backends: [onnxruntime,
inductor]``); ``--policies``: ``config`` keeps the config's own. "same placement": the
warm process's partitions (backend and node count of each, every graph) equal the cold
one's. Target: warm <= 10% of cold.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def _config(config: str, policy: str) -> dict:
    """The run's config: a shipped one or a YAML path (``-``: the historical
    ``backends: [onnxruntime, inductor]``), its policy replaced unless ``config``."""
    if config == "-":
        cfg: dict = {"backends": ["onnxruntime", "inductor"]}
    else:
        from arbiter.config import load_config

        cfg = load_config(config).model_dump(exclude={"source"}, exclude_unset=False)
    if policy != "config":
        cfg["policy"] = policy
    return cfg


def worker(model_name: str, config: str, policy: str) -> None:
    import torch

    import arbiter
    from arbiter.cli.examples import EXAMPLES, ZOO

    torch.set_num_threads(2)
    model, inputs = (ZOO.get(model_name) or EXAMPLES[model_name])()
    model.eval()
    with torch.no_grad():
        model(*inputs)  # the first eager call pays one-time set-up; time the second
        t0 = time.perf_counter()
        ref = model(*inputs)
        eager_s = time.perf_counter() - t0
        be = arbiter.Arbiter(_config(config, policy))
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
    placement = [[(p.backend, p.size) for p in g.plan.partitions] for g in be.graphs]
    print(json.dumps({"compile_s": first - eager_s, "backend_s": spent[0],
                      "hits": be.cache.hits if be.cache else 0,
                      "chosen": outcome.chosen or outcome.policy, "max_err": err,
                      "placement": placement, "policy": outcome.policy}))


def run(model: str, config: str, policy: str, cache_dir: str) -> dict:
    env = dict(os.environ, ARBITER_CACHE_DIR=cache_dir,
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache_dir, "inductor"))
    out = subprocess.run([sys.executable, __file__, "--worker", model, config, policy],
                         env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{model} {config} {policy}: the worker failed:\n"
                         f"{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _where(placement: list) -> str:
    """``onnxruntime 246`` per graph (backend and nodes of each partition)."""
    return "; ".join(", ".join(f"{b} {n}" for b, n in g) for g in placement)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["gpt2_tiny"])
    ap.add_argument("--config", nargs="*", default=["-"],
                    help="shipped configs or YAML paths (default: backends onnxruntime, "
                         "inductor)")
    ap.add_argument("--policies", nargs="*", default=None,
                    help="policies to run each config under; `config`: its own (default: "
                         "priority and measure without --config, else `config`)")
    ap.add_argument("--worker", nargs=3, metavar=("MODEL", "CONFIG", "POLICY"))
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker)
        return 0
    policies = args.policies or (["priority", "measure"] if args.config == ["-"]
                                 else ["config"])
    load = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"{started}; load average {load[0]:.2f} at the start (2 cores: timings are noisy)")
    print("| model | config | policy | first call cold s | warm s | warm/cold | arbiter's part "
          "cold s | warm s | warm/cold | cache hits (warm) | chosen | same placement | "
          "placement | max err |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|")
    for model in args.models:
        for config in args.config:
            for policy in policies:
                with tempfile.TemporaryDirectory(prefix="arbiter-cache-") as d:
                    cold = run(model, config, policy, d)
                    warm = run(model, config, policy, d)
                same = "yes" if cold["placement"] == warm["placement"] else \
                    f"**no** (cold: {_where(cold['placement'])})"
                print(f"| {model} | {'' if config == '-' else config} | {warm['policy']} | "
                      f"{cold['compile_s']:.2f} | {warm['compile_s']:.2f} | "
                      f"{warm['compile_s'] / cold['compile_s']:.1%} | {cold['backend_s']:.2f} | "
                      f"{warm['backend_s']:.2f} | {warm['backend_s'] / cold['backend_s']:.1%} | "
                      f"{warm['hits']} | {warm['chosen']} | {same} | "
                      f"{_where(warm['placement'])} | {warm['max_err']:.1e} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
