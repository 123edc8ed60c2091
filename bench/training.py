"""One training step (forward, backward, optimizer step) of three small models: eager,
Inductor (`torch.compile` default), arbiter's `default` and `cpu_all` configs, and the
default config with one key changed (``OVER_DEFAULT``): `arbiter:measure` (policy
`measure`), `arbiter:untimed` (`against_eager: off`: the priority plan untimed, as the
default was before) and `arbiter:random_backend` (`random: backend`: dropout drawn by a
backend, so its first loss differs from eager's by the draws), `arbiter:spin`
(`resources: {spin: onnxruntime}`: ONNX Runtime's global pool spinning, the default's
setting before 2026-11-24).

Models (train mode: dropout on, batch norm with batch statistics; random weights):
  bert    transformers' BertModel, hidden 256, 4 layers, 4 heads, seq 128, batch 8
  gpt2    transformers' GPT2Model, 256 wide, 4 layers, 4 heads, seq 128, batch 8
  resnet18  transformers' ResNet (basic blocks 2-2-2-2), 64x64, batch 8

Each (model, variant) runs in its own process (peak RSS is the process's `ru_maxrss`),
with empty arbiter and Inductor caches (`ARBITER_CACHE_DIR`, `TORCHINDUCTOR_CACHE_DIR`):
the first step (compiles) is timed alone, then `--steps` steps, of which the median is
the step time. The loss is the mean square of the model's output; SGD with momentum.
The first step's loss is checked against eager's (same seed, dropout aside: dropout's
draws are eager's in every variant but Inductor's, so only arbiter's must match).

    .venv/bin/python bench/training.py [--models bert gpt2 resnet18] [--steps 5] [--background]
        [--variants eager inductor arbiter:default arbiter:untimed arbiter:cpu_all
                    arbiter:measure arbiter:random_backend] [--interleaved] [--settle N]

``--interleaved``: every variant in one process instead (a copy of the model each, same
weights), compiled one after another (first step timed alone), then ``--steps`` rounds of
one step of each in turn, so a busy machine's swings fall on all alike (between
processes this VM's eager step moved 185-305 ms within minutes); the steps' median per
variant after ``--settle`` rounds left out (arbiter's step check, run/step.py, alternates
routes on its first ~14 calls). No peak RSS in this mode (one process).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = ["eager", "inductor", "arbiter:default", "arbiter:untimed", "arbiter:cpu_all",
            "arbiter:measure", "arbiter:random_backend"]
#: arbiter variants that are the default config with these keys replaced
OVER_DEFAULT = {"measure": {"policy": "measure"}, "untimed": {"against_eager": "off"},
                "random_backend": {"random": "backend"},
                "spin": {"resources": {"spin": "onnxruntime"}}}
MODELS = ["bert", "gpt2", "resnet18"]


def build(name: str):
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from arbiter.cli.examples import _HFOutput

    torch.manual_seed(0)
    if name == "bert":
        from transformers import BertConfig, BertModel

        cfg = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                         intermediate_size=1024, vocab_size=1000)
        model = _HFOutput(BertModel(cfg, add_pooling_layer=False), "input_ids",
                          "last_hidden_state")
        x = torch.randint(0, 1000, (8, 128))
    elif name == "gpt2":
        from transformers import GPT2Config, GPT2Model

        cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=1000, n_positions=128,
                         bos_token_id=0, eos_token_id=0)
        model = _HFOutput(GPT2Model(cfg), "input_ids", "last_hidden_state")
        x = torch.randint(0, 1000, (8, 128))
    elif name == "resnet18":
        from transformers import ResNetConfig, ResNetModel

        cfg = ResNetConfig(depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                           layer_type="basic", embedding_size=64)
        model = _HFOutput(ResNetModel(cfg), "pixel_values", "pooler_output")
        x = torch.randn(8, 3, 64, 64)
    else:
        raise SystemExit(f"unknown model {name!r}; one of {MODELS}")
    return model.train(), x


def time_steps(fn, model, x, steps: int, sync=lambda: None) -> tuple[float, float, list]:
    """A first step (it compiles) and ``steps`` more, each after ``sync()`` (DDP: a
    barrier): ``zero_grad``, ``fn(x).pow(2).mean()``, backward, SGD with momentum on
    ``model``'s parameters. Returns (first step s, its loss, the other steps' s)."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = fn(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss.item()

    torch.manual_seed(1)
    sync()
    start = time.perf_counter()
    first_loss = step()
    first = time.perf_counter() - start
    times = []
    for _ in range(steps):
        sync()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return first, first_loss, times


def compiled(model, variant: str):
    """``model`` as ``variant`` runs it; the Arbiter too (None but for arbiter's)."""
    import torch

    if variant == "eager":
        return model, None
    if variant == "inductor":
        return torch.compile(model), None
    if not variant.startswith("arbiter:"):
        raise SystemExit(f"unknown variant {variant!r}; one of {VARIANTS}")
    import arbiter

    config = variant.split(":", 1)[1]
    if config in OVER_DEFAULT:
        import yaml

        from arbiter.config import shipped_configs

        data = yaml.safe_load(shipped_configs()["default"].read_text())
        config = {**data, **OVER_DEFAULT[config]}
    be = arbiter.Arbiter(config)
    return torch.compile(model, backend=be), be


