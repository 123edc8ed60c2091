"""What the stitched runtime adds per partition, on top of the backends' own call cost.

Model: ``K`` blocks on a small tensor (4 x 8 float32). Each block is ``relu(x * 1.5 + 0.5)``
(three ATen ops: one ONNX Runtime partition) followed, between blocks, by ``tanh``, which
the config excludes (so it runs inline with eager ATen and splits the ONNX Runtime runs):
K ONNX Runtime partitions and K - 1 inline eager ops. Config:
``{"backends": [{"name": "onnxruntime", "options": {"intra_op_num_threads": 1}}],
"exclude_ops": ["aten.tanh"], "min_block_size": 1}``. One intra-op thread: each ONNX
Runtime session otherwise owns a thread pool whose threads spin after every run, and K
sessions' spinning pools on 2 cores slow each other's calls down (``--ort-threads 0``
shows it); that is a cost of many small sessions, not of stitching.

Per call, timed (median over rounds of many calls each, ``time.perf_counter_ns``, torch
on 2 threads, the variants taking turns within every round; differences between variants
are medians of per-round differences):

* ``direct``: the same work with no stitching: a tight Python loop calling, in plan order,
  each partition's compiled callable (the backend's own ``OrtRunner``) and each inline
  eager ATen op, with the very inputs they got during one stitched call (recorded once
  with ``torch.fx.Interpreter``).
* ``stitched``: the stitched ``GraphModule`` that ``Arbiter`` hands to AOTAutograd (the
  pieces, their ``getitem``s, the inline ops, ``GraphModule.__call__``).
* ``torch.compile``: the whole compiled function: Dynamo's guards and AOTAutograd's
  runtime wrapper around the stitched module (a per-call constant, not per partition).

Overhead per partition = (stitched - direct) / K; ``slope`` is the same difference fitted
across K (so constant per-call costs drop out). Also measured: ONNX Runtime's own floor,
``run_with_iobinding`` on one of these sessions with inputs and outputs bound once, and
``OrtRunner``'s cost per call over that floor (binding by pointer, allocating outputs).

    .venv/bin/python bench/stitch_overhead.py [--ks 1 5 20] [--rounds 41]
"""
from __future__ import annotations

import argparse
import logging
import operator
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.fx  # noqa: E402

import arbiter  # noqa: E402
from arbiter.run.piece import Piece  # noqa: E402

def config(ort_threads: int) -> dict:
    return {"backends": [{"name": "onnxruntime",
                          "options": {"intra_op_num_threads": ort_threads}}],
            "exclude_ops": ["aten.tanh"], "min_block_size": 1}
SHAPE = (4, 8)


class Blocks(torch.nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, x):
        for i in range(self.k):
            x = torch.relu(x * 1.5 + 0.5)
            if i < self.k - 1:
                x = torch.tanh(x)
        return x


def per_call_ns(fns: dict, rounds: int, target_ns: int = 20_000_000) -> dict:
    """ns per call of each fn in each round: {name: [per-call ns, one per round]}.

    The fns take turns within every round (the order rotating from round to round), so
    a difference between two fns can be taken round by round, between calls made
    milliseconds apart, which keeps other load on the machine out of it."""
    counts = {}
    for name, fn in fns.items():
        fn()
        start = time.perf_counter_ns()
        n = 0
        while time.perf_counter_ns() - start < 2_000_000:
            fn()
            n += 1
        per = (time.perf_counter_ns() - start) / n
        counts[name] = max(20, int(target_ns / len(fns) / per))
    samples: dict = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = fns[name]
            n = counts[name]
            rng = range(n)
            start = time.perf_counter_ns()
            for _ in rng:
                fn()
            samples[name].append((time.perf_counter_ns() - start) / n)
    return samples


def med(v) -> float:
    return statistics.median(v)


def med_diff(a, b) -> float:
    """Median over rounds of a - b (paired by round)."""
    return statistics.median(x - y for x, y in zip(a, b))


def build(k: int, ort_threads: int):
    """Compile Blocks(k) with arbiter; return the compiled fn, the stitched module, the
    recorded direct steps and the ORT runners."""
    be = arbiter.Arbiter(config(ort_threads))
    stitched = []
    compile_graph = be._compile_graph

    def spy(gm, kind, constants, **kw):  # keep what Arbiter hands to AOTAutograd
        out = compile_graph(gm, kind, constants, **kw)
        stitched.append(out)
        return out

    be._compile_graph = spy
    torch._dynamo.reset()
    model = Blocks(k)
    x = torch.randn(*SHAPE)
    with torch.no_grad():
        compiled = torch.compile(model, backend=be)
        got = compiled(x)
    torch.testing.assert_close(got, model(x))
    assert len(stitched) == 1, len(stitched)
    gm = getattr(stitched[0], "gm", stitched[0])  # K = 1: run.split.Direct
    graph = be.graphs[0]
    backends = [p.backend for p in graph.plan.partitions]
    assert backends.count("onnxruntime") == k, backends
    for rec in graph.records.values():
        assert not rec.fallbacks, rec.fallbacks

    steps = []
    runners = []

    class Recorder(torch.fx.Interpreter):
        def call_function(self, target, args, kwargs):
            out = super().call_function(target, args, kwargs)
            if target is operator.getitem:
                return out
            if isinstance(target, Piece):
                runners.append(target._fn)
                target = target._fn  # the backend's own callable (OrtRunner)
            steps.append((target, tuple(args), dict(kwargs)))
            return out

    with torch.no_grad():
        Recorder(gm).run(x)
    assert len(runners) == k
    assert all(not kw for _, _, kw in steps)
    return compiled, gm, [(f, a) for f, a, _ in steps], runners, x


