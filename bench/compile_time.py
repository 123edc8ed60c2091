"""Compile time: a backend alone against arbiter `priority` and `measure`, cold and warm
(issue 18, item 6).

    .venv/bin/python bench/compile_time.py [--models bert_small resnet18]
        [--contenders ort_alone ov_alone priority measure] [--threads 2] [--repeats 1]

Models (random weights, seeded; eval, ``torch.no_grad``): ``bert_small``, a BERT encoder
from transformers' ``BertConfig`` (4 layers, 256 wide, 4 heads, sequence 128);
``resnet18``, transformers' ``ResNet`` in ResNet-18's shape (basic blocks 2-2-2-2, 64-512
wide) on one 224x224 image; and any name of ``arbiter.cli.examples`` (``gpt2_tiny``...).

Every contender runs in its own fresh process (imports are not timed; one eager call
is made first, so the torch kernels' own first-use costs fall on no one); the time is
the first call, compile and that first run included (``eager`` gives one eager run for
scale):

* ``ort_alone``: ``torch.onnx.export(model, dynamo=True, optimize=True)`` + an
  ``InferenceSession`` + its first run (what a user of ONNX Runtime alone pays);
* ``ov_alone``: OpenVINO's ``convert_model`` + ``compile_model`` + the first inference;
* ``priority`` / ``measure``: ``torch.compile(model, backend=Arbiter(config))`` with the
  default config (ONNX Runtime, Inductor) and that policy, in a fresh cache directory
  (``cold``), then again in a second process with the same cache (``warm``). Inductor's
  own cache is pointed into that directory too.

For arbiter the time is split: ``dynamo`` (Dynamo's tracing, the rest of the first
call), ``aot+plan`` (the backend call: AOTAutograd's tracing, planning), ``plan`` (policy
choice), ``pieces`` (the first call of what arbiter returned: piece compiles, and under
``measure`` the timing of candidates) and, inside the pieces, ONNX Runtime's
``export`` (``torch.export`` + ``torch.onnx.export`` of the partition) and ``session``
(the InferenceSession) where that backend ran.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def bert_small():
    import torch
    from transformers import BertConfig, BertModel

    from arbiter.cli.examples import _HFOutput

    cfg = BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                     intermediate_size=1024)
    torch.manual_seed(0)
    model = _HFOutput(BertModel(cfg), "input_ids", "last_hidden_state").eval()
    torch.manual_seed(1)
    return model, (torch.randint(0, cfg.vocab_size, (1, 128)),)


def resnet18():
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    from arbiter.cli.examples import _HFOutput

    cfg = ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2],
                       hidden_sizes=[64, 128, 256, 512], embedding_size=64, num_labels=1000)
    torch.manual_seed(0)
    model = _HFOutput(ResNetForImageClassification(cfg), "pixel_values", "logits").eval()
    torch.manual_seed(1)
    return model, (torch.randn(1, 3, 224, 224),)


MODELS = {"bert_small": bert_small, "resnet18": resnet18}


def load(name: str):
    if name in MODELS:
        return MODELS[name]()
    from arbiter.cli.examples import EXAMPLES, ZOO

    return {**EXAMPLES, **ZOO}[name]()


def worker(model_name: str, contender: str, threads: int) -> dict:
    import logging
    import warnings

    import torch

    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    model, args = load(model_name)
    out: dict = {}
    with torch.no_grad():
        model(*args)
        t0 = time.perf_counter()
        ref = model(*args)
        eager_s = time.perf_counter() - t0
        if contender == "ort_alone":
            import onnxruntime as ort

            t0 = time.perf_counter()
            prog = torch.onnx.export(model, args, dynamo=True, optimize=True, verbose=False)
            data = prog.model_proto.SerializeToString()
            out["export"] = time.perf_counter() - t0
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.log_severity_level = 3
            t1 = time.perf_counter()
            sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
            feeds = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
            got = torch.from_numpy(sess.run(None, feeds)[0])
            out["session"] = time.perf_counter() - t1
            total = time.perf_counter() - t0
        elif contender == "ov_alone":
            import openvino as ov

            t0 = time.perf_counter()
            ov_model = ov.convert_model(model, example_input=args)
            out["convert"] = time.perf_counter() - t0
            compiled = ov.Core().compile_model(ov_model, "CPU", {
                "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads})
            got = torch.from_numpy(compiled(list(a.numpy() for a in args))[0])
            total = time.perf_counter() - t0
        else:
            got, total = _arbiter(model, args, contender, out)
    out["total"] = total
    out["eager"] = eager_s
    out["max_err"] = float((got - ref).abs().max())
    return out


def _arbiter(model, args, policy: str, out: dict):
    import torch

    import arbiter
    from arbiter.backends import onnxruntime as ortmod

    spent = {"export": 0.0, "session": 0.0}
    real_export, real_session = ortmod.export_onnx, ortmod.OnnxRuntime.make_session

    def export(*a, **k):
        t = time.perf_counter()
        try:
            return real_export(*a, **k)
        finally:
            spent["export"] += time.perf_counter() - t

    def session(*a, **k):
        t = time.perf_counter()
        try:
            return real_session(*a, **k)
        finally:
            spent["session"] += time.perf_counter() - t

    ortmod.export_onnx = export
    ortmod.OnnxRuntime.make_session = session
    be = arbiter.Arbiter({"backends": ["onnxruntime", "inductor"], "policy": policy})
    phases = {"aot+plan": 0.0, "pieces": 0.0}

    def backend(gm, example_inputs):
        t = time.perf_counter()
        compiled = be(gm, example_inputs)
        phases["aot+plan"] += time.perf_counter() - t
        first = [True]

        def call(*a):
            if not first[0]:
                return compiled(*a)
            t = time.perf_counter()
            res = compiled(*a)
            phases["pieces"] += time.perf_counter() - t  # the first run included
            first[0] = False
            return res
        return call

    t0 = time.perf_counter()
    got = torch.compile(model, backend=backend)(*args)
    total = time.perf_counter() - t0
    graphs = be.graphs
    out["dynamo"] = total - phases["aot+plan"] - phases["pieces"]
    out.update(phases)
    out["plan"] = sum(g.plan_s for g in graphs)
    out.update(spent)
    out["chosen"] = ", ".join(sorted({r.backend for g in graphs for r in g.records.values()}))
    return got, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["bert_small", "resnet18"])
    ap.add_argument("--contenders", nargs="+",
                    default=["ort_alone", "ov_alone", "priority", "measure"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each contender, in turns; the fastest is tabulated")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        model, contender, threads = args.worker
        print("RESULT " + json.dumps(worker(model, contender, int(threads))))
        return
    print(f"load average at start {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    rows: dict = {}
    for rep in range(args.repeats):  # contenders take turns: load drifts fall on all
        for model in args.models:
            for contender in args.contenders:
                runs = ["cold", "warm"] if contender in ("priority", "measure") else ["cold"]
                with tempfile.TemporaryDirectory(prefix="arb-ct-") as cache:
                    env = dict(os.environ, ARBITER_CACHE_DIR=cache,
                               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"))
                    for run in runs:
                        t0 = time.perf_counter()
                        proc = subprocess.run(
                            [sys.executable, __file__, "--worker", model, contender,
                             str(args.threads)], env=env, capture_output=True, text=True)
                        line = [ln for ln in proc.stdout.splitlines()
                                if ln.startswith("RESULT ")]
                        if proc.returncode or not line:
                            print(f"{model} {contender} {run}: FAILED\n{proc.stderr[-2000:]}",
                                  file=sys.stderr)
                            continue
                        res = json.loads(line[0][7:])
                        res["process_s"] = time.perf_counter() - t0
                        rows.setdefault((model, contender, run), []).append(res)
                        print(f"{model:<11} {contender:<9} {run:<4} " + " ".join(
                            f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in res.items()), flush=True)
    print(f"load average at end {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"\nfastest of {args.repeats} run(s) each, seconds (the phases of that run):")
    keys = ["total", "dynamo", "aot+plan", "pieces", "export", "session", "convert"]
    print(f"{'model':<11} {'contender':<9} {'run':<4} " + " ".join(f"{k:>8}" for k in keys))
    for (model, contender, run), got in rows.items():
        best = min(got, key=lambda r: r["total"])
        print(f"{model:<11} {contender:<9} {run:<4} " + " ".join(
            f"{best[k]:>8.2f}" if k in best else f"{'-':>8}" for k in keys))


if __name__ == "__main__":
    main()
