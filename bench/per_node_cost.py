"""What one more op costs on tiny tensors, per backend: the decode step's regime.

A decode step of a small decoder (batch 1, one token) is a graph of ~170 ops on tensors of
one row, whose linears read more weight bytes than they do FLOPs. Policy `calibrated`
prices ops from cells taken at larger sizes (work in FLOPs or bytes through the class's
rate), and predicted such a step at a fraction of what it took (docs/policies.md). This
bench measures, per backend, chains of 1 and ``--ops`` ops on a (1, 256) input: tanh and
add alternating (``elementwise``), and 256x256 linears (``linear``: a GEMV, 256 KiB of
weights each). The cost of one more op is the difference over the extra ops.

Backends as a user runs them alone: ONNX Runtime (``torch.onnx.export``, a session of
``--threads`` threads, ``sess.run``), OpenVINO (``convert_model``, LATENCY hint,
``infer``), Inductor (``torch.compile``) and eager. Each round times every (backend,
chain) with ``--calls`` calls, in an order that rotates; medians of the round medians.

    .venv/bin/python bench/per_node_cost.py [--ops 33] [--rounds 7] [--calls 100]
"""
from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import time
import warnings

import torch


class Chain(torch.nn.Module):
    """``n`` ops of ``kind`` (elementwise or linear) on a (1, 256) input."""

    def __init__(self, n: int, kind: str):
        super().__init__()
        self.n, self.kind = n, kind
        self.lins = torch.nn.ModuleList(torch.nn.Linear(256, 256)
                                        for _ in range(n if kind == "linear" else 0))

    def forward(self, x):
        for i in range(self.n):
            if self.kind == "linear":
                x = self.lins[i](x)
            else:
                x = torch.tanh(x) * 1.01 if i % 2 else x + 0.5
        return x


def runners(model: torch.nn.Module, x: torch.Tensor, threads: int) -> dict:
    """backend -> a callable of no arguments that runs ``model`` on ``x`` there."""
    import onnxruntime as ort
    import openvino as ov

    out = {}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        buf = io.BytesIO()
        torch.onnx.export(model, (x,), buf, dynamo=False)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        sess = ort.InferenceSession(buf.getvalue(), so, providers=["CPUExecutionProvider"])
        name, xn = sess.get_inputs()[0].name, x.numpy()
        out["onnxruntime"] = lambda: sess.run(None, {name: xn})
        compiled = ov.Core().compile_model(ov.convert_model(model, example_input=(x,)), "CPU",
                                           {"PERFORMANCE_HINT": "LATENCY"})
        req = compiled.create_infer_request()
        out["openvino"] = lambda: req.infer({0: xn})
        inductor = torch.compile(model, backend="inductor")
        out["inductor"] = lambda: inductor(x)
        out["eager"] = lambda: model(x)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=33)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), platform.processor())
    print(f"{cpu}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, "
          f"load average at start {os.getloadavg()[0]:.2f}")
    torch.manual_seed(0)
    x = torch.randn(1, 256)
    entries = []  # (backend, kind, n, run)
    for kind in ("elementwise", "linear"):
        for n in (1, args.ops):
            model = Chain(n, kind).eval()
            for backend, run in runners(model, x, args.threads).items():
                with torch.no_grad():
                    for _ in range(20):  # the first calls compile
                        run()
                entries.append((backend, kind, n, run))
    medians: dict = {}
    with torch.no_grad():
        for r in range(args.rounds):
            shift = r % len(entries)
            for backend, kind, n, run in entries[shift:] + entries[:shift]:
                ts = []
                for _ in range(args.calls):
                    t0 = time.perf_counter()
                    run()
                    ts.append(time.perf_counter() - t0)
                medians.setdefault((backend, kind, n), []).append(statistics.median(ts) * 1e6)
    print(f"load average at end {os.getloadavg()[0]:.2f}\n")
    print(f"| backend | kind | 1 op (us) | {args.ops} ops (us) | one more op (us) |")
    print("|---|---|---:|---:|---:|")
    for backend in ("onnxruntime", "openvino", "inductor", "eager"):
        for kind in ("elementwise", "linear"):
            one = statistics.median(medians[(backend, kind, 1)])
            many = statistics.median(medians[(backend, kind, args.ops)])
            print(f"| {backend} | {kind} | {one:.1f} | {many:.1f} | "
                  f"{(many - one) / (args.ops - 1):.2f} |")


if __name__ == "__main__":
    main()
