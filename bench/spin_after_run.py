"""What an ONNX Runtime session's spinning workers cost whatever runs next, and what
they give the session itself (docs/resources.md, "Spinning stops when a run returns").

    .venv/bin/python bench/spin_after_run.py [--model distilbert] [--rounds 10]

One process, one model of the zoo (arbiter.cli.examples), exported whole with
``torch.onnx.export(dynamo=True)``; three sessions of it with 2 intra-op threads:
``spin`` (``session.intra_op.allow_spinning = 1``), ``spin+stop`` (the same and
``session.force_spinning_stop = 1``, what arbiter's spinning sessions set) and
``nospin``. In each round, for each session after 60 ms of quiet: three runs back to
back (their median: what the session gets), then OpenVINO's compiled model of the same
module right after one run, then eager right after another. Medians over the rounds, ms.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="distilbert")
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    import onnxruntime as ort
    import openvino as ov
    import torch

    from arbiter.cli import examples

    torch.set_num_threads(2)
    model, inputs = {**examples.EXAMPLES, **examples.ZOO}[args.model]()
    with torch.no_grad():
        prog = torch.onnx.export(model, inputs, dynamo=True, optimize=True, verbose=False)
    blob = prog.model_proto.SerializeToString()

    def session(spin: bool, stop: bool):
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        if stop:
            so.add_session_config_entry("session.force_spinning_stop", "1")
        return ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])

    sessions = {"spin": session(True, False), "spin+stop": session(True, True),
                "nospin": session(False, False)}
    feeds = {i.name: a.numpy() for i, a in zip(sessions["spin"].get_inputs(), inputs)}
    compiled = ov.Core().compile_model(ov.convert_model(model, example_input=inputs), "CPU", {
        "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 2,
        "PERFORMANCE_HINT": "LATENCY"})
    req = compiled.create_infer_request()
    ov_in = [a.numpy() for a in inputs]
    for s in sessions.values():
        for _ in range(3):
            s.run(None, feeds)
            req.infer(ov_in)
    own, ov_after, eager_after = ({k: [] for k in sessions} for _ in range(3))
    print(f"load average at start: {os.getloadavg()}")
    for _ in range(args.rounds):
        for name, s in sessions.items():
            time.sleep(0.06)
            own[name].append(statistics.median(_ms(lambda: s.run(None, feeds))
                                               for _ in range(3)))
            ov_after[name].append(_ms(lambda: req.infer(ov_in)))
            s.run(None, feeds)
            with torch.no_grad():
                eager_after[name].append(_ms(lambda: model(*inputs)))
    quiet_ov, quiet_eager = [], []
    for _ in range(args.rounds):
        time.sleep(0.06)
        quiet_ov.append(_ms(lambda: req.infer(ov_in)))
        time.sleep(0.06)
        with torch.no_grad():
            quiet_eager.append(_ms(lambda: model(*inputs)))
    print(f"load average at end: {os.getloadavg()}")
    med = statistics.median
    print(f"{args.model}: OpenVINO after 60 ms of quiet {med(quiet_ov):.1f} ms, eager "
          f"{med(quiet_eager):.1f} ms")
    print("| session | its runs back to back (ms) | OpenVINO right after (ms) | eager right "
          "after (ms) |")
    print("|---|---:|---:|---:|")
    for name in sessions:
        print(f"| {name} | {med(own[name]):.2f} | {med(ov_after[name]):.1f} | "
              f"{med(eager_after[name]):.1f} |")


if __name__ == "__main__":
    main()
