"""Shared thread budget and arena vs. every backend on its own defaults (issue 6).

Model: ``K`` (default 20) blocks on a (64, D) float32 tensor (``--dim`` D, default 512); a block is
``sigmoid(tanh(x @ W_i + b_i) * 0.5)``. The config excludes ``aten.sigmoid`` (it runs
inline in eager ATen), so the graph is cut into K ONNX Runtime partitions (addmm, tanh,
mul) with an eager op between each two. Weights are frozen into the partitions.

Each variant runs in its own process (thread pools and arenas are process-wide), the
variants taking turns over ``--rounds`` rounds; the medians over rounds are reported:

* ``coordinated``: the default ``resources:`` (threads auto, spin auto = the config's
  first backend, here ONNX Runtime; shared arena).
* ``coordinated-spin``: ``resources: {spin: onnxruntime}`` (ORT's global pool gets the
  whole budget and spins).
* ``uncoordinated``: ``resources: {coordinate: false}`` and ORT's own defaults
  (a pool per session sized for the machine, spinning on, an arena per session).
* ``uncoordinated-nospin``: the same with ``allow_spinning: false`` (the runtime before
  the budget existed).
* ``one-session``: nothing excluded: the same ops in one ORT session (the RSS baseline).
* ``one-session-spin`` (only with ``--variants``): the same with ``spin: onnxruntime``.

Measured per process: peak RSS (``VmHWM``) and its growth over the RSS after imports,
threads (``Threads`` in /proc/self/status, after the timed calls) and which step of the
run started each (the census), the latency of the compiled model (median of many calls),
and the sum of the parts run alone: every piece and every inline eager op of the stitched
graph timed in its own loop, with the inputs it got during one call (recorded with
``torch.fx.Interpreter``). To say where the gap between the two goes, the same steps
(the backends' compiled callables and the eager ops, without arbiter's ``Piece`` wrapper,
the stitched GraphModule or Dynamo) are also timed in a plain Python loop: all of them,
each fed the last one's output (``steps loop``; the model is a chain), and the ONNX
Runtime ones alone on their recorded inputs (``ORT loop``). Every timing of a process is
taken in turns (``timed_together``):

* parts alone -> ORT loop + eager ops: what running 20 sessions one after the other costs
  over running each in its own loop (each session's weights stay in the core's cache
  only in its own loop), nothing of arbiter's;
* -> steps loop: what interleaving ONNX Runtime with torch's ops costs;
* steps loop -> latency: arbiter's own cost (``Piece``'s checks, the stitched module,
  Dynamo's guards).

    .venv/bin/python bench/resources.py [--k 20] [--rounds 3] [--calls 200]

ONNX export of the K partitions is the slow part of a cold run (about 1 s each); the
ONNX models are cached in ``--cache`` (default /tmp/arbiter-bench-resources-cache), so
later processes reuse them.
"""
from __future__ import annotations

import argparse
import json
import logging
import operator
import os
import statistics
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

VARIANTS = ["coordinated", "coordinated-spin", "uncoordinated", "uncoordinated-nospin",
            "one-session"]
EXTRA = ["one-session-spin"]  # --variants one-session one-session-spin: what spin none
                               # costs a graph that ONNX Runtime runs whole


def config(variant: str, cache: str) -> dict:
    ort: dict = {"name": "onnxruntime"}
    cfg: dict = {"backends": [ort], "min_block_size": 1, "exclude_ops": ["aten.sigmoid"],
                 "cache": {"dir": cache}}
    if variant == "coordinated-spin":
        cfg["resources"] = {"spin": "onnxruntime"}
    elif variant.startswith("uncoordinated"):
        cfg["resources"] = {"coordinate": False}
        ort["options"] = {"allow_spinning": variant == "uncoordinated"}
    elif variant.startswith("one-session"):
        cfg["exclude_ops"] = []
        if variant == "one-session-spin":
            cfg["resources"] = {"spin": "onnxruntime"}
    return cfg


