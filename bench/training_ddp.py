"""One DDP training step (forward, backward, SGD), 2 processes, gloo, on CPU: eager DDP,
Inductor DDP (`torch.compile(ddp)`) and arbiter's `default` config
(`torch.compile(ddp, backend=arbiter.Arbiter("default"))`), in one run.

Model (train mode, random weights): transformers' BertModel, hidden 256, `--layers` (2)
layers, 4 heads, seq 128, batch 4 per rank (each rank its own data); the loss is the mean
square of the last hidden state. DDP with `--bucket-mb` (4) MB buckets, so Dynamo's
DDPOptimizer cuts the compiled graph at bucket boundaries and calls the backend per
bucket. One thread per rank (`torch.set_num_threads(1)`): two ranks, two cores.

Each variant runs in its own process pair with empty arbiter and Inductor caches (cold
compiles): the first step is timed alone, then `--steps` steps, whose median is the step
time; times are rank 0's (the ranks meet in every all-reduce). The first step's loss is
checked against eager's (same seed; arbiter keeps eager's dropout draws, Inductor not).

    .venv/bin/python bench/training_ddp.py [--layers 2] [--steps 5] [--bucket-mb 4]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from training import time_steps  # this directory: the same step as training.py's

VARIANTS = ["eager", "inductor", "arbiter:default"]
WORLD = 2


def build(layers: int, rank: int):
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from transformers import BertConfig, BertModel

    from arbiter.cli.examples import _HFOutput

    torch.manual_seed(0)  # the same weights on every rank
    cfg = BertConfig(hidden_size=256, num_hidden_layers=layers, num_attention_heads=4,
                     intermediate_size=1024, vocab_size=1000)
    model = _HFOutput(BertModel(cfg, add_pooling_layer=False), "input_ids",
                      "last_hidden_state")
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    x = torch.randint(0, 1000, (4, 128), generator=gen)
    return model.train(), x


def rank_main(rank: int, store: str, out: str, variant: str, layers: int, steps: int,
              bucket_mb: float) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(minutes=10))
    try:
        model, x = build(layers, rank)
        ddp = DDP(model, bucket_cap_mb=bucket_mb)
        if variant == "eager":
            fn = ddp
        elif variant == "inductor":
            fn = torch.compile(ddp)
        else:  # arbiter:NAME, or arbiter:NAME:threads=N (config `resources.threads`)
            import arbiter
            from arbiter.config import load_config

            _, name, *threads = variant.split(":")
            config = load_config(name)
            if threads:
                config = config.model_copy(update={"resources": config.resources.model_copy(
                    update={"threads": int(threads[0].split("=")[1])})})
            fn = torch.compile(ddp, backend=arbiter.Arbiter(config))
        first, first_loss, times = time_steps(fn, model, x, steps, sync=dist.barrier)
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"variant": variant, "first_s": first,
                           "step_ms": statistics.median(times) * 1e3,
                           "step_spread_ms": [min(times) * 1e3, max(times) * 1e3],
                           "first_loss": first_loss}, f)
    finally:
        dist.destroy_process_group()


def one(variant: str, layers: int, steps: int, bucket_mb: float) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        mp.spawn(rank_main, args=(os.path.join(tmp, "store"), out, variant, layers, steps,
                                  bucket_mb), nprocs=WORLD, join=True)
        with open(out) as f:
            return json.load(f)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", nargs="+", default=VARIANTS)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--bucket-mb", type=float, default=4.0)
    ap.add_argument("--one", metavar="VARIANT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(args.one, args.layers, args.steps, args.bucket_mb)),
              flush=True)
        return 0
    print(f"load average at start: {os.getloadavg()}", flush=True)
    rows = {}
    for variant in args.variants:
        # cold compiles: fresh arbiter and Inductor caches for every variant
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "ARBITER_CACHE_DIR": os.path.join(tmp, "arbiter"),
                   "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor")}
            proc = subprocess.run([sys.executable, __file__, "--one", variant, "--layers",
                                   str(args.layers), "--steps", str(args.steps),
                                   "--bucket-mb", str(args.bucket_mb)], env=env,
                                  capture_output=True, text=True, timeout=900)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not line:
            print(f"{variant}: failed: {proc.stderr.strip()[-600:]}", flush=True)
            continue
        rows[variant] = json.loads(line[0][7:])
        print(f"{variant}: done", flush=True)
    base = [rows[v]["step_ms"] for v in ("eager", "inductor") if v in rows]
    best = min(base) if base else None
    print(f"\nBERT {args.layers} layers, hidden 256, seq 128, batch 4 per rank, DDP 2 ranks "
          f"(gloo, 1 thread each), buckets {args.bucket_mb} MB, {args.steps} steps\n")
    print("| variant | first step s | step ms (median) [min-max] | vs faster of "
          "eager/Inductor | first loss (rank 0) |")
    print("|---|---:|---:|---:|---:|")
    for variant, r in rows.items():
        ratio = f"{r['step_ms'] / best:.2f}x" if best else "-"
        print(f"| {variant} | {r['first_s']:.1f} | {r['step_ms']:.1f} "
              f"[{r['step_spread_ms'][0]:.1f}-{r['step_spread_ms'][1]:.1f}] | {ratio} | "
              f"{r['first_loss']:.6f} |", flush=True)
    print(f"load average at end: {os.getloadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
