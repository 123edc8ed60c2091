"""A model the user quantized with PyTorch's PT2E flow (torchao's prepare_pt2e /
convert_pt2e, X86InductorQuantizer, static activation quantization, four random
calibration batches), run by what a user would pick, interleaved in one process:

  eager              the converted model as it is (its quantize/dequantize ops in eager,
                     float compute between)
  inductor           torch.compile(converted) (Inductor's default)
  inductor:freezing  the same with torch._inductor.config.freezing = True (the PT2E X86
                     recipe: oneDNN int8 kernels)
  arbiter:onnxruntime / arbiter:openvino / arbiter:inductor   one backend alone
                     (`against_eager: off`: the backend runs the graph whatever eager does)
  arbiter:default / arbiter:cpu_all   the shipped configs

Models (random weights): cnn (conv-relu x2, pool, linear; 8x3x32x32), mlp (256-512-512-10;
32x256), resnet50 (transformers' ResNet-50; 1x3x224x224), bert (transformers' BertModel, base size:
12 layers, hidden 768; 1x128 tokens).

Each model runs in its own process with empty arbiter and Inductor caches (pin the
calibration with ARBITER_CALIBRATION, or the first arbiter variant also calibrates). Printed per
variant: its first call (compile) in s, the median call over ``--rounds`` interleaved
rounds of ``--calls`` calls, the ratio of the fastest of Inductor with freezing, ONNX
Runtime alone and OpenVINO alone to it (>= 1.0: at least as fast as the best of them;
each variant's calls in a round follow one untimed call, as arbiter's own timing does,
and the variants take their turns in a new (seeded) order every round),
the converted eager's time over it, the largest difference from the converted eager in
units of the model's last activation quantization step, top-1 agreement (classifiers),
and what ran where (arbiter).

    .venv/bin/python bench/quantized.py [--models cnn mlp resnet50 bert] [--rounds 7]
        [--calls 10] [--variants ...] [--dynamic]

``--dynamic``: activations quantized with parameters chosen at run time
(``is_dynamic=True``: ``choose_qparams.tensor`` and the ``.tensor`` overloads); the
difference column is then the largest difference over the largest output.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

VARIANTS = ["eager", "inductor", "inductor:freezing", "arbiter:onnxruntime",
            "arbiter:openvino", "arbiter:inductor", "arbiter:default", "arbiter:cpu_all"]
MODELS = ["cnn", "mlp", "resnet50", "bert"]
#: the single-backend alternatives the issue's target compares with
BEST_OF = ("inductor:freezing", "arbiter:onnxruntime", "arbiter:openvino")


def build(name: str):
    import torch
    from torch import nn

    torch.manual_seed(0)
    if name == "cnn":
        class CNN(nn.Module):
            def __init__(self):
                super().__init__()
                self.c1 = nn.Conv2d(3, 16, 3, padding=1)
                self.c2 = nn.Conv2d(16, 32, 3, padding=1)
                self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(32, 10)

            def forward(self, x):
                x = torch.relu(self.c2(torch.relu(self.c1(x))))
                return self.fc(torch.flatten(self.pool(x), 1))

        return CNN(), torch.randn(8, 3, 32, 32)
    if name == "mlp":
        return (nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                              nn.Linear(512, 10)), torch.randn(32, 256))
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from arbiter.cli.examples import _HFOutput

    if name == "resnet50":
        from transformers import ResNetConfig, ResNetForImageClassification

        # transformers' default ResNetConfig is ResNet-50 (bottleneck 3-4-6-3, 1000 labels)
        return (_HFOutput(ResNetForImageClassification(ResNetConfig(num_labels=1000)),
                          "pixel_values", "logits"), torch.randn(1, 3, 224, 224))
    if name == "bert":
        from transformers import BertConfig, BertModel

        model = _HFOutput(BertModel(BertConfig(), add_pooling_layer=False), "input_ids",
                          "last_hidden_state")
        return model, torch.randint(0, 30522, (1, 128))
    raise SystemExit(f"unknown model {name!r}; one of {MODELS}")


def quantize(model, x, dynamic: bool = False):
    """``model`` through torchao's PT2E flow (X86InductorQuantizer, static; ``dynamic``:
    activations quantized with parameters chosen at run time)."""
    import torch
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = xiq.X86InductorQuantizer()
    quantizer.set_global(xiq.get_default_x86_inductor_quantization_config(is_dynamic=dynamic))
    prepared = prepare_pt2e(torch.export.export(model.eval(), (x,)).module(), quantizer)
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        prepared(x if x.dtype != torch.float32 else torch.randn(x.shape, generator=g))
    return convert_pt2e(prepared)


def last_step(converted) -> float:
    qs = [n for n in converted.graph.nodes if n.op == "call_function"
          and "quantize_per_tensor" in str(n.target) and "dequantize" not in str(n.target)]
    return float(qs[-1].args[1]) if qs else float("nan")


def make(variant: str, converted):
    import torch

    if variant == "eager":
        return converted, None
    if variant in ("inductor", "inductor:freezing"):
        torch._inductor.config.freezing = variant.endswith("freezing")
        return torch.compile(converted), None
    import arbiter

    name = variant.split(":", 1)[1]
    config = name if name in ("default", "cpu_all") else {"backends": [name],
                                                         "against_eager": "off"}
    be = arbiter.Arbiter(config)
    return torch.compile(converted, backend=be), be


def one(name: str, variants: list[str], rounds: int, calls: int, dynamic: bool) -> dict:
    import torch

    warnings.filterwarnings("ignore")
    model, x = build(name)
    start = time.perf_counter()
    with torch.no_grad():
        converted = quantize(model, x, dynamic)
    quant_s = time.perf_counter() - start
    # dynamic quantization has no fixed step: differences relative to the largest output
    step = last_step(converted) if not dynamic else float(converted(x).abs().max())
    out: dict = {"model": name, "quantize_s": quant_s, "step": step, "rows": {}}
    fns = {}
    with torch.no_grad():
        expected = converted(x)
        for v in variants:
            try:
                # a copy each: its own forward code, so no variant's Dynamo cache entry
                # (and guards) sits before another's
                fn, be = make(v, copy.deepcopy(converted))
                start = time.perf_counter()
                got = fn(x)
                first = time.perf_counter() - start
                fn(x)  # the installed placement (a timed first call chose it)
            except Exception as exc:  # noqa: BLE001 - a bench row says it failed
                out["rows"][v] = {"failed": f"{type(exc).__name__}: {str(exc)[:200]}"}
                continue
            torch._inductor.config.freezing = False
            row = {"first_s": first, "diff_steps": float((got - expected).abs().max()) / step,
                   "times": []}
            if expected.dim() == 2:
                row["top1"] = float((got.argmax(1) == expected.argmax(1)).float().mean())
            if be is not None:
                rep = be.report(advice=False)
                row["ran"] = "; ".join(
                    ", ".join(f"{p.backend}{' int8' if p.quantized else ''}"
                              for p in g.partitions) for g in rep.graphs)
                row["warnings"] = [w[:160] for g in rep.graphs for w in g.warnings]
            out["rows"][v] = row
            fns[v] = fn
        order = random.Random(0)
        for _ in range(rounds):
            # a new order each round: what a variant's calls follow changes its time
            # (OpenVINO's workers still spin after its run; the variant after it lost
            # 0.1-0.2 ms of a 1 ms call in a fixed order), so no variant always follows
            # the same one
            names = list(fns)
            order.shuffle(names)
            for v in names:
                fn = fns[v]
                fn(x)  # untimed: takes what the variant before left (spinning threads)
                start = time.perf_counter()
                for _ in range(calls):
                    fn(x)
                out["rows"][v]["times"].append((time.perf_counter() - start) / calls * 1e3)
    for r in out["rows"].values():
        if r.get("times"):
            r["ms"] = statistics.median(r.pop("times"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--variants", nargs="+", default=VARIANTS)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--dynamic", action="store_true",
                    help="quantize activations dynamically (X86InductorQuantizer is_dynamic)")
    ap.add_argument("--one", metavar="MODEL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(args.one, args.variants, args.rounds, args.calls,
                                         args.dynamic)), flush=True)
        return 0
    print(f"load average at start: {os.getloadavg()}", flush=True)
    diff = "max diff / max output" if args.dynamic else "max diff (steps)"
    print("| model | variant | first call s | ms per call (median) | best single / it | "
          f"converted eager / it | {diff} | top-1 agree |")
    print("|---|---|---:|---:|---:|---:|---:|---:|", flush=True)
    for name in args.models:
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "ARBITER_CACHE_DIR": os.path.join(tmp, "arbiter"),
                   "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor")}
            proc = subprocess.run([sys.executable, __file__, "--one", name, "--variants",
                                   *args.variants, "--rounds", str(args.rounds), "--calls",
                                   str(args.calls), *(["--dynamic"] if args.dynamic else [])],
                                  env=env, capture_output=True,
                                  text=True, timeout=3600)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not line:
            print(f"| {name} | - | failed: {proc.stderr.strip()[-300:]} |", flush=True)
            continue
        res = json.loads(line[0][7:])
        rows = res["rows"]
        best = min((rows[v]["ms"] for v in BEST_OF if "ms" in rows.get(v, {})), default=None)
        eager = rows.get("eager", {}).get("ms")
        for v, r in rows.items():
            if "failed" in r:
                print(f"| {name} | {v} | failed: {r['failed']} |")
                continue
            ratio = f"{best / r['ms']:.2f}x" if best else "-"
            vs_eager = f"{eager / r['ms']:.2f}x" if eager else "-"
            top1 = f"{r['top1']:.0%}" if "top1" in r else "-"
            print(f"| {name} | {v} | {r['first_s']:.1f} | {r['ms']:.3f} | {ratio} | "
                  f"{vs_eager} | {r['diff_steps']:.2g} | {top1} |", flush=True)
        print(f"  {name}: quantized in {res['quantize_s']:.1f} s, last step {res['step']:.3g}")
        for v, r in rows.items():
            if r.get("ran"):
                print(f"  {name} {v}: {r['ran']}"
                      + (f"; warnings: {r['warnings']}" if r.get("warnings") else ""))
    print(f"load average at end: {os.getloadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
