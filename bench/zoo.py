"""The model zoo: arbiter against every single backend, each contender in its own process.

    .venv/bin/python bench/zoo.py                                  # the full zoo (~35 min on 2 cores)
    .venv/bin/python bench/zoo.py --models mlp t5_small_encoder --rounds 3   # a smoke run

Every contender compiles cold: each (model, contender) worker gets its own empty arbiter
cache and Inductor cache (``TORCHINDUCTOR_CACHE_DIR``) under the run's directory (a fresh
temporary one unless ``ARBITER_CACHE_DIR`` names it), so no contender's compile is served
by another's or by an earlier run's; the calibration, measured once, is the one thing
they share (a file in the run's directory).

Models come from ``arbiter.cli.examples.ZOO`` (transformers configs, seeded random weights, so
every process builds the same model and inputs; eval mode, batch 1, float32). Contenders:

* ``eager``; ``inductor`` (``torch.compile(backend="inductor")``);
* ``onnxruntime``: the backend alone, as a user would use it: the whole model through
  ``torch.onnx.export(dynamo=True)`` and an ``InferenceSession`` with ``--threads`` intra-op
  threads;
* ``openvino``: ``openvino.convert_model`` of the whole model and ``compile_model`` for CPU,
  float32, ``--threads`` threads, latency hint;
* ``arbiter_cpu_all``, ``arbiter_default``: ``backend="arbiter"`` with the shipped configs
  (policy ``calibrated``: the machine's calibration is measured once before the first
  model into a file every arbiter contender reads, and its own cost reported; unless
  ``$ARBITER_CALIBRATION`` pins one); ``arbiter_measure``: cpu_all's backends with ``policy: measure``.
* not in the default run (``--contenders``): ``openvino_bf16`` (OpenVINO alone, bf16
  hint), ``arbiter_accuracy`` and ``arbiter_measure_accuracy`` (cpu_all, priority or
  measure, with ``accuracy:`` from ``--atol``, ``--max-rel-norm``, ``--topk-agreement``,
  ``{atol: 1e-2}`` when none is given: lower-precision variants within it may run, whole
  or module by module, docs/precision.md); ``--calibrate N`` has them decide on N seeded
  random inputs (``arbiter.tune``), and their errors (and ``openvino_bf16``'s) are
  measured again on ``--fresh`` inputs nothing saw before (the note column);
  ``arbiter_only_onnxruntime``, ``arbiter_only_openvino``, ``arbiter_only_inductor``:
  cpu_all's config with that one backend (and eager), to compare with the backend alone.
  A contender that cannot be built is reported "not available" with its error.

Every contender lives in its own long-lived worker process (thread pools that one backend
leaves alive slow the next one in the same process). The parent builds them one at a time
(first call = compile time, bounded by ``--compile-timeout``), then interleaves rounds:
in round r each worker in turn runs K timed iterations while the others sleep. Reported:
the median of the round medians, their min-max spread, the ratio to eager, the max abs
error against eager's outputs (same seeded weights and inputs in every process), and the
compile time. Progress and an estimate of the time left go to stderr.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONTENDERS = ["eager", "inductor", "onnxruntime", "openvino",
              "arbiter_cpu_all", "arbiter_default", "arbiter_measure"]
SINGLE = ["eager", "inductor", "onnxruntime", "openvino"]
#: lower precision (docs/precision.md), not in the default run: OpenVINO alone with its
#: bf16 hint, and cpu_all (priority, then measure) with `accuracy:` (--atol...)
PRECISION = ["openvino_bf16", "arbiter_accuracy", "arbiter_measure_accuracy"]
#: arbiter with one backend (and eager): what going through arbiter costs against that
#: backend alone; not in the default run
ONLY = ["arbiter_only_onnxruntime", "arbiter_only_openvino", "arbiter_only_inductor"]
ACCURACY_ENV = "ZOO_ACCURACY"  # the accuracy bound and calibration, JSON, for the workers
MODELS = ["mlp", "bert_base", "gpt2_small", "resnet50", "vit_base", "distilbert",
          "t5_small_encoder"]


# -- worker side -------------------------------------------------------------------------

def _build_contender(name: str, model, args, threads: int, measure_budget_s: float):
    """-> a callable running one inference on ``args``; returns a torch tensor."""
    import torch

    if name == "eager":
        return lambda: model(*args)
    if name == "inductor":
        compiled = torch.compile(model, backend="inductor")
        return lambda: compiled(*args)
    if name == "onnxruntime":
        import onnxruntime as ort

        prog = torch.onnx.export(model, args, dynamo=True, optimize=True, verbose=False)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        sess = ort.InferenceSession(prog.model_proto.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        feeds = {n: a.numpy() for n, a in zip(names, args)}
        return lambda: torch.from_numpy(sess.run(None, feeds)[0])
    if name in ("openvino", "openvino_bf16"):
        import openvino as ov

        ov_model = ov.convert_model(model, example_input=args)
        compiled = ov.Core().compile_model(ov_model, "CPU", {
            "INFERENCE_PRECISION_HINT": "bf16" if name == "openvino_bf16" else "f32",
            "INFERENCE_NUM_THREADS": threads,
            "PERFORMANCE_HINT": "LATENCY"})
        req = compiled.create_infer_request()
        inputs = [a.numpy() for a in args]
        fn = lambda: torch.from_numpy(req.infer(inputs)[0].copy())  # noqa: E731
        fn.on = lambda x: torch.from_numpy(req.infer([a.numpy() for a in x])[0].copy())
        return fn
    if name.startswith("arbiter_"):
        import arbiter
        from arbiter.config import load_config

        kind = name[len("arbiter_"):]
        base = "default" if kind == "default" else "cpu_all"
        cfg = load_config(base).model_dump(exclude={"source"})
        cfg["resources"] = dict(cfg.get("resources") or {}, threads=threads)
        if kind.startswith("only_"):
            only = kind[len("only_"):]
            cfg["backends"] = [b for b in cfg["backends"] if b["name"] == only] or [only]
        if kind in ("measure", "measure_accuracy"):
            cfg["policy"] = "measure"
            cfg["measure"] = dict(cfg.get("measure") or {}, time_budget_s=measure_budget_s)
        acc = json.loads(os.environ.get(ACCURACY_ENV, "{}"))
        if kind.endswith("accuracy"):
            cfg["accuracy"] = acc["bound"]
        be = arbiter.Arbiter(cfg)
        compiled = torch.compile(model, backend=be)
        if kind.endswith("accuracy") and acc.get("calibrate"):
            # calibration inputs the graph decides on (arbiter.tune), none of them the
            # timed input nor the fresh ones the errors are measured again on
            arbiter.tune(compiled, [like(args, 100 + i) for i in range(acc["calibrate"])])
        fn = lambda: compiled(*args)  # noqa: E731
        fn.report = be.report
        fn.on = lambda x: compiled(*x)
        return fn
    raise ValueError(f"unknown contender {name!r}; valid: {', '.join(CONTENDERS + PRECISION + ONLY)}")


def like(args, seed: int) -> tuple:
    """New inputs like ``args``, seeded: token ids below the largest seen plus one (the
    zoo's inputs draw from the whole vocabulary), images from a normal distribution."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, int(a.max()) + 1, a.shape, generator=gen, dtype=a.dtype)
                 if not a.is_floating_point() else torch.randn(a.shape, generator=gen)
                 for a in args)


