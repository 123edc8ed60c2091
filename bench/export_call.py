"""A saved program (arbiter.export / arbiter.load, docs/deploy.md) against the same model
through torch.compile and against ONNX Runtime alone: per call, and load vs first compile.

    .venv/bin/python bench/export_call.py                       # the seed MLP
    .venv/bin/python bench/export_call.py --models mlp bert_base resnet50 gpt2_small

Per model (``arbiter.cli.examples.ZOO``: seeded random weights, eval mode, batch 1), each
step in a fresh process with its own empty arbiter cache directory (cold: what a serving
process without a cache pays):

1. ``compile``: ``torch.compile(model, backend=Arbiter(config))``, its first call timed
   (Dynamo, AOTAutograd, planning, every partition compiled and checked);
2. ``export``: ``arbiter.export(model, inputs, config=config)`` and ``save``, timed;
3. ``load``: from the process's start to a first answer of the loaded program (imports,
   ``arbiter.load``, one call on zeros of the exported shapes: no model code), against the
   same for step 1 (imports, building the model, its first compiled call); then
   ``arbiter.load(path)`` again, timed alone (its check at load included; modules
   imported, as step 1's first call is timed after ``torch.compile`` and ``Arbiter()``
   imported theirs); then per call, interleaved rounds in that process (order rotating, ~20 ms each per
   round; median of round medians): the loaded program, the same model through
   ``torch.compile(backend=Arbiter(config))`` (compiled in this process), ONNX Runtime
   alone (the whole model by ``torch.onnx.export(dynamo=True)``, ``sess.run`` with numpy
   feeds, as bench/zoo.py's contender), and eager. torch and ONNX Runtime on
   ``--threads`` threads. Every output is compared with eager's.

The issue's targets (issue 29): the loaded seed MLP at most 1.5x ONNX Runtime alone per
call; load at most 10% of the first compile for every zoo model.
"""
from __future__ import annotations

import time

_T0 = time.perf_counter()  # the child's start, before torch and arbiter are imported

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _config(name: str, threads: int) -> dict:
    from arbiter.config import load_config

    cfg = load_config(name).model_dump(mode="json", exclude={"source"})
    cfg["resources"] = dict(cfg.get("resources") or {}, threads=threads)
    return cfg


def _model(name: str):
    import torch

    from arbiter.cli.examples import ZOO

    torch.manual_seed(0)
    return ZOO[name]()


def role_compile(a) -> dict:
    import torch

    import arbiter

    model, args = _model(a.model)
    torch.set_num_threads(a.threads)
    be = arbiter.Arbiter(_config(a.config, a.threads))
    compiled = torch.compile(model, backend=be)
    start = time.perf_counter()
    with torch.no_grad():
        compiled(*args)
    done = time.perf_counter()
    return {"compile_s": done - start, "first_answer_s": done - _T0,
            "summary": be.report().summary()}


def _inputs(signature) -> tuple:
    """Zeros of the program's input shapes (symbols at their least): a serving process
    has no model code to make inputs with."""
    import torch

    from arbiter.deploy.signature import _DTYPES

    flat = [torch.zeros([s if isinstance(s, int) else signature.ranges[s][0] for s in sizes],
                        dtype=_DTYPES[dtype]) for _, dtype, sizes in signature.inputs]
    return signature.unflatten_inputs(flat)


def role_export(a) -> dict:
    import torch

    import arbiter

    model, args = _model(a.model)
    torch.set_num_threads(a.threads)
    start = time.perf_counter()
    program = arbiter.export(model, args, config=_config(a.config, a.threads))
    export_s = time.perf_counter() - start
    start = time.perf_counter()
    program.save(a.out)
    return {"export_s": export_s, "save_s": time.perf_counter() - start,
            "bytes": os.path.getsize(a.out), "summary": program.report().summary()}


def _ort_alone(model, args, threads: int):
    import onnxruntime as ort
    import torch

    prog = torch.onnx.export(model, args, dynamo=True, optimize=True, verbose=False)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    sess = ort.InferenceSession(prog.model_proto.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return lambda: torch.from_numpy(sess.run(None, {n: x.numpy() for n, x in zip(names, args)})[0])


def per_call(fns: dict, rounds: int, target_s: float = 0.02) -> dict:
    counts = {}
    for name, fn in fns.items():
        fn()
        start = time.perf_counter()
        n = 0
        while time.perf_counter() - start < 0.005 or n < 2:
            fn()
            n += 1
        counts[name] = max(3, int(target_s / ((time.perf_counter() - start) / n)))
    samples: dict = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn, n = fns[name], counts[name]
            start = time.perf_counter_ns()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter_ns() - start) / n / 1e3)
    return {k: {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v)}
            for k, v in samples.items()}


