"""Calibrate policy `cost` (arbiter/plan/cost.py): write arbiter/plan/cost_table.yaml.

    .venv/bin/python bench/calibrate_cost.py [--backends eager onnxruntime inductor]
                                             [--out arbiter/plan/cost_table.yaml] [--rounds 30]

Per backend, four tiny ATen graphs are compiled with the backend's own ``compile`` (eager
runs the graph in place) and timed, the minimum of ``--rounds`` rounds of an inner loop:

* ``x + 1`` on 8 floats: the per-call cost (``call_us``; 0 for eager, which runs in place,
  whose cost is then all per node);
* 16 chained tiny ops minus 1: per-node cost (``node_us``; fusing backends come out ~0);
* a 256x256x256 matmul, minus the call: ``gflops``;
* ``x * 2`` on 1M floats (8 MB moved), minus the call: ``gbps``.

``boundary_us`` (per tensor crossing a compiled partition) is the difference between a
call with 8 inputs and a call with 1, over 7, on the first compiled backend.
Machines shared with other work give noisy numbers: the table records the load.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import arbiter
from arbiter.registry import get_backend_class


def _time_us(fn, args, rounds: int) -> float:
    # Warm up for 50 ms: the first heavy calls of a process (torch's first matmul, say)
    # measured 100x slower than later ones, for every round of a first timing.
    end = time.perf_counter() + 0.05
    while time.perf_counter() < end:
        fn(*args)
    n, t = 1, 0.0
    while t < 0.002:  # short rounds: more of them run undisturbed on a busy machine
        n *= 2
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*args)
        t = time.perf_counter() - t0
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*args)
        samples.append((time.perf_counter() - t0) / n * 1e6)
    # The minimum, not the median: on a shared machine noise only ever adds time, and
    # the table should describe the machine, not its neighbours.
    return min(samples)


def _chain(k):
    def f(x):
        for i in range(k):
            x = x * 1.0001 if i % 2 else x + 0.5
        return (x,)
    return f


def _many(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return (out,)


def _compiled(name: str, fn, args):
    gm = make_fx(fn, tracing_mode="fake")(*args)
    cls = get_backend_class(name)
    if cls.inline_aten:
        return gm
    return cls(cls.Options()).compile(gm, list(args))


def calibrate(name: str, rounds: int) -> dict:
    tiny = (torch.randn(8),)
    call = _time_us(_compiled(name, _chain(1), tiny), tiny, rounds)
    chain = _time_us(_compiled(name, _chain(16), tiny), tiny, rounds)
    node = max(0.0, (chain - call) / 15)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    mm = _time_us(_compiled(name, lambda a, b: (a @ b,), (a, b)), (a, b), rounds)
    big = (torch.randn(1 << 20),)
    ew = _time_us(_compiled(name, lambda x: (x * 2.0,), big), big, rounds)
    inline = get_backend_class(name).inline_aten
    base = node if inline else call
    return {"call_us": 0.0 if inline else round(call, 2), "node_us": round(node if not inline else call, 2),
            "gflops": round(2 * 256 ** 3 / max(mm - base, 1e-3) / 1e3, 2),
            "gbps": round(8 * (1 << 20) / max(ew - base, 1e-3) / 1e3, 2)}


def boundary_us(name: str, rounds: int) -> float:
    one = (torch.randn(8),)
    eight = tuple(torch.randn(8) for _ in range(8))
    t1 = _time_us(_compiled(name, _many, one), one, rounds)
    t8 = _time_us(_compiled(name, _many, eight), eight, rounds)
    return max(0.0, (t8 - t1) / 7)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="*", default=None)
    ap.add_argument("--out", default=str(Path(arbiter.__file__).parent / "plan" / "cost_table.yaml"))
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args(argv)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    # The process's first heavy torch ops are slow: here a 256^3 matmul ran at 20-30 ms
    # (not 0.18 ms) in every round, directly or through a traced graph, until a second
    # make_fx trace had run; the cause is unknown (torch's OpenMP pool under a loaded
    # machine?). Two throwaway traces and half a second of work come before any timing.
    warm = torch.randn(512, 512)
    for _ in range(2):
        _compiled("eager", lambda a, b: (a @ b,), (warm, warm))
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:
        warm @ warm
        warm * 2.0
    names = args.backends or [n for n in arbiter.backend_names()
                              if get_backend_class(n)(None).available()[0]]
    rows: dict = {}
    # Two passes over the backends, the best of each number kept: a pass can still hit
    # the slow state described above for one op (eager's matmul did, in the first pass).
    for attempt in range(2):
        for name in names:
            print(f"calibrating {name} (pass {attempt + 1}) ...", file=sys.stderr, flush=True)
            row = calibrate(name, args.rounds)
            old = rows.get(name)
            if old is not None:
                row = {k: (min if k.endswith("_us") else max)(row[k], old[k]) for k in row}
            rows[name] = row
            print(f"  {row}", file=sys.stderr, flush=True)
    compiled = [n for n in names if not get_backend_class(n).inline_aten]
    bnd = round(boundary_us(compiled[0], args.rounds), 2) if compiled else 1.0
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    cores = os.cpu_count() or 1
    state = "quiet" if load < cores else "busy: noisy numbers"
    lines = [
        "# Per-backend constants of policy `cost` (arbiter/plan/cost.py).",
        f"# Written by: python bench/calibrate_cost.py --rounds {args.rounds}",
        f"# on {datetime.date.today()}, torch {torch.__version__}, {os.cpu_count()} cores, "
        f"{torch.get_num_threads()} threads, load average {load:.2f} ({state}).",
        "# call_us: per call of a compiled partition; node_us: per node; gflops: matmul and",
        "# convolution rate; gbps: bytes moved by other ops; boundary_us: per tensor crossing.",
        "format: 1",
        f"boundary_us: {bnd}",
        "default: {call_us: 30.0, node_us: 2.0, gflops: 20.0, gbps: 5.0}",
        "backends:",
    ]
    for name, r in rows.items():
        lines.append(f"  {name}: {{call_us: {r['call_us']}, node_us: {r['node_us']}, "
                     f"gflops: {r['gflops']}, gbps: {r['gbps']}}}")
    lines += _compile_section(args.out)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _compile_section(path: str) -> list[str]:
    """The existing table's ``compile`` rows and the comment above them, as they are (they
    are measured apart, not by this script)."""
    try:
        text = Path(path).read_text().splitlines()
    except OSError:
        return []
    start = next((i for i, ln in enumerate(text) if ln.startswith("compile:")), None)
    if start is None:
        return []
    head = start
    while head > 0 and text[head - 1].startswith("#"):
        head -= 1
    return text[head:]


if __name__ == "__main__":
    sys.exit(main())