def fresh_errors(model, fn_on, args, n: int) -> str:
    """The contender against eager on ``n`` inputs no calibration or timing saw: the
    largest absolute error, the largest relative error norm, top-1 agreement (rows of
    the last dimension)."""
    import torch

    worst = rel = 0.0
    agree = rows = 0
    for i in range(n):
        x = like(args, 10_000 + i)
        ref, got = model(*x).double(), fn_on(x).double()
        worst = max(worst, float((got - ref).abs().max()))
        rel = max(rel, float((got - ref).norm() / ref.norm()))
        agree += int((got.reshape(-1, ref.shape[-1]).argmax(-1)
                      == ref.reshape(-1, ref.shape[-1]).argmax(-1)).sum())
        rows += ref.numel() // ref.shape[-1]
    return (f"fresh inputs ({n}): max abs {worst:.1e}, rel norm {rel:.1e}, top-1 "
            f"{agree}/{rows}")


def _worker(conn, model_name: str, contender: str, threads: int, measure_budget_s: float,
            cache_dir: str):
    import logging
    import warnings

    # this contender's own caches, empty: its compile is cold (set before torch imports)
    os.environ["ARBITER_CACHE_DIR"] = cache_dir
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, "inductor")
    import torch

    warnings.simplefilter("ignore")
    for name in ("torch.onnx", "onnxscript", "onnx_ir", "torch.export", "torch._dynamo"):
        logging.getLogger(name).setLevel(logging.ERROR)

    torch.set_num_threads(threads)
    from arbiter.cli import examples

    try:
        t0 = time.perf_counter()
        model, args = examples.ZOO[model_name]()
        build_s = time.perf_counter() - t0
    except BaseException as exc:
        conn.send(("err", f"model build: {type(exc).__name__}: {exc}"[:300],
                   traceback.format_exc()[-2000:]))
        return
    conn.send(("built", build_s))
    conn.recv()  # built in parallel with the other workers; compile when told (one at a time)
    try:
        with torch.no_grad():
            t0 = time.perf_counter()
            fn = _build_contender(contender, model, args, threads, measure_budget_s)
            out1 = fn()
            compile_s = time.perf_counter() - t0  # export/compile + the first call
            out2 = fn()
        summary = fn.report().summary() if hasattr(fn, "report") else ""
        acc = json.loads(os.environ.get(ACCURACY_ENV, "{}"))
        if acc.get("fresh") and (contender.endswith("accuracy") or contender.endswith("bf16")):
            with torch.no_grad():
                summary += "; " + fresh_errors(model, fn.on, args, acc["fresh"])
        if hasattr(fn, "report"):  # config `accuracy`: what each lower precision measured
            for g in fn.report().graphs:
                if g.accuracy is not None:
                    summary += "".join(f"; {k}: err {v:.1e}" for k, v in
                                       g.accuracy.errors.items())
                    summary += "".join(f"; refused {k}" for k in g.accuracy.rejected)
                    low = [m for m in g.accuracy.modules if m.precision != "float32"]
                    if g.accuracy.modules:
                        summary += (f"; {len(low)} of {len(g.accuracy.modules)} modules on "
                                    + (low[0].precision if low else "float32"))
                    if g.accuracy.holdout is not None:
                        summary += f"; held out: rel norm {g.accuracy.holdout.rel_norm:.1e}"
        conn.send(("ok", build_s, compile_s, [out1.detach().numpy().copy(),
                                              out2.detach().numpy().copy()], summary))
    except BaseException as exc:  # reported as "not available", never hidden
        conn.send(("err", f"{type(exc).__name__}: {exc}".splitlines()[0][:300],
                   traceback.format_exc()[-2000:]))
        return
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            return
        times = []
        with torch.no_grad():
            if msg[0] == "probe":  # at least 3 runs, then until msg[1] seconds are spent
                start = time.perf_counter()
                while len(times) < 3 or (time.perf_counter() - start < msg[1]
                                         and len(times) < 1000):
                    t0 = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t0)
            else:
                for _ in range(msg[1]):
                    t0 = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t0)
        conn.send(times)


