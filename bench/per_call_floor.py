"""Where the per-call time of a small compiled model goes, layer by layer (issue 18, item 5).

The seed MLP (8 x 32, three Linear layers; ``arbiter.cli.examples.mlp``) under the default
config in inference (``torch.no_grad``): one ONNX Runtime partition with frozen weights.
Every layer of one compiled call is timed on its own, from the outside in, with the very
arguments it receives in a real call (captured once):

* ``compiled``: ``torch.compile(model, backend=Arbiter())``: Dynamo's guards, AOTAutograd's
  runtime wrapper, then what arbiter returned;
* ``arbiter fn``: what arbiter returned to AOTAutograd (the frozen-weight guard around the
  stitched module, or the direct path), called with AOT's flat arguments;
* ``stitched``: the stitched GraphModule (``GraphModule.__call__``, the pieces); for a
  graph of one partition arbiter calls the piece directly instead (``run.split.Direct``),
  and this row is what the GraphModule would cost;
* ``Direct``: what the guard calls when the graph is one partition (``run.split.Direct``);
* ``piece``: the partition's ``Piece`` (fallback bookkeeping, output checks);
* ``runner``: the backend's own callable (``OrtRunner``: IOBinding by pointer, torch
  allocates the outputs);
* ``ort floor``: ``run_with_iobinding`` on that session with input and output bound once;
* ``ort alone``: the model exported whole by ``torch.onnx.export`` and run as a user would
  (``sess.run(None, {name: x.numpy()})``, the output wrapped by ``torch.from_numpy``);
* ``eager``: the model itself;
* Dynamo's and AOTAutograd's own floors: ``backend="eager"`` and ``backend="aot_eager"``
  (they run the graph in eager, so they include the model's eager cost), and the same
  machinery around a callable that returns a precomputed result (``dynamo+const``: a
  backend returning it; ``dynamo+aot+const``: AOTAutograd's wrapper around it), which is
  the least any torch.compile backend can cost per call here.

All variants take turns within every round (order rotating), ~4 ms each per round;
medians and minimums over rounds (``time.perf_counter_ns``); torch and ONNX Runtime
on ``--threads`` threads (default 1: the tensors are tiny, and on a shared 2-core
machine a second spinning thread only adds noise).

    .venv/bin/python bench/per_call_floor.py [--rounds 31] [--grad]
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import arbiter  # noqa: E402
from arbiter.cli import examples  # noqa: E402
from arbiter.run.piece import Piece  # noqa: E402


def per_call_ns(fns: dict, rounds: int, target_ns: int = 4_000_000) -> dict:
    """{name: [ns per call, one per round]}; the fns take turns within every round."""
    counts = {}
    for name, fn in fns.items():
        fn()
        start = time.perf_counter_ns()
        n = 0
        while time.perf_counter_ns() - start < 1_000_000:
            fn()
            n += 1
        counts[name] = max(20, int(target_ns / ((time.perf_counter_ns() - start) / n)))
    samples: dict = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn, n = fns[name], counts[name]
            start = time.perf_counter_ns()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter_ns() - start) / n)
    return samples


def config(threads: int) -> dict:
    cfg = arbiter.load_config(None).model_dump(mode="json", exclude={"source"})
    cfg["resources"]["threads"] = threads
    return cfg


def capture(model, x, threads: int):
    """Compile with arbiter; return (compiled, arbiter's callable, its args, the stitched
    module or None, its args, the piece, its args)."""
    be = arbiter.Arbiter(config(threads))
    got: dict = {}
    compile_graph = be._compile_graph

    def spy(gm, kind, constants, **kw):
        fn = compile_graph(gm, kind, constants, **kw)

        def recorder(*args):
            got.setdefault("fn_args", args)
            return fn(*args)
        got["fn"] = fn
        return recorder

    be._compile_graph = spy
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=be)
    compiled(x)
    fn, fn_args = got["fn"], got["fn_args"]
    torch._dynamo.reset()
    be._compile_graph = compile_graph
    compiled = torch.compile(model, backend=be)  # a clean compile without the spy
    torch.testing.assert_close(compiled(x), model(x))
    # walk in: the stitched module and the piece, with the arguments they get
    stitched = None
    inner = fn
    for attr in ("_state",):
        state = getattr(inner, attr, None)
        if state is not None:
            inner = state[1]
    if isinstance(inner, torch.fx.GraphModule):
        stitched = inner
    elif isinstance(getattr(inner, "gm", None), torch.fx.GraphModule):  # run.split.Direct
        stitched = inner.gm
    piece = None
    piece_args = None
    if stitched is not None:
        for node in stitched.graph.nodes:
            if node.op == "call_function" and isinstance(node.target, Piece):
                piece = node.target
        recorded: dict = {}

        class Rec(torch.fx.Interpreter):
            def call_function(self, target, args, kwargs):
                if target is piece:
                    recorded["args"] = args
                return super().call_function(target, args, kwargs)

        Rec(stitched).run(*fn_args)
        piece_args = recorded.get("args")
    else:
        piece = getattr(inner, "piece", None)
        if piece is not None:
            piece_args = tuple(fn_args[i] for i in inner.positions)
    return compiled, fn, fn_args, stitched, piece, piece_args, be, inner


def ort_alone(model, x, threads: int):
    import onnxruntime as ort

    logging.disable(logging.ERROR)
    prog = torch.onnx.export(model, (x,), dynamo=True, optimize=True, verbose=False)
    so = ort.SessionOptions()
    # the session's own pool, as a user's (arbiter leaves ONNX Runtime's process-wide
    # state alone: its sessions have their own pools too), as many threads as arbiter's
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    sess = ort.InferenceSession(prog.model_proto.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return lambda: torch.from_numpy(sess.run(None, {name: x.numpy()})[0])


def ort_floor(runner, args):
    import numpy as np

    b = runner.sess.io_binding()
    keep = [a.contiguous() for a in args]
    for name, t, np_type in zip(runner.in_names, keep, runner.in_types):
        b.bind_input(name, "cpu", 0, np_type, t.shape, t.data_ptr())
    outs = []
    for name, (shape, dtype), np_type in zip(runner.out_names, runner.out_specs, runner.out_np):
        o = torch.empty(shape, dtype=dtype)
        b.bind_output(name, "cpu", 0, np.dtype(np_type), shape, o.data_ptr())
        outs.append(o)
    run = runner.sess.run_with_iobinding
    return lambda: run(b), keep, outs


def const_backend(with_aot: bool):
    """A torch.compile backend whose graph returns a precomputed result: the floor of
    Dynamo (and AOTAutograd's runtime wrapper) around a callable that does nothing."""
    def backend(gm, example_inputs):
        outs = gm(*example_inputs)
        if not with_aot:
            return lambda *a: outs
        from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

        def comp(fx_g, fake):
            return make_boxed_func(lambda *a: outs)
        return aot_module_simplified(gm, example_inputs, fw_compiler=comp,
                                     inference_compiler=comp)
    return backend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch's and the backends' threads (resources.threads)")
    ap.add_argument("--grad", action="store_true", help="time without torch.no_grad")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    import onnxruntime

    print(f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}; load average "
          f"at start {' '.join(f'{v:.2f}' for v in os.getloadavg())}; {os.cpu_count()} cpus")
    model, (x,) = examples.mlp()
    model.eval()
    ctx = torch.enable_grad() if args.grad else torch.no_grad()
    with ctx:
        compiled, fn, fn_args, stitched, piece, piece_args, be, inner = capture(
            model, x, args.threads)
        plan = be.graphs[-1]
        print(f"graph: {plan.kind}, {len(plan.plan.partitions)} partition(s): "
              f"{[r.backend for r in plan.records.values()]}; arbiter fn: {type(fn).__name__}")
        runner = piece._fn if piece is not None else None
        fns = {"compiled": lambda: compiled(x), "arbiter fn": lambda: fn(*fn_args)}
        if inner is not fn and inner is not stitched:
            fns[type(inner).__name__] = lambda: inner(*fn_args)
        if stitched is not None:
            fns["stitched"] = lambda: stitched(*fn_args)
        if piece is not None:
            fns["piece"] = lambda: piece(*piece_args)
            fns["runner"] = lambda: runner(*piece_args)
            floor, keep, outs = ort_floor(runner, piece_args)
            fns["ort floor"] = floor
        fns["ort alone"] = ort_alone(model, x, args.threads)
        fns["eager"] = lambda: model(x)
        for name, backend in (("backend=eager", "eager"), ("backend=aot_eager", "aot_eager"),
                              ("dynamo+const", const_backend(False)),
                              ("dynamo+aot+const", const_backend(True))):
            c = torch.compile(model, backend=backend)
            c(x)
            fns[name] = (lambda c=c: c(x))
        t = per_call_ns(fns, args.rounds)
    med = {k: statistics.median(v) / 1e3 for k, v in t.items()}
    lo = {k: min(v) / 1e3 for k, v in t.items()}
    alone = med["ort alone"]
    print(f"load average at end {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"{args.rounds} rounds; threads {args.threads}; {'grad enabled' if args.grad else 'torch.no_grad'}")
    print(f"{'layer':<20} {'median us':>10} {'min us':>8} {'/ ort alone':>12}")
    for k in fns:
        print(f"{k:<20} {med[k]:>10.2f} {lo[k]:>8.2f} {med[k] / alone:>11.2f}x")


if __name__ == "__main__":
    main()
