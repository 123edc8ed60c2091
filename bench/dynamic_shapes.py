"""Varying sequence lengths, as a server sees them: arbiter against each single backend.

    .venv/bin/python bench/dynamic_shapes.py                  # ~10 min on 2 cores
    .venv/bin/python bench/dynamic_shapes.py --rounds 2 --iters 2   # a smoke run
    .venv/bin/python bench/dynamic_shapes.py --procs 3     # each contender in 3 processes

Model: a BERT-style encoder (transformers' BertModel, hidden 256, 4 layers, 4 heads,
intermediate 1024, seeded random weights, eval, float32), batch 4, called in a cycle over
sequence lengths 32, 48, 64, 96, 128. Contenders, each in its own process:

* ``eager``;
* ``inductor``: ``torch.compile(model)`` (Dynamo's automatic dynamic: a static graph for
  the first length, then one symbolic graph);
* ``onnxruntime``: the whole model through ``torch.onnx.export(dynamo=True)`` with the
  sequence dimension dynamic (``dynamic_shapes``), one ``InferenceSession``;
* ``openvino``: ``openvino.convert_model`` of the whole model, input reshaped to
  ``[4, ?]``, compiled once for CPU (float32, latency hint);
* ``arbiter_default``, ``arbiter_cpu_all``: ``torch.compile(model, backend=Arbiter(...))``
  with the shipped configs (automatic dynamic, as a user gets it);
* ``arbiter_only_openvino``, ``arbiter_only_onnxruntime`` (named with ``--contenders``):
  one backend through arbiter (policy `priority`, eager fallback): what going through
  arbiter costs that backend here;
* ``arbiter_export_default``, ``arbiter_export_cpu_all`` (named with ``--contenders``):
  ``arbiter.export`` of the model with the sequence dimension symbolic (2..512), the
  same config: arbiter's placement without Dynamo's per-call cost (docs/deploy.md).

The first pass over the lengths is the warm-up: compiles happen there (its time is
reported). Then rounds interleave the contenders: in each round every worker in turn
runs ``--iters`` cycles over the lengths while the others sleep; the per-length median
of each round counts, and the table shows the median over rounds. Checked and printed:
max |out - eager| per contender; for arbiter, the graphs Dynamo compiled, how many times
each partition was compiled, which partitions are symbolic, and the share of compute in
eager because of shapes. Targets (issue 13): at every length arbiter at least as fast as
the best single backend (within 5%), at most 2 compiles per graph, nothing in eager that
a backend could run.
"""
from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = (32, 48, 64, 96, 128)
BATCH = 4
CONTENDERS = ["eager", "inductor", "onnxruntime", "openvino", "arbiter_default",
              "arbiter_cpu_all"]
#: one backend through arbiter (policy priority), beside that backend alone: not run by
#: default (``--contenders ... arbiter_only_openvino``)
EXTRA = ["arbiter_only_openvino", "arbiter_only_onnxruntime", "arbiter_export_default",
         "arbiter_export_cpu_all"]
SINGLE = ["eager", "inductor", "onnxruntime", "openvino"]


def build_model():
    import torch
    from transformers import BertConfig, BertModel

    from arbiter.cli.examples import _HFOutput

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=1024)
    model = _HFOutput(BertModel(cfg), "input_ids", "last_hidden_state").eval()
    g = torch.Generator().manual_seed(1)
    inputs = {n: torch.randint(0, cfg.vocab_size, (BATCH, n), generator=g) for n in LENGTHS}
    return model, inputs