def status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def timed_together(fns: dict, calls: int, rounds: int = 7) -> dict:
    """Median seconds per call of each of ``fns``, timed in turns: every round times a
    batch of ``calls // 5`` calls of each, so that a slow stretch of the machine hits them
    all (timed one after the other, two timings of the very same callable differed by 7%).
    """
    n = max(1, calls // 5)
    for fn in fns.values():
        for _ in range(max(3, calls // 20)):
            fn()
    per: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time.perf_counter()
            for _ in range(n):
                fn()
            per[name].append((time.perf_counter() - t) / n)
    return {name: statistics.median(v) for name, v in per.items()}


def child(variant: str, k: int, calls: int, cache: str, dim: int = 512) -> dict:
    """One variant in this process; returns its measurements."""
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    census: dict = {}  # step of the run -> threads it started (alive at that point)
    seen: set = set()

    def started(step: str) -> None:
        now = set(os.listdir("/proc/self/task"))
        census[step] = len(now - seen)
        seen.update(now)

    started("python")
    import torch
    import torch.fx
    started("import torch (numpy's OpenBLAS server)")

    import onnxruntime  # noqa: F401  (imported here so the baseline RSS includes it)
    started("import onnxruntime")

    import arbiter
    from arbiter.run.piece import Piece
    started("import arbiter")

    torch.manual_seed(0)

    class Blocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lins = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(k))

        def forward(self, x):
            for lin in self.lins:
                x = torch.sigmoid(torch.tanh(lin(x)) * 0.5)
            return x

    model = Blocks().eval()
    x = torch.randn(64, dim)
    model(x)
    started("eager run (torch's OpenMP pool)")
    rss0 = status("VmRSS")
    be = arbiter.Arbiter(config(variant, cache))
    stitched = []
    compile_graph = be._compile_graph

    first: list = []

    def spy(gm, kind, constants, **kw):  # keep the stitched module and its first inputs
        out = compile_graph(gm, kind, constants, **kw)
        stitched.append(out)

        def recording(*args):
            if not first:
                first.append(args)
            return out(*args)

        return recording

    be._compile_graph = spy
    t0 = time.perf_counter()
    with torch.no_grad():
        compiled = torch.compile(model, backend=be)
        got = compiled(x)
        compile_s = time.perf_counter() - t0
        err = (got - model(x)).abs().max().item()
        report = be.report()
        parts = [p for g in report.graphs for p in g.partitions]
        ort_parts = sum(p.backend == "onnxruntime" for p in parts)
        fallbacks = sum(len(p.fallbacks) for p in parts)
        started("Arbiter, compile, first call (backends' pools)")

        # the parts alone: each step of one stitched call, in its own loop
        steps = []

        class Recorder(torch.fx.Interpreter):
            def call_function(self, target, args, kwargs):
                out = super().call_function(target, args, kwargs)
                if target is not operator.getitem:
                    fn = target._fn if isinstance(target, Piece) else target
                    steps.append((fn, tuple(args), dict(kwargs)))
                return out

        gm = getattr(stitched[0], "gm", stitched[0])  # a one-partition graph: run.split.Direct
        Recorder(gm).run(*first[0])
        is_eager = [isinstance(f, torch._ops.OpOverload) for f, _, _ in steps]

        def loop(chosen):
            def run():
                for f, a, kw in chosen:
                    f(*a, **kw)
            return run

        def chained():  # the steps as a hand-written loop would run them: the model is a
            h = steps[0][1][0]  # chain, each step's first argument the last one's output
            for f, a, kw in steps:
                out = f(h, *a[1:], **kw)
                h = out[0] if isinstance(out, (list, tuple)) else out
            return h

        fns = {"latency": lambda: compiled(x),
               "stitched": lambda: gm(*first[0]),  # without Dynamo's and AOT's wrappers
               "steps_loop": chained,
               "backend_loop": loop([st for st, e in zip(steps, is_eager) if not e])}
        for i, (f, a, kw) in enumerate(steps):
            fns[i] = lambda f=f, a=a, kw=kw: f(*a, **kw)
        err_chain = (chained() - got).abs().max().item()
        if err_chain > 1e-5:
            raise RuntimeError(f"the steps chained by hand differ from the model: {err_chain}")
        t = timed_together(fns, calls)
        started("timed calls")
        latency, stitched_s = t["latency"], t["stitched"]
        steps_loop_s, backend_loop_s = t["steps_loop"], t["backend_loop"]
        parts_s = sum(t[i] for i in range(len(steps)))
        eager_parts_s = sum(t[i] for i, e in enumerate(is_eager) if e)
    return {"variant": variant, "threads": status("Threads"), "census": census,
            "peak_rss_mb": status("VmHWM") / 1024,
            "rss_growth_mb": (status("VmHWM") - rss0) / 1024, "latency_ms": latency * 1e3,
            "stitched_ms": stitched_s * 1e3, "rss_end_mb": status("VmRSS") / 1024,
            "parts_alone_ms": parts_s * 1e3, "eager_parts_ms": eager_parts_s * 1e3,
            "steps_loop_ms": steps_loop_s * 1e3, "backend_loop_ms": backend_loop_s * 1e3,
            "steps": len(steps), "ort_partitions": ort_parts,
            "partitions": len(parts), "fallbacks": fallbacks, "max_error": err,
            "compile_s": compile_s, "resources": report.resources}


def concurrency(calls: int) -> None:
    """Two independent partitions (two ORT sessions, the same (64,512)x(512,512) matmul
    and tanh chain, 4 deep) run one after the other vs. at the same time in two threads
    (ORT releases the GIL while it runs), under the coordinated budget (global pool
    without workers: 1 thread per run). The upper bound of what running independent
    partitions concurrently could gain; ``seq-2threads`` is the alternative use of the
    second core (a global pool of 2, spinning)."""
    import concurrent.futures

    import numpy as np
    import onnx
    import onnx.helper as h
    import onnxruntime as ort

    mode = os.environ.get("BENCH_POOL", "1")
    ort.set_global_thread_pool_sizes(int(mode), 1)
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    prev = "x"
    for i in range(4):
        w = onnx.numpy_helper.from_array(rng.random((512, 512), dtype=np.float32) / 512, f"w{i}")
        inits.append(w)
        nodes += [h.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
                  h.make_node("Tanh", [f"m{i}"], [f"t{i}"])]
        prev = f"t{i}"
    vi = h.make_tensor_value_info
    g = h.make_graph(nodes, "g", [vi("x", onnx.TensorProto.FLOAT, [64, 512])],
                     [vi(prev, onnx.TensorProto.FLOAT, [64, 512])], inits)
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9)
    so = ort.SessionOptions()
    so.use_per_session_threads = False
    a, b = (ort.InferenceSession(model.SerializeToString(), so) for _ in range(2))
    x = {"x": rng.random((64, 512), dtype=np.float32)}
    pool = concurrent.futures.ThreadPoolExecutor(1)

    def seq():
        a.run(None, x)
        b.run(None, x)

    def par():
        f = pool.submit(a.run, None, x)
        b.run(None, x)
        f.result()

    t = timed_together({"sequential": seq, "concurrent": par}, calls)
    print(json.dumps({f"pool{mode}-{k}": v * 1e3 for k, v in t.items()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--dim", type=int, default=512,
                    help="width of each block (weights dim x dim float32)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS + EXTRA)
    ap.add_argument("--cache", default="/tmp/arbiter-bench-resources-cache")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--concurrency", action="store_true",
                    help="only measure two independent partitions run concurrently")
    args = ap.parse_args()
    if args.concurrency:
        if args.child:
            concurrency(args.calls)
            return
        for pool in ("1", "2"):
            out = subprocess.run([sys.executable, __file__, "--concurrency", "--child", "x",
                                  "--calls", str(args.calls)], capture_output=True, text=True,
                                 env={**os.environ, "BENCH_POOL": pool}, check=True)
            print(out.stdout.strip())
        return
    if args.child:
        print(json.dumps(child(args.child, args.k, args.calls, args.cache, args.dim)))
        return
    cores = len(os.sched_getaffinity(0))
    load = os.getloadavg()
    print(f"{cores} cores; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start; "
          f"K={args.k}, dim={args.dim}, {args.rounds} rounds, {args.calls} calls per timing")
    results: dict = {v: [] for v in args.variants}
    for r in range(args.rounds):
        order = args.variants[r % len(args.variants):] + args.variants[:r % len(args.variants)]
        for v in order:
            out = subprocess.run([sys.executable, __file__, "--child", v, "--k", str(args.k),
                                  "--dim", str(args.dim), "--calls", str(args.calls),
                                  "--cache", args.cache],
                                 capture_output=True, text=True, check=False)
            if out.returncode != 0:
                sys.exit(f"variant {v} failed:\n{out.stderr[-3000:]}")
            results[v].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"  round {r} {v}: {results[v][-1]['latency_ms']:.2f} ms", file=sys.stderr)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at end")
    keys = ("threads", "peak_rss_mb", "rss_growth_mb", "latency_ms", "parts_alone_ms",
            "eager_parts_ms", "steps_loop_ms", "backend_loop_ms", "compile_s", "max_error",
            "stitched_ms", "rss_end_mb")
    med = {v: {key: statistics.median(run[key] for run in runs) for key in keys}
           for v, runs in results.items()}
    # ratios within each process, then their median: processes differ more from each
    # other (one variant: 5.4-7.8 ms over three processes) than timings within one do
    for v, runs in results.items():
        med[v]["vs_parts"] = statistics.median(r["latency_ms"] / r["parts_alone_ms"] for r in runs)
        med[v]["vs_steps"] = statistics.median(r["latency_ms"] / r["steps_loop_ms"] for r in runs)
    base = med.get("one-session")
    print("\n| variant | ORT partitions | threads | peak RSS MB | peak RSS / one session | "
          "latency ms | stitched ms | steps loop ms | ORT loop + eager parts ms | "
          "parts alone ms | latency / parts | latency / steps loop |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for v, m in med.items():
        first = results[v][0]
        ratio = f"{m['peak_rss_mb'] / base['peak_rss_mb']:.2f}" if base else "-"
        print(f"| {v} | {first['ort_partitions']} | {m['threads']:.0f} | {m['peak_rss_mb']:.0f} | "
              f"{ratio} | {m['latency_ms']:.2f} | {m['stitched_ms']:.2f} | "
              f"{m['steps_loop_ms']:.2f} | {m['backend_loop_ms'] + m['eager_parts_ms']:.2f} | "
              f"{m['parts_alone_ms']:.2f} | {m['vs_parts']:.2f} | {m['vs_steps']:.2f} |")
    print(f"\ntargets: threads <= cores + 2 = {cores + 2}; RSS <= 1.2x one session; "
          "latency <= 1.1x the parts alone")
    for v, runs in results.items():
        print(f"{v}: fallbacks {runs[0]['fallbacks']}, max error {runs[0]['max_error']:.1e}, "
              f"threads started by {json.dumps(runs[0]['census'])}, "
              f"resources {json.dumps(runs[0]['resources'])}")


if __name__ == "__main__":
    main()
