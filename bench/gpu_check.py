"""What arbiter's CUDA paths do on an NVIDIA GPU: placement, error against eager, speed.

A BERT encoder (transformers ``BertModel``, random weights, hidden 768, ``--layers``
layers, batch 8, sequence 128, eval, no_grad) on CUDA, float16 (and float32 where listed),
compiled by each contender in its own child process (a crash or hang in one backend
costs that row only, ``--case-timeout``):

* ``eager``: the model itself (every child also times eager in its own process, and the
  ratio ``vs eager`` is taken there);
* ``inductor``: ``torch.compile(model)`` (Inductor alone, as a user would run it);
* ``arbiter:NAME``: ``torch.compile(model, backend=Arbiter(config))`` with the configs
  below, ``against_eager: off`` so that what runs is the backends' own work; ``default``
  is the embedded default config with no options (CPU backends: on CUDA tensors they
  refuse every node, and what runs is what is left).

Each row: the first call's time (compile), the largest absolute error against eager in
the same dtype and against eager float32, the median of ``--iters`` calls (CUDA events
around each call after ``--warmup`` calls), and the placement read from the report
(compute nodes per backend, partitions, fallbacks with their reasons).

    python3 bench/gpu_check.py --out DIR [--layers 4] [--cases all] [--device cpu]

Writes DIR/gpu_check.json and prints a markdown table. Needs CUDA; without it every row
says so.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = {
    "inductor": {"backends": ["inductor"]},
    "tensorrt": {"backends": ["tensorrt"]},
    "triton+inductor": {"backends": ["triton", "inductor"]},
    "tensorrt+triton+inductor": {"backends": ["tensorrt", "triton", "inductor"]},
}
# (case, dtype) in the order they run: the ones a GPU must answer first
CASES = [
    ("arbiter:tensorrt", "float16"), ("arbiter:triton+inductor", "float16"),
    ("arbiter:inductor", "float16"), ("inductor", "float16"), ("arbiter:default", "float16"),
    ("arbiter:tensorrt+triton+inductor", "float16"), ("arbiter:tensorrt", "float32"),
    ("arbiter:inductor", "float32"),
]


def _model(layers: int, device: str):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=768, num_hidden_layers=layers, num_attention_heads=12,
                     intermediate_size=3072, attn_implementation="sdpa")
    model = BertModel(cfg).eval().to(device)
    ids = torch.randint(0, cfg.vocab_size, (8, 128), device=device)
    return model, ids


def _time(fn, ids, warmup: int, iters: int) -> float:
    import torch

    for _ in range(warmup):
        fn(ids)
    times = []
    for _ in range(iters):
        if ids.device.type != "cuda":  # --device cpu: a smoke test of this script
            t0 = time.perf_counter()
            fn(ids)
            times.append((time.perf_counter() - t0) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(ids)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _placement(report) -> dict:
    nodes, parts, fallbacks = {}, {}, []
    for g in report.graphs:
        for p in g.partitions:
            if p.inline:
                continue
            b = p.backend or f"{p.planned_backend} (not compiled)"
            nodes[b] = nodes.get(b, 0) + p.nodes
            parts[b] = parts.get(b, 0) + 1
            fallbacks += [f"{f.from_backend}->{f.to_backend} at {f.stage}: {f.reason}"[:300]
                          for f in p.fallbacks]
        fallbacks += [f"refused {r.op} by {r.backend}: {r.reason}"[:200]
                      for r in getattr(g, "refusals", [])[:3]]
    patterns = [f"{m.pattern}->{m.backend}{'' if m.compiled else ' (not compiled)'}"
                for g in report.graphs for m in g.patterns]
    return {"nodes": nodes, "partitions": parts, "fallbacks": fallbacks[:12],
            "patterns": patterns[:20]}


def run_case(case: str, dtype_name: str, layers: int, warmup: int, iters: int,
             device: str = "cuda") -> dict:
    import torch

    dtype = getattr(torch, dtype_name)
    model, ids = _model(layers, device)
    with torch.no_grad():
        ref32 = model(ids).last_hidden_state.float()
    model = model.to(dtype)
    row = {"case": case, "dtype": dtype_name}
    with torch.no_grad():
        ref = model(ids).last_hidden_state
        row["eager_ms"] = _time(model, ids, warmup, iters)
        be = None
        if case == "inductor":
            fn = torch.compile(model)
        elif case.startswith("arbiter:"):
            import arbiter

            name = case.split(":", 1)[1]
            be = arbiter.Arbiter() if name == "default" else arbiter.Arbiter(
                {**CONFIGS[name], "fallback": ["eager"], "against_eager": "off"})
            fn = torch.compile(model, backend=be)
        else:
            fn = model
        start = time.perf_counter()
        out = fn(ids).last_hidden_state
        if device == "cuda":
            torch.cuda.synchronize()
        row["first_call_s"] = round(time.perf_counter() - start, 2)
        out = fn(ids).last_hidden_state  # a second call: inputs already seen, no compile
        row["max_err_vs_eager_same_dtype"] = float((out.float() - ref.float()).abs().max())
        row["max_err_vs_eager_fp32"] = float((out.float() - ref32).abs().max())
        row["ms"] = _time(fn, ids, warmup, iters)
        row["vs_eager"] = round(row["eager_ms"] / row["ms"], 3)
        if be is not None:
            row["placement"] = _placement(be.report())
    return row


def _env() -> dict:
    import torch

    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    for mod in ("triton", "tensorrt_rtx", "tensorrt", "onnxruntime", "transformers"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            env[mod] = f"not importable: {type(exc).__name__}: {str(exc)[:200]}"
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--case-timeout", type=int, default=120)
    ap.add_argument("--cases", default="all", help="comma-separated case:dtype, or all")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        case, dtype = a.child.rsplit("@", 1)
        print("ROW " + json.dumps(run_case(case, dtype, a.layers, a.warmup, a.iters,
                                           a.device)))
        return 0
    cases = CASES if a.cases == "all" else [tuple(c.rsplit("@", 1)) for c in a.cases.split(",")]
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "env": _env(),
              "load": os.getloadavg(), "layers": a.layers, "rows": []}
    print(json.dumps(result["env"]), flush=True)
    for case, dtype in cases:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", f"{case}@{dtype}",
               "--layers", str(a.layers), "--warmup", str(a.warmup), "--iters", str(a.iters),
               "--device", a.device]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.case_timeout)
            rows = [json.loads(line[4:]) for line in proc.stdout.splitlines()
                    if line.startswith("ROW ")]
            row = rows[0] if rows else {"case": case, "dtype": dtype,
                                        "error": f"exit {proc.returncode}: "
                                                 f"{(proc.stderr or proc.stdout)[-1500:]}"}
        except subprocess.TimeoutExpired:
            row = {"case": case, "dtype": dtype, "error": f"timed out after {a.case_timeout} s"}
        row["wall_s"] = round(time.perf_counter() - start, 1)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        with open(os.path.join(a.out, "gpu_check.json"), "w") as f:
            json.dump(result, f, indent=1)
    print("\n| case | dtype | first call s | ms | vs eager | err vs eager (same dtype) |"
          " err vs fp32 | placement |\n|---|---|---:|---:|---:|---:|---:|---|")
    for r in result["rows"]:
        if "error" in r:
            print(f"| {r['case']} | {r['dtype']} | | | | | | error: "
                  f"{r['error'][-200:].replace(chr(10), ' ')} |")
            continue
        pl = r.get("placement", {}).get("nodes", "")
        print(f"| {r['case']} | {r['dtype']} | {r['first_call_s']} | {r['ms']:.3f} | "
              f"{r['vs_eager']} | {r['max_err_vs_eager_same_dtype']:.2e} | "
              f"{r['max_err_vs_eager_fp32']:.2e} | {pl} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
