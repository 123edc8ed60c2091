"""ONNX Runtime alone at float32, fp16 and dynamic int8 (docs/precision.md), one process.

    .venv/bin/python bench/ort_precision.py --model bert_base

The model (``arbiter.cli.examples.ZOO``: seeded random weights, batch 1) is exported whole
with ``torch.onnx.export(dynamo=True)`` (weights are initializers, as frozen partitions'
are), lowered with arbiter's own ``lower_precision`` (what the ``onnxruntime:fp16`` and
``onnxruntime:int8`` variants run), and each session is timed in interleaved rounds.
Reported: the max abs error of the first output against eager, the median of the round
medians and its ratio to float32. fp16 is timed although arbiter does not offer it on a
provider without float16 matmuls (the x86 CPU provider): this says why.
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import warnings


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="bert_base")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=3, help="runs per round and variant")
    args = p.parse_args(argv)

    warnings.simplefilter("ignore")
    for name in ("torch.onnx", "onnxscript", "onnx_ir", "torch.export"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import numpy as np
    import onnxruntime as ort
    import torch

    from arbiter.backends.onnxruntime import OrtOptions, lower_precision
    from arbiter.cli import examples

    torch.set_num_threads(args.threads)
    model, inputs = examples.ZOO[args.model]()
    with torch.no_grad():
        ref = model(*inputs)
        ref = (ref if isinstance(ref, torch.Tensor) else ref[0]).numpy()
        f32 = torch.onnx.export(model, inputs, dynamo=True, optimize=True,
                                verbose=False).model_proto.SerializeToString()
    models = {"fp32": f32}
    for label, opts in (("int8", {"precision": "int8"}),
                        ("int8 per-tensor", {"precision": "int8", "int8_per_channel": False}),
                        ("fp16", {"precision": "fp16"})):
        models[label] = lower_precision(f32, OrtOptions(**opts))
    sessions, feeds, errors = {}, {}, {}
    for label, blob in models.items():
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.log_severity_level = 3
        sess = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
        feeds[label] = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), inputs)}
        errors[label] = float(np.abs(sess.run(None, feeds[label])[0] - ref).max())
        sessions[label] = sess
    rounds: dict = {k: [] for k in sessions}
    for _ in range(args.rounds):
        for label, sess in sessions.items():
            times = []
            for _ in range(args.iters):
                t0 = time.perf_counter()
                sess.run(None, feeds[label])
                times.append(time.perf_counter() - t0)
            rounds[label].append(statistics.median(times) * 1e3)
    base = statistics.median(rounds["fp32"])
    print(f"{args.model}, {args.threads} threads, {args.rounds} rounds x {args.iters}; "
          f"load {os.getloadavg()[0]:.2f}; onnxruntime {ort.__version__}")
    print("| ONNX Runtime | max err vs eager | median ms | spread ms | vs fp32 |")
    print("|---|---:|---:|---:|---:|")
    for label, r in rounds.items():
        med = statistics.median(r)
        print(f"| {label} | {errors[label]:.1e} | {med:.1f} | {min(r):.1f}-{max(r):.1f} | "
              f"{base / med:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