# -- parent side -------------------------------------------------------------------------

class Contender:
    def __init__(self, model: str, name: str, args):
        self.model, self.name = model, name
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        cache_dir = os.path.join(os.environ["ARBITER_CACHE_DIR"], model, name)
        os.makedirs(cache_dir, exist_ok=True)
        self.proc = ctx.Process(target=_worker, args=(child, model, name, args.threads,
                                                      args.measure_budget, cache_dir),
                                daemon=True)
        self.status = "ok"
        self.error = ""
        self.compile_s = math.nan
        self.outputs = None
        self.summary = ""
        self.round_medians: list[float] = []
        self.max_err = math.nan

    def spawn(self) -> None:
        self.proc.start()

    def _recv(self, timeout: float, what: str):
        """The worker's next message, or None (the contender then fails, with why)."""
        if not self.conn.poll(timeout):
            self.fail(f"{what} did not finish within {timeout:.0f} s (killed)")
            return None
        try:
            return self.conn.recv()
        except EOFError:
            self.proc.join(5)
            self.fail(f"the worker process died during {what} (exit code {self.proc.exitcode})")
            return None

    def wait_built(self, timeout: float) -> None:
        msg = self._recv(timeout, "the model build")
        if msg is not None and msg[0] == "err":
            self.fail(msg[1])
            log(msg[2])

    def start(self, timeout: float) -> None:
        if self.status != "ok":
            return
        self.conn.send(("compile",))
        msg = self._recv(timeout, "compile")
        if msg is None:
            return
        if msg[0] == "ok":
            _, _build_s, self.compile_s, self.outputs, self.summary = msg
        else:
            self.fail(msg[1])
            log(msg[2])

    def fail(self, why: str) -> None:
        self.status, self.error = "not available", why
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)

    def run(self, k: int, timeout: float, probe_s: float = 0.0) -> list[float]:
        self.conn.send(("probe", probe_s) if probe_s else ("run", k))
        return self._recv(timeout, "a timed round") or []

    def stop(self) -> None:
        if self.proc.is_alive():
            try:
                self.conn.send(("stop",))
            except OSError:
                pass
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def bench_model(model: str, names: list[str], args) -> list[Contender]:
    import numpy as np

    # Workers import torch and build the model at the same time (cheaper than one after
    # the other); then they compile one at a time, so compile times are not contended.
    cs = [Contender(model, name, args) for name in names]
    t0 = time.perf_counter()
    for c in cs:
        c.spawn()
    for c in cs:
        c.wait_built(args.compile_timeout)
    log(f"  {model}: built in {len(cs)} processes in {time.perf_counter() - t0:.1f} s")
    for c in cs:
        c.start(args.compile_timeout)
        log(f"  {model}/{c.name}: "
            f"{'compiled in %.1f s' % c.compile_s if c.status == 'ok' else c.error}")
    live = [c for c in cs if c.status == "ok"]
    ref = next((c for c in live if c.name == "eager"), None)
    for c in live:
        if ref is not None:
            c.max_err = max(float(np.abs(o.astype(np.float64) - ref.outputs[0]).max())
                            for o in c.outputs)
    # K per contender: about --round-s seconds of its own runs per round
    ks = {}
    for c in live:
        probe = c.run(3, args.compile_timeout, probe_s=args.round_s)
        if probe:
            one = statistics.median(probe)
            ks[c.name] = (max(1, min(args.max_iters, round(args.round_s / max(one, 1e-6)))), one)
    live = [c for c in live if c.status == "ok"]
    log(f"  {model}: {args.rounds} rounds; iterations per round: "
        + ", ".join(f"{n} {k}" for n, (k, _) in ks.items()))
    for r in range(args.rounds):
        for c in live:
            if c.status != "ok":
                continue
            k, one = ks[c.name]
            times = c.run(k, max(60.0, 20 * k * one))
            if times:
                c.round_medians.append(statistics.median(times))
        log(f"  {model}: round {r + 1}/{args.rounds} done")
    for c in cs:
        c.stop()
    return cs