def ort_floor(runner, x_like) -> tuple:
    """ONNX Runtime run with IOBinding bound once, and OrtRunner called with that input."""
    import numpy as np

    sess = runner.sess
    b = sess.io_binding()
    inp = x_like.contiguous()
    for name, np_type in zip(runner.in_names, runner.in_types):
        b.bind_input(name, "cpu", 0, np_type, inp.shape, inp.data_ptr())
    outs = []
    for name, (shape, dtype), np_type in zip(runner.out_names, runner.out_specs,
                                             runner.out_np):
        o = torch.empty(shape, dtype=dtype)
        b.bind_output(name, "cpu", 0, np.dtype(np_type), shape, o.data_ptr())
        outs.append(o)
    run = sess.run_with_iobinding
    return (lambda: run(b)), (lambda: runner(inp)), outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 5, 20])
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--ort-threads", type=int, default=1,
                    help="ONNX Runtime intra-op threads per session (0: its default)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    import onnxruntime

    load = os.getloadavg()
    print(f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {os.cpu_count()} cpus; "
          f"torch threads {torch.get_num_threads()}; ORT intra-op threads "
          f"{args.ort_threads or 'default'}")
    rows = []
    floor = None
    for k in args.ks:
        t0 = time.perf_counter()
        compiled, gm, steps, runners, x = build(k, args.ort_threads)
        build_s = time.perf_counter() - t0

        def direct(steps=steps):
            for fn, a in steps:
                fn(*a)

        def stitched(gm=gm, x=x):
            gm(x)

        def whole(compiled=compiled, x=x):
            compiled(x)

        fns = {"direct": direct, "stitched": stitched, "torch.compile": whole}
        if floor is None:
            first_input = steps[0][1][0]
            floor_fn, runner_fn, _ = ort_floor(runners[0], first_input)
            fns["ort floor"] = floor_fn
            fns["OrtRunner"] = runner_fn
        with torch.no_grad():
            t = per_call_ns(fns, args.rounds)
        if floor is None:
            floor = (med(t["ort floor"]), med(t["OrtRunner"]),
                     med_diff(t["OrtRunner"], t["ort floor"]))
        rows.append((k, len(steps), med(t["direct"]), med(t["stitched"]),
                     med(t["torch.compile"]), med_diff(t["stitched"], t["direct"]),
                     med_diff(t["torch.compile"], t["direct"]), build_s))

    print()
    print("ONNX Runtime floor (IOBinding bound once, run_with_iobinding): "
          f"{floor[0] / 1e3:.2f} us; OrtRunner call (binds, allocates outputs): "
          f"{floor[1] / 1e3:.2f} us (+{floor[2] / 1e3:.2f} us)")
    print()
    print("medians over rounds; the differences are medians of per-round differences")
    print(f"{'K':>3} {'steps':>5} {'direct us':>10} {'stitched us':>12} {'compile us':>11} "
          f"{'(stitched-direct)/K us':>23} {'(compile-direct)/K us':>22} {'build s':>8}")
    for k, nsteps, d, s, c, ds, dc, b in rows:
        print(f"{k:>3} {nsteps:>5} {d / 1e3:>10.2f} {s / 1e3:>12.2f} {c / 1e3:>11.2f} "
              f"{ds / k / 1e3:>23.2f} {dc / k / 1e3:>22.2f} {b:>8.1f}")
    if len(rows) >= 2:
        ks = [r[0] for r in rows]
        fit = statistics.linear_regression(ks, [r[5] / 1e3 for r in rows])
        fit_c = statistics.linear_regression(ks, [r[6] / 1e3 for r in rows])
        print()
        print(f"fit over K, stitched - direct: {fit.slope:.2f} us per partition "
              f"+ {fit.intercept:.2f} us per call")
        print(f"fit over K, torch.compile - direct: {fit_c.slope:.2f} us per partition "
              f"+ {fit_c.intercept:.2f} us per call")
        worst = max(r[5] / r[0] / 1e3 for r in rows if r[0] >= 5)
        verdict = "met" if max(fit.slope, worst) <= 5.0 else "MISSED"
        print(f"target (<= 5 us per partition over the backends' own cost): {verdict} "
              f"(slope {fit.slope:.2f} us; worst (stitched-direct)/K at K>=5 {worst:.2f} us)")


if __name__ == "__main__":
    main()