def ran_where(be) -> str:
    """What ran where: kind -> backends (timed choice; the step check's route)."""
    return "; ".join(
        f"{g.kind}: {'+'.join(sorted({p.backend for p in g.partitions}))}"
        + (f" ({g.chosen} {', '.join(f'{k} {v:.0f} ms' for k, v in g.candidates_ms.items() if v is not None)})"
           if g.chosen else "")
        + (f" [step: {g.step.route}"
           + "".join(f", {k} {v:.0f} ms" for k, v in g.step.ms.items()) + "]"
           if g.step is not None and g.kind == "forward" else "")
        for g in be.report(advice=False).graphs)


def _interleaved(args) -> int:
    import copy

    import torch

    print(f"load average at start: {os.getloadavg()}; one process, steps interleaved, "
          f"median of {args.steps - args.settle} rounds after {args.settle}", flush=True)
    for name in args.models:
        model, x = build(name)
        runs = {}
        for variant in args.variants:
            m = copy.deepcopy(model)
            fn, be = compiled(m, variant)
            opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
            runs[variant] = (fn, opt, be, [])

        def step(fn, opt) -> float:
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            fn(x).pow(2).mean().backward()
            opt.step()
            return time.perf_counter() - start

        first = {v: step(fn, opt) for v, (fn, opt, _, _) in runs.items()}
        for _ in range(args.steps):
            for fn, opt, _, times in runs.values():
                times.append(step(fn, opt))
        med = {v: statistics.median(r[3][args.settle:]) * 1e3 for v, r in runs.items()}
        best = min(med[v] for v in ("eager", "inductor") if v in med) \
            if any(v in med for v in ("eager", "inductor")) else None
        print("| model | variant | first step s | step ms (median) [min-max] | speed vs the "
              "faster of eager/Inductor (>1: faster) |")
        print("|---|---|---:|---:|---:|")
        for v, (_, _, be, times) in runs.items():
            kept = times[args.settle:]
            print(f"| {name} | {v} | {first[v]:.1f} | {med[v]:.1f} [{min(kept) * 1e3:.1f}-"
                  f"{max(kept) * 1e3:.1f}] | "
                  + (f"{best / med[v]:.2f}x" if best else "-") + " |", flush=True)
        for v, (_, _, be, _) in runs.items():
            if be is not None:
                print(f"  {name} {v}: {ran_where(be)}", flush=True)
    print(f"load average at end: {os.getloadavg()}", flush=True)
    return 0


def one(name: str, variant: str, steps: int) -> dict:
    model, x = build(name)
    fn, be = compiled(model, variant)
    first, first_loss, times = time_steps(fn, model, x, steps)
    ran = ran_where(be) if be is not None else ""
    return {"model": name, "variant": variant, "first_s": first, "ran": ran,
            "step_ms": statistics.median(times) * 1e3,
            "step_spread_ms": [min(times) * 1e3, max(times) * 1e3],
            "first_loss": first_loss,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


#: A deliberate background load (``--background``): a second process multiplying
#: matrices on one thread until the bench ends (half of a 2-core machine).
BACKGROUND = ("import torch\ntorch.set_num_threads(1)\na = torch.randn(512, 512)\n"
              "while True:\n    a = torch.tanh(a @ a)\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--variants", nargs="+", default=VARIANTS)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--background", action="store_true",
                    help="run beside a second process's matmul loop on one thread")
    ap.add_argument("--interleaved", action="store_true",
                    help="every variant in one process, steps interleaved")
    ap.add_argument("--settle", type=int, default=0,
                    help="--interleaved: rounds left out of the median")
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(*args.one, args.steps)), flush=True)
        return 0
    background = subprocess.Popen([sys.executable, "-c", BACKGROUND]) \
        if args.background else None
    try:
        return _interleaved(args) if args.interleaved else _bench(args)
    finally:
        if background is not None:
            background.kill()


def _bench(args) -> int:
    print(f"load average at start: {os.getloadavg()}"
          + ("; a background matmul loop on one thread runs beside" if args.background
             else ""), flush=True)
    print("| model | variant | first step s | step ms (median) [min-max] | vs faster of "
          "eager/Inductor | peak RSS MB | first loss |")
    print("|---|---|---:|---:|---:|---:|---:|", flush=True)
    for name in args.models:
        rows = {}
        for variant in args.variants:
            # cold compiles: fresh arbiter and Inductor caches for every process
            with tempfile.TemporaryDirectory() as tmp:
                env = {**os.environ, "ARBITER_CACHE_DIR": os.path.join(tmp, "arbiter"),
                       "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor")}
                proc = subprocess.run([sys.executable, __file__, "--one", name, variant,
                                       "--steps", str(args.steps)], env=env,
                                      capture_output=True, text=True, timeout=900)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode != 0 or not line:
                print(f"| {name} | {variant} | failed: {proc.stderr.strip()[-300:]} |")
                continue
            rows[variant] = json.loads(line[0][7:])
        base = [rows[v]["step_ms"] for v in ("eager", "inductor") if v in rows]
        best = min(base) if base else None
        for variant, r in rows.items():
            ratio = f"{r['step_ms'] / best:.2f}x" if best else "-"
            print(f"| {name} | {variant} | {r['first_s']:.1f} | {r['step_ms']:.1f} "
                  f"[{r['step_spread_ms'][0]:.1f}-{r['step_spread_ms'][1]:.1f}] | {ratio} | "
                  f"{r['peak_rss_mb']:.0f} | {r['first_loss']:.6f} |", flush=True)
        for variant, r in rows.items():
            if r.get("ran"):
                print(f"  {name} {variant}: {r['ran']}", flush=True)
    print(f"load average at end: {os.getloadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