def fmt_ms(s: float) -> str:
    ms = s * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 10 else f"{ms:.1f}"


def render(results: dict[str, list[Contender]], args, started: str, load0, load1,
           others: int, wall_s: float) -> str:
    import torch

    versions = [f"torch {torch.__version__}"]
    for mod in ("onnxruntime", "openvino", "transformers"):
        try:
            versions.append(f"{mod} {__import__(mod).__version__}")
        except ImportError:
            versions.append(f"{mod} missing")
    cmd = "python bench/zoo.py " + " ".join(sys.argv[1:])
    lines = [
        "# Model zoo: arbiter vs each single backend",
        "",
        f"{'**SMOKE RUN** (not the full zoo): ' if args.smoke_note else ''}"
        f"{started} UTC; {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"no GPU; {'; '.join(versions)}; float32, batch 1, {args.threads} threads; "
        f"OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'unset (OpenMP default)')}; "
        f"{args.rounds} interleaved rounds per model; wall time {wall_s / 60:.1f} min.",
        "",
        f"Load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end; measured "
        f"while {others} other processes ran (other users' processes using CPU at the start)."
        " Absolute times on this shared machine move a lot between runs: compare ratios "
        "within one model.",
        "",
        "```sh",
        f".venv/bin/{cmd}",
        "```",
        "",
        "median = median of the per-round medians (ms); spread = min-max of the round "
        "medians; vs eager = eager median / contender median (above 1 is faster); max err "
        "= max |out - eager out| over the first two calls; compile = export/compile + "
        "the first call (s), cold: each contender in its own empty arbiter and Inductor "
        "caches.",
        "",
    ]
    for model, cs in results.items():
        lines += [f"## {model}", "",
                  "| contender | median ms | spread ms | vs eager | vs best single | max err | compile s | note |",
                  "|---|---:|---:|---:|---:|---:|---:|---|"]
        med = {c.name: statistics.median(c.round_medians) for c in cs
               if c.status == "ok" and c.round_medians}
        singles = [med[n] for n in SINGLE if n in med]
        best = min(singles) if singles else None
        for c in cs:
            if c.name not in med:
                lines.append(f"| {c.name} | - | - | - | - | - | - | not available: "
                             f"{c.error.replace('|', '/')} |")
                continue
            m = med[c.name]
            ve = f"{med['eager'] / m:.2f}x" if "eager" in med else "-"
            vb = f"{best / m:.2f}x" if best else "-"
            err = "-" if math.isnan(c.max_err) else f"{c.max_err:.1e}"
            note = c.summary.replace("|", "/") if c.summary else ""
            lines.append(f"| {c.name} | {fmt_ms(m)} | {fmt_ms(min(c.round_medians))}-"
                         f"{fmt_ms(max(c.round_medians))} | {ve} | {vb} | {err} | "
                         f"{c.compile_s:.1f} | {note} |")
        lines.append("")
    return "\n".join(lines)


