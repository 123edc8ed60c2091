"""What the first-use checks cost (verify mode `unverified`, the default) on the zoo.

    .venv/bin/python bench/first_use_cost.py                      # every zoo model, both configs
    .venv/bin/python bench/first_use_cost.py --models mlp bert_base --configs default

For each zoo model (arbiter.cli.examples.ZOO: eval, batch 1, float32) and config, two
processes, each with a fresh cache directory: ``verify: {mode: off}`` (the manifests'
declarations trusted) and ``verify: {mode: unverified}``. Each times the first call
(trace, plan, compile, and the check when there is one) and the median of 20 later calls,
and says which partitions were checked, with what result, and what fell back. The two
runs' first calls differ by the check's cost (an eager run of each checked partition on
copies of its inputs and a second call of its backend); the steady state must not move.
Results are written to stdout as a markdown table with the machine's load.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r'''
import json, statistics, sys, time, torch, arbiter
from arbiter.cli.examples import ZOO
from arbiter.config import load_config
model_name, config, mode = sys.argv[1:4]
model, args = ZOO[model_name]()
cfg = load_config(config).model_dump(exclude={"source"})
cfg["verify"] = dict(cfg.get("verify") or {}, mode=mode)
be = arbiter.Arbiter(cfg)
compiled = torch.compile(model, backend=be)
with torch.no_grad():
    start = time.perf_counter()
    out = compiled(*args)
    first = time.perf_counter() - start
    times = []
    for _ in range(20):
        start = time.perf_counter()
        compiled(*args)
        times.append(time.perf_counter() - start)
    err = float((out - model(*args)).abs().max())
parts = [p for g in be.report().graphs for p in g.partitions]
print(json.dumps({
    "first_s": first, "steady_ms": statistics.median(times) * 1e3, "max_error": err,
    "checks": [f"{c.backend}: {c.result} ({len(c.unverified)} unverified)"
               + (f", {c.detail}" if c.detail else "") for p in parts for c in p.first_use],
    "fallbacks": [f"{f.from_backend}->{f.to_backend} at {f.stage}" for p in parts
                  for f in p.fallbacks],
    "ran": sorted({p.backend or "" for p in parts})}))
'''


def run(model: str, config: str, mode: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="first-use-") as cache:
        env = {**os.environ, "ARBITER_CACHE_DIR": cache}
        out = subprocess.run([sys.executable, "-c", _CHILD, model, config, mode],
                             capture_output=True, text=True, env=env, timeout=timeout,
                             cwd=ROOT)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1][:200] if out.stderr else "failed"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    from arbiter.cli.examples import ZOO

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(ZOO), choices=list(ZOO))
    ap.add_argument("--configs", nargs="+", default=["default", "cpu_all"])
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = os.getloadavg()
    rows = []
    for model in args.models:
        for config in args.configs:
            res = {mode: run(model, config, mode, args.timeout) for mode in ("off", "unverified")}
            rows.append((model, config, res))
            off, on = res["off"], res["unverified"]
            print(f"{model} {config}: " + json.dumps(res), file=sys.stderr, flush=True)
    load1 = os.getloadavg()
    print(f"Started {started}; load average {load0[0]:.2f} at start, {load1[0]:.2f} at end; "
          f"{os.cpu_count()} cores.\n")
    print("| model | config | first call, verify off | first call, unverified | steady ms off "
          "| steady ms unverified | checks | fallbacks |")
    print("|---|---|---:|---:|---:|---:|---|---|")
    for model, config, res in rows:
        off, on = res["off"], res["unverified"]
        if "error" in off or "error" in on:
            print(f"| {model} | {config} | {off.get('error', '')} | {on.get('error', '')} "
                  "| | | | |")
            continue
        print(f"| {model} | {config} | {off['first_s']:.1f} s | {on['first_s']:.1f} s "
              f"| {off['steady_ms']:.2f} | {on['steady_ms']:.2f} "
              f"| {'; '.join(on['checks']) or 'none'} | {'; '.join(on['fallbacks']) or 'none'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