def role_load(a) -> dict:
    import torch

    import arbiter

    torch.set_num_threads(a.threads)
    # a serving process: the file to a first answer, no model code
    program = arbiter.load(a.out)
    pargs, pkwargs = _inputs(program.signature)
    program(*pargs, **pkwargs)
    first_answer_s = time.perf_counter() - _T0
    # the load call alone, everything imported (as the first compile call is timed after
    # torch.compile and Arbiter() imported theirs)
    start = time.perf_counter()
    program = arbiter.load(a.out)
    load_s = time.perf_counter() - start
    model, args = _model(a.model)
    be = arbiter.Arbiter(_config(a.config, a.threads))
    compiled = torch.compile(model, backend=be)
    with torch.no_grad():
        expected = model(*args)
        fns = {"loaded": lambda: program(*args), "torch.compile arbiter": lambda: compiled(*args),
               "eager": lambda: model(*args)}
        try:
            fns["onnxruntime alone"] = _ort_alone(model, args, a.threads)
        except Exception as exc:  # noqa: BLE001 - said in the results
            print(f"onnxruntime alone: not available ({exc})", file=sys.stderr)
        errors = {k: float((fn() - expected).abs().max()) for k, fn in fns.items()}
        times = per_call(fns, a.rounds)
    return {"load_s": load_s, "first_answer_s": first_answer_s, "check": program.deployed.check, "errors": errors,
            "per_call": times, "loaded_summary": program.report().summary()}


def _child(role: str, model: str, a, out: str) -> dict:
    env = dict(os.environ, ARBITER_CACHE_DIR=tempfile.mkdtemp(prefix="arbiter-bench-"),
               TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="inductor-bench-"))
    cmd = [sys.executable, __file__, "--role", role, "--model", model, "--out", out,
           "--config", a.config, "--threads", str(a.threads), "--rounds", str(a.rounds)]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout)
    if run.returncode != 0:
        raise RuntimeError(f"{role} {model} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["mlp"])
    p.add_argument("--config", default="default")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--timeout", type=int, default=3600)
    p.add_argument("--role", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.role:
        import logging
        import warnings

        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        result = {"compile": role_compile, "export": role_export, "load": role_load}[a.role](a)
        print(json.dumps(result))
        return 0
    load0 = os.getloadavg()
    print(f"# bench/export_call.py --config {a.config} --threads {a.threads}; load average "
          f"at start {load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f}")
    for model in a.models:
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / f"{model}.arbiter")
            c = _child("compile", model, a, path)
            e = _child("export", model, a, path)
            ld = _child("load", model, a, path)
        pc = ld["per_call"]
        loaded = pc["loaded"]["median_us"]
        print(f"\n## {model} ({e['summary']})")
        print(f"first compile {c['compile_s']:.2f} s; export {e['export_s']:.2f} s + save "
              f"{e['save_s']:.2f} s ({e['bytes'] / 1e6:.1f} MB); load {ld['load_s']:.3f} s "
              f"= {ld['load_s'] / c['compile_s']:.1%} of the first compile (modules imported "
              f"before both); process start to first answer: load {ld['first_answer_s']:.2f} "
              f"s, compile {c['first_answer_s']:.2f} s (model built, imports included) = "
              f"{ld['first_answer_s'] / c['first_answer_s']:.1%}; check at load: {ld['check']}")
        fastest = pc["loaded"]["min_us"]
        print("| per call | median us | min-max us | loaded / this (medians) | "
              "loaded / this (minimums) | max error vs eager |")
        print("|---|---|---|---|---|---|")
        for name, t in pc.items():
            print(f"| {name} | {t['median_us']:.1f} | {t['min_us']:.1f}-{t['max_us']:.1f} | "
                  f"{loaded / t['median_us']:.2f}x | {fastest / t['min_us']:.2f}x | "
                  f"{ld['errors'][name]:.2e} |")
    load1 = os.getloadavg()
    print(f"\nload average at end {load1[0]:.1f} {load1[1]:.1f} {load1[2]:.1f} (shared machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