def _contender(name: str, model, inputs: dict, threads: int):
    """-> (fn(length) -> tensor, info() -> str)."""
    import torch

    if name == "eager":
        return (lambda n: model(inputs[n])), (lambda: "")
    if name == "inductor":
        compiled = torch.compile(model)

        def info():
            from torch._dynamo.utils import counters

            return f"{counters['stats']['unique_graphs']} graph(s) compiled by Dynamo"
        return (lambda n: compiled(inputs[n])), info
    if name == "onnxruntime":
        import onnxruntime as ort
        from torch.export import Dim

        example = inputs[LENGTHS[0]]
        prog = torch.onnx.export(model, (example,), dynamo=True, optimize=True, verbose=False,
                                 dynamic_shapes=({1: Dim("seq", min=2, max=512)},))
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        sess = ort.InferenceSession(prog.model_proto.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        name0 = sess.get_inputs()[0].name
        shape = sess.get_inputs()[0].shape
        return (lambda n: torch.from_numpy(sess.run(None, {name0: inputs[n].numpy()})[0])), \
            (lambda: f"one session, input {shape}")
    if name == "openvino":
        import openvino as ov

        ov_model = ov.convert_model(model, example_input=(inputs[LENGTHS[0]],))
        ov_model.reshape({ov_model.inputs[0]: ov.PartialShape([BATCH, -1])})
        compiled = ov.Core().compile_model(ov_model, "CPU", {
            "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads,
            "PERFORMANCE_HINT": "LATENCY"})
        req = compiled.create_infer_request()
        shape = str(compiled.inputs[0].get_partial_shape())
        return (lambda n: torch.from_numpy(req.infer([inputs[n].numpy()])[0].copy())), \
            (lambda: f"one compiled model, input {shape}")
    if name.startswith("arbiter_"):
        import arbiter
        from arbiter.config import load_config

        rest = name[len("arbiter_"):]
        exported = rest.startswith("export_")
        rest = rest.removeprefix("export_")
        if rest.startswith("only_"):  # one backend through arbiter: what going through costs
            one = rest[len("only_"):]
            spec = {"name": one, "options": {"precision": "f32", "performance_hint": "LATENCY"}} \
                if one == "openvino" else one
            cfg = {"backends": [spec], "fallback": ["eager"], "policy": "priority"}
        else:
            cfg = load_config(rest).model_dump(exclude={"source"})
        cfg["resources"] = dict(cfg.get("resources") or {}, threads=threads)
        if exported:  # no Dynamo: one symbolic program from torch.export
            from torch.export import Dim

            program = arbiter.export(model, (inputs[LENGTHS[0]],), config=cfg,
                                     dynamic_shapes=({1: Dim("seq", min=2, max=512)},))
            return (lambda n: program(inputs[n])), (lambda: program.report().summary())
        be = arbiter.Arbiter(cfg)
        compiled = torch.compile(model, backend=be)

        def info():
            rep = be.report(advice=False)
            parts = []
            for g in rep.graphs:
                syms = ", ".join(f"{s.name}[{s.min},{s.max or 'inf'}]" for s in g.symbols)
                pieces = [f"#{p.id} {p.backend} {p.shapes}"
                          + (f" x{p.specializations}" if p.specializations else "")
                          + (f" ({len(p.fallbacks)} fallback)" if p.fallbacks else "")
                          for p in g.partitions if not p.inline]
                eager = sum(p.nodes for p in g.partitions if p.inline)
                parts.append(f"graph {g.graph_id}{' (' + syms + ')' if syms else ''}: "
                             f"{'; '.join(pieces)}; eager nodes {eager}, eager for shapes "
                             f"{g.shape_eager_share:.0%}")
            compiles = max((len(p.fallbacks) + max(p.specializations, 1)
                            for g in rep.graphs for p in g.partitions if not p.inline),
                           default=0)
            return (f"{rep.summary()} | most compiles of one partition: {compiles} | "
                    + " | ".join(parts))
        return (lambda n: compiled(inputs[n])), info
    raise ValueError(f"unknown contender {name!r}; valid: {', '.join(CONTENDERS)}")


def _worker(conn, name: str, threads: int):
    import logging
    import warnings

    import torch

    warnings.simplefilter("ignore")
    for logger in ("torch.onnx", "onnxscript", "onnx_ir", "torch.export", "torch._dynamo",
                   "arbiter"):
        logging.getLogger(logger).setLevel(logging.ERROR)
    torch.set_num_threads(threads)
    try:
        model, inputs = build_model()
        with torch.no_grad():
            t0 = time.perf_counter()
            fn, info = _contender(name, model, inputs, threads)
            firsts = {}
            for n in LENGTHS:  # the warm-up pass: every compile happens here
                s = time.perf_counter()
                out = fn(n)
                firsts[n] = (time.perf_counter() - s, out.detach().numpy().copy())
            warm_s = time.perf_counter() - t0
        conn.send(("ok", warm_s, {n: f[0] for n, f in firsts.items()},
                   {n: f[1] for n, f in firsts.items()}, info()))
    except BaseException as exc:  # reported as "not available", never hidden
        conn.send(("err", f"{type(exc).__name__}: {exc}".splitlines()[0][:300],
                   traceback.format_exc()[-3000:]))
        return
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            conn.send(("info", info()))
            return
        times = {n: [] for n in LENGTHS}
        with torch.no_grad():
            for _ in range(msg[1]):
                for n in LENGTHS:
                    s = time.perf_counter()
                    fn(n)
                    times[n].append(time.perf_counter() - s)
        conn.send(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contenders", nargs="+", default=CONTENDERS, choices=CONTENDERS + EXTRA)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=5, help="cycles over the lengths per round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900.0, help="per warm-up (s)")
    ap.add_argument("--procs", type=int, default=1,
                    help="processes per contender: the table takes the median over them of "
                         "each one's median (one process's speed moves by up to ~10%% "
                         "from another's on this machine)")
    args = ap.parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc)
    load0 = os.getloadavg()
    ctx = mp.get_context("spawn")
    workers = {}  # (name, process index) -> (process, pipe)
    results = {}
    for k in range(args.procs):
        for name in args.contenders:  # one at a time: compiles do not compete
            if k and (name, 0) not in workers:
                continue  # its first process failed: said once
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(child, name, args.threads), daemon=True)
            p.start()
            if not parent.poll(args.timeout):
                p.kill()
                results.setdefault(name, ("err", f"warm-up over {args.timeout:.0f} s", ""))
                continue
            got = parent.recv()
            results.setdefault(name, got)
            print(f"[dynamic_shapes] {name} #{k + 1}: " +
                  (f"warm-up {got[1]:.1f} s" if got[0] == "ok" else f"not available: {got[1]}"),
                  file=sys.stderr, flush=True)
            if got[0] == "ok":
                workers[(name, k)] = (p, parent)
            else:
                print(got[2], file=sys.stderr)
    per_round: dict = {key: {n: [] for n in LENGTHS} for key in workers}
    for r in range(args.rounds):
        for key, (_, conn) in workers.items():
            conn.send(("run", args.iters))
            times = conn.recv()
            for n in LENGTHS:
                per_round[key][n].append(statistics.median(times[n]))
        print(f"[dynamic_shapes] round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    infos = {}
    for (name, k), (p, conn) in workers.items():
        conn.send(("stop",))
        info = conn.recv()[1]
        infos.setdefault(name, info)
        p.join(10)
    load1 = os.getloadavg()
    print(render(args, results, per_round, infos, started, load0, load1))
    return 0


def render(args, results, per_round, infos, started, load0, load1) -> str:
    import numpy as np
    import torch

    # each process's median over rounds; a contender's: the median over its processes
    by_proc = {key: {n: statistics.median(v) for n, v in per.items()}
               for key, per in per_round.items()}
    med = {name: {n: statistics.median(m[n] for (c, _), m in by_proc.items() if c == name)
                  for n in LENGTHS} for name in {c for c, _ in by_proc}}
    eager = results.get("eager")
    lines = [f"{started:%Y-%m-%d %H:%M} UTC; {platform.machine()}, {os.cpu_count()} cores; "
             f"torch {torch.__version__}; {args.threads} threads; {args.rounds} rounds x "
             f"{args.iters} cycles; {args.procs} process(es) per contender; load average "
             f"{load0[0]:.2f} at the start, {load1[0]:.2f} at the end", "",
             "median ms per call (median over rounds of each round's median; with several "
             "processes per contender, the median of their medians); "
             "ratio = best single backend's median / contender's (above 1: faster)", ""]
    head = "| contender | " + " | ".join(f"L={n} ms" for n in LENGTHS) + \
        " | warm-up s | max err |"
    lines += [head, "|---|" + "---:|" * (len(LENGTHS) + 2)]
    best = {n: min((med[c][n] for c in SINGLE if c in med), default=None) for n in LENGTHS}
    for name in args.contenders:
        got = results.get(name)
        if got is None or got[0] != "ok":
            lines.append(f"| {name} | " + " | ".join("-" for _ in LENGTHS) +
                         f" | - | not available: {got[1] if got else '?'} |")
            continue
        err = "-"
        if eager is not None and eager[0] == "ok":
            err = f"{max(float(np.abs(got[3][n] - eager[3][n]).max()) for n in LENGTHS):.1e}"
        cells = []
        for n in LENGTHS:
            m = med[name][n] * 1e3
            ratio = f" ({best[n] / med[name][n]:.2f}x)" if best[n] and name not in SINGLE else ""
            cells.append(f"{m:.2f}{ratio}")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {got[1]:.1f} | {err} |")
    lines.append("")
    if args.procs > 1:
        for name in args.contenders:
            procs = sorted((k, m) for (c, k), m in by_proc.items() if c == name)
            if len(procs) > 1:
                lines.append(f"- {name}, each process's median (ms): " + "; ".join(
                    f"L={n} " + "/".join(f"{m[n] * 1e3:.2f}" for _, m in procs)
                    for n in LENGTHS))
    for name in args.contenders:
        if infos.get(name):
            lines.append(f"- {name}: {infos[name]}")
    for name in args.contenders:
        got = results.get(name)
        if got is not None and got[0] == "ok":
            firsts = ", ".join(f"{n}: {t:.2f}" for n, t in got[2].items())
            lines.append(f"- {name} first call per length (s): {firsts}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