_CALIBRATE = """
import os, sys, time
import torch
import arbiter
from arbiter.config import load_config
from arbiter.measure.calibration import Calibrations
torch.set_num_threads(int(sys.argv[1]))
cfg = load_config("cpu_all").model_dump(exclude={"source"})
cfg["resources"] = dict(cfg.get("resources") or {}, threads=int(sys.argv[1]))
be = arbiter.Arbiter(cfg)
be.apply_resources()
load = os.getloadavg()[0]
t0 = time.perf_counter()
cal = Calibrations(be.planner, be.cache, budget_s=None, progress=False)
from arbiter.measure.calibration import write_file
write_file(sys.argv[2], cal.measured(), be.backends)
print(f"{time.perf_counter() - t0:.1f} {load:.2f} {cal.source}")
"""


def calibrate(threads: int) -> str:
    """Policy `calibrated`'s calibration of this machine, measured once into a file in
    the run's directory, which ``$ARBITER_CALIBRATION`` then names for every arbiter
    contender; a line saying what it cost."""
    import subprocess

    if os.environ.get("ARBITER_CALIBRATION"):
        return f"Calibration: pinned by $ARBITER_CALIBRATION={os.environ['ARBITER_CALIBRATION']}."
    log("calibrating this machine (policy `calibrated`; once, into the run's directory)")
    path = os.path.join(os.environ["ARBITER_CACHE_DIR"], "calibration.json")
    proc = subprocess.run([sys.executable, "-c", _CALIBRATE, str(threads), path],
                          capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        log(f"calibration failed: {proc.stderr[-1000:]}")
        return "Calibration: failed (the contenders measure it on first need)."
    took, load, source = proc.stdout.split()[-3:]
    os.environ["ARBITER_CALIBRATION"] = path
    log(f"calibration: {took} s at load {load} ({source}), written to {path}")
    return (f"Calibration (policy `calibrated`, once per machine, before the first model; "
            f"the arbiter contenders' compile times do not include it): {took} s, load "
            f"average {load} at its start.")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    p.add_argument("--contenders", nargs="+", default=CONTENDERS,
                   choices=CONTENDERS + PRECISION + ONLY)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--round-s", type=float, default=1.0,
                   help="target seconds per contender per round (sets K per model)")
    p.add_argument("--max-iters", type=int, default=2000, help="K at most")
    p.add_argument("--compile-timeout", type=float, default=300.0,
                   help="seconds a contender may take to build (killed after)")
    p.add_argument("--measure-budget", type=float, default=60.0,
                   help="measure.time_budget_s of arbiter_measure")
    p.add_argument("--atol", type=float, default=None,
                   help="accuracy.atol of the *_accuracy contenders (1e-2 when no bound "
                        "is given)")
    p.add_argument("--max-rel-norm", type=float, default=None,
                   help="accuracy.max_rel_norm of the *_accuracy contenders")
    p.add_argument("--topk-agreement", type=float, default=None,
                   help="accuracy.topk {k: 1, agreement: this} of the *_accuracy contenders")
    p.add_argument("--calibrate", type=int, default=0,
                   help="the *_accuracy contenders decide on this many seeded random "
                        "inputs through arbiter.tune (0: on the first call's)")
    p.add_argument("--fresh", type=int, default=8,
                   help="lower-precision contenders' errors measured again on this many "
                        "inputs nothing saw before (0: not)")
    p.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    p.add_argument("--deadline-min", type=float, default=35.0,
                   help="do not start a model when the average model so far would end "
                        "past this many minutes; such models are listed as not run")
    p.add_argument("--omp-passive", action="store_true",
                   help="OMP_WAIT_POLICY=PASSIVE in every worker (torch's OpenMP threads "
                        "sleep instead of spinning; helps on an oversubscribed machine)")
    p.add_argument("--smoke-note", action="store_true",
                   help="mark the results as a smoke run in the output")
    args = p.parse_args(argv)

    # Every worker is spawned with these; torch's OpenMP pool reads them at start.
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    bound: dict = {}
    if args.atol is not None:
        bound["atol"] = args.atol
    if args.max_rel_norm is not None:
        bound["max_rel_norm"] = args.max_rel_norm
    if args.topk_agreement is not None:
        bound["topk"] = {"k": 1, "agreement": args.topk_agreement}
    os.environ[ACCURACY_ENV] = json.dumps({"bound": bound or {"atol": 1e-2},
                                           "calibrate": args.calibrate, "fresh": args.fresh})
    # The run's directory (unless one is named), holding every contender's own cold cache:
    # the default cache would replay decisions and ONNX models from earlier runs.
    if "ARBITER_CACHE_DIR" not in os.environ:
        import tempfile

        os.environ["ARBITER_CACHE_DIR"] = tempfile.mkdtemp(prefix="arbiter-zoo-cache-")
    log(f"the run's directory (each contender's own caches): "
        f"{os.environ['ARBITER_CACHE_DIR']}")
    if args.omp_passive:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    from arbiter.cli.timing import other_busy_processes  # parent only: imports no torch

    load0, others = os.getloadavg(), other_busy_processes()
    calibration = ""
    if any(c.startswith("arbiter_") for c in args.contenders):
        calibration = calibrate(args.threads)
    t_start = time.perf_counter()
    results: dict[str, list[Contender]] = {}
    skipped: list[str] = []
    for i, model in enumerate(args.models):
        done = time.perf_counter() - t_start
        if i and done + done / i > args.deadline_min * 60:
            skipped = args.models[i:]
            log(f"deadline: {done / 60:.1f} min spent; not running {', '.join(skipped)}")
            break
        log(f"[{i + 1}/{len(args.models)}] {model}: {len(args.contenders)} contenders")
        results[model] = bench_model(model, args.contenders, args)
        done = time.perf_counter() - t_start
        left = done / (i + 1) * (len(args.models) - i - 1)
        log(f"[{i + 1}/{len(args.models)}] {model} done; {done / 60:.1f} min so far, "
            f"about {left / 60:.1f} min left (average per model so far)")
    text = render(results, args, started, load0, os.getloadavg(), others,
                  time.perf_counter() - t_start)
    if calibration:
        text += f"\n{calibration}\n"
    if skipped:
        text += (f"\nNot run (--deadline-min {args.deadline_min:g} would have been passed): "
                 f"{', '.join(skipped)}.\n")
    Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
