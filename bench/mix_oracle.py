"""The oracle bound of mixing at module boundaries (issue 18, item 2): how much faster than
the best single backend could ANY module-boundary mix be, by the mix machinery's own
segment timings?

    .venv/bin/python bench/mix_oracle.py --models encoder_block          # a smoke run
    .venv/bin/python bench/mix_oracle.py                                 # the zoo's six

Each model runs in its own process (``uptime`` recorded before and after each): arbiter
with cpu_all's backends (OpenVINO float32, ONNX Runtime, Inductor) plus ``eager_piece``
(eager ATen as a partition of its own: plain eager is inlined into the stitched graph, so
its segments have no piece time of their own), policy ``measure`` with ``mix`` on,
``refine`` off, a large ``time_budget_s`` and ``MIX_SPAN`` lifted, so that every segment
kind is probed on every backend, not only those within 1.5x of the fastest. The first
call times the whole-graph candidates (``only <backend>``) and the segment probes
(arbiter/measure/mix.py, probes.py: one instance of each segment kind and of each adjacent
pair kind per backend, the rest of the graph in eager, each piece's own time). The outcome's
``mix`` (``arbiter.plan.segments.SegmentTimes``) holds those times. Reported:

* best single: the fastest ``only <backend>`` whole graph, timed end to end in the
  probes' rounds (``SegmentTimes.whole_ms``: the same minutes as the segments);
* oracle: the sum over segments of the fastest backend's time for that segment, boundary
  costs ignored; ``bound`` = best single / oracle (no module-boundary mix gains more,
  boundary costs only add, as far as a segment costs in a mix what it costs alone);
* fused oracle: the same with each segment credited half the pair savings on each side
  on its backend (what keeping neighbours on one backend saves, clipped as ``_mix`` clips
  it); ``bound, fused`` = best single / fused oracle;
* ``same basis``: the smallest backend segment sum / oracle, both from the probes;
  ``same basis, fused``: the smallest fused sum / fused oracle (the loosest bound of the
  DP's own cost model); ``DP gain``: the smallest fused sum / the DP's prediction
  (boundaries priced);
* per segment kind: each backend's time, the winner and its margin over the runner-up
  and over the best whole-graph backend on that kind; the fused oracle's and the DP's
  placements, and the mixed candidate's end-to-end time if ``_mix`` built one.

Results and their reading: bench/README.md "mix_oracle.py".
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the zoo's six, in the order the brief asks for when time is short
MODELS = ["distilbert", "bert_base", "resnet50", "t5_small_encoder", "vit_base",
          "gpt2_small"]
EAGER_PIECE = "eager_piece"


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "uptime unavailable"


# -- worker: one model ---------------------------------------------------------------------

def _register_eager_piece(tmp: Path) -> None:
    """Eager ATen as a backend whose partitions are pieces (timed like any other)."""
    from arbiter.registry import get_backend_class, register_backend

    Eager = get_backend_class("eager")

    manifest = tmp / f"{EAGER_PIECE}.yaml"
    manifest.write_text(Eager.manifest_path().read_text().replace(
        "backend: eager", f"backend: {EAGER_PIECE}", 1))

    class EagerPiece(Eager):
        name = EAGER_PIECE
        inline_aten = False

        @classmethod
        def manifest_path(cls):
            return manifest

    register_backend(EagerPiece)


def run_one(model_name: str, threads: int, budget_s: float, repeats: int) -> dict:
    import logging

    import torch

    import arbiter
    import arbiter.measure.mix as mix
    from arbiter.cli import examples
    from arbiter.config import load_config

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("arbiter.measure").setLevel(logging.INFO)
    for name in ("torch.onnx", "onnxscript", "onnx_ir", "torch.export", "torch._dynamo"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(threads)
    tmp = Path(tempfile.mkdtemp(prefix="mix-oracle-"))
    _register_eager_piece(tmp)
    mix.MIX_SPAN = math.inf  # probe every backend, not only those near the fastest
    mix.MIX_WHOLE = 99  # and time every whole-graph candidate in the probes' rounds

    cfg = load_config("cpu_all").model_dump(exclude={"source"})
    cfg["backends"] = list(cfg["backends"]) + [EAGER_PIECE]
    cfg["resources"] = dict(cfg.get("resources") or {}, threads=threads)
    cfg["policy"] = "measure"
    cfg["measure"] = dict(cfg.get("measure") or {}, time_budget_s=budget_s, refine=False,
                          mix=True, repeats=repeats)
    cfg["cache"] = dict(cfg.get("cache") or {}, dir=str(tmp / "cache"))
    model, args = examples.load_model(model_name)
    be = arbiter.Arbiter(cfg)
    compiled = torch.compile(model, backend=be)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = compiled(*args)
        first_s = time.perf_counter() - t0
        ref = model(*args)
    err = float((out - ref).abs().max())
    graphs = []
    for g in be._graphs:  # noqa: SLF001 - a bench reads the raw records
        o = g.outcome
        times = o.mix
        entry = {"graph": g.graph_id, "chosen": o.chosen,
                 "candidates_ms": {k: v for k, v in o.candidates_ms.items()}}
        if times is not None:
            segs = times.segments
            label = {}  # a kind's name: its first instance, as measure/mix.py logs it
            for s in segs:
                label.setdefault(s.kind, f"{s.cls or 'top level'}@{s.index}")
            single: dict = {}
            for (k, b), ms in times.single_ms.items():
                single.setdefault(label[k], {})[b] = ms
            pair: dict = {}
            for ((k1, k2), b), ms in times.pair_ms.items():
                pair.setdefault(f"{label[k1]}|{label[k2]}", {})[b] = ms
            entry.update({"depth": times.depth, "seq": [label[s.kind] for s in segs],
                          "single": single, "pair": pair, "whole_ms": dict(times.whole_ms),
                          "dp_path": list(times.path), "dp_predicted_ms": times.predicted_ms,
                          "oracle_ms_core": times.oracle_ms()})
        graphs.append(entry)
    return {"model": model_name, "first_call_s": first_s, "max_err": err, "graphs": graphs,
            "threads": threads, "budget_s": budget_s}


# -- parent: one process per model, a table ---------------------------------------------

def analyse(g: dict) -> dict:
    """The oracle numbers of one graph's raw probe times (``run_one``'s entry)."""
    seq, single, pair = g["seq"], g["single"], g["pair"]
    n = len(seq)
    backends = sorted({b for row in single.values() for b in row})

    def saving(i: int, b: str) -> float:
        """What keeping segments i and i + 1 together on b saves, clipped as
        measure/mix.py's ``chain_costs`` clips it (0 to the smaller one's time)."""
        one, two = single[seq[i]].get(b), single[seq[i + 1]].get(b)
        both = pair.get(f"{seq[i]}|{seq[i + 1]}", {}).get(b)
        if None in (one, two, both):
            return 0.0
        return max(0.0, min(min(one, two), one + two - both))

    plain = [dict(single[k]) for k in seq]
    fused = [{b: ms - 0.5 * ((saving(i - 1, b) if i > 0 else 0.0)
                             + (saving(i, b) if i + 1 < n else 0.0))
              for b, ms in single[k].items()} for i, k in enumerate(seq)]

    def total(rows, b):
        return sum(r[b] for r in rows) if all(b in r for r in rows) else None

    plain_sum = {b: total(plain, b) for b in backends if total(plain, b) is not None}
    fused_sum = {b: total(fused, b) for b in backends if total(fused, b) is not None}
    oracle = sum(min(r.values()) for r in plain)
    fused_oracle = sum(min(r.values()) for r in fused)
    # per segment kind, the backend of the fused oracle (the kind's instances may differ:
    # their neighbours' savings differ) -> count
    fused_won: dict = {}
    for k, r in zip(seq, fused):
        b = min(r, key=r.get)
        fused_won[(k, b)] = fused_won.get((k, b), 0) + 1
    rounds = {k[len("only "):]: v for k, v in g["candidates_ms"].items()
              if k.startswith("only ") and v is not None}
    # the whole graphs as timed in the probes' rounds (same time, same load); the
    # measure rounds' times (earlier) when none was timed there
    whole = {k[len("only "):]: v for k, v in g.get("whole_ms", {}).items()
             if k.startswith("only ")} or rounds
    best_b = min(whole, key=whole.get)
    kinds = []
    for k in dict.fromkeys(seq):
        ms = single[k]
        order = sorted(ms, key=ms.get)
        kinds.append({"kind": k, "count": seq.count(k), "ms": ms, "winner": order[0],
                      "vs_runner_up": ms[order[1]] / ms[order[0]] if len(order) > 1
                      else math.nan,
                      "vs_best_single": ms.get(best_b, math.nan) / ms[order[0]]})
    return {"best": best_b, "best_ms": whole[best_b], "whole": whole, "measure_rounds": rounds,
            "oracle_ms": oracle, "bound": whole[best_b] / oracle,
            "fused_bound": whole[best_b] / fused_oracle,
            "plain_sum": plain_sum, "fused_sum": fused_sum, "fused_oracle_ms": fused_oracle,
            "same_plain": min(plain_sum.values()) / oracle if plain_sum else None,
            "same_fused": min(fused_sum.values()) / fused_oracle if fused_sum else None,
            "dp_gain": (min(fused_sum.values()) / g["dp_predicted_ms"]
                        if fused_sum and g["dp_predicted_ms"] else None),
            "fused_won": [f"{k} x{c} on {b}" for (k, b), c in fused_won.items()],
            "segments": n, "depth": g["depth"], "kinds": kinds,
            "dp_predicted_ms": g["dp_predicted_ms"],
            "dp_path": g["dp_path"], "chosen": g["chosen"],
            "mix_ms": {k: v for k, v in g["candidates_ms"].items() if k.startswith("mix: ")}}


def summarize(res: dict) -> dict:
    """The row of one model: its graph with the most probed segments."""
    gs = [g for g in res["graphs"] if g.get("seq")]
    if not gs:
        return {"model": res["model"], "note": "no segment probes (mixing skipped?)"}
    g = max(gs, key=lambda g: len(g["seq"]))
    return {"model": res["model"], "seq": g["seq"], **analyse(g)}


def render(rows: list[dict], loads: dict, cmd: str) -> str:
    def f(x, d=1):
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"

    def ms_list(d):
        return ", ".join(f"{b} {v:.1f}" for b, v in sorted(d.items(), key=lambda kv: kv[1]))

    lines = (["```sh", cmd, "```", ""] if cmd else []) + [
        "| model | best single (whole graph) | its ms | oracle sum ms | bound | bound, fused "
        "| same basis | same basis, fused | DP gain | segments (depth) | DP predicted ms / "
        "mixed candidate ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        if "best" not in r:
            lines.append(f"| {r['model']} | - | - | - | - | - | - | - | - | - | "
                         f"{r.get('note', '')} |")
            continue
        mix = "; ".join(f"{v:.1f}" if v is not None else "not timed"
                        for v in r["mix_ms"].values()) or "not built"
        lines.append(f"| {r['model']} | {r['best']} | {f(r['best_ms'])} | {f(r['oracle_ms'])} "
                     f"| {f(r['bound'], 2)}x | {f(r['fused_bound'], 2)}x | "
                     f"{f(r['same_plain'], 2)}x | "
                     f"{f(r['same_fused'], 2)}x | {f(r['dp_gain'], 2)}x | "
                     f"{r['segments']} ({r['depth']}) | "
                     f"{f(r['dp_predicted_ms'])} / {mix} |")
    done = [r for r in rows if "best" in r]
    if len(done) > 1:
        def geo(key):
            xs = [r[key] for r in done if r.get(key)]
            return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None
        lines.append(f"| geomean ({len(done)}) | | | | {f(geo('bound'), 2)}x | "
                     f"{f(geo('fused_bound'), 2)}x | "
                     f"{f(geo('same_plain'), 2)}x | {f(geo('same_fused'), 2)}x | "
                     f"{f(geo('dp_gain'), 2)}x | | |")
    lines += ["", "Per model: whole-graph ms (in the probes' rounds; in measure's earlier "
              "rounds), each backend's segment sum (plain; fused: less the pair savings), "
              "and per segment kind each backend's ms per instance, the winner, its margin "
              "over the runner-up and over the best whole-graph backend on that kind.", ""]
    for r in rows:
        if "best" not in r:
            continue
        lines.append(f"- **{r['model']}** (load {loads.get(r['model'], '?')}): whole "
                     f"{ms_list(r['whole'])}; earlier {ms_list(r['measure_rounds'])}; "
                     f"segment sums {ms_list(r['plain_sum'])}; fused "
                     f"{ms_list(r['fused_sum'])}, fused oracle {f(r['fused_oracle_ms'])}")
        for k in r["kinds"]:
            ms = ", ".join(f"{b} {v:.3f}" for b, v in sorted(k["ms"].items(),
                                                             key=lambda kv: kv[1]))
            lines.append(f"  - {k['kind']} x{k['count']}: {ms} -> **{k['winner']}**, "
                         f"{f(k['vs_runner_up'], 2)}x the runner-up, "
                         f"{f(k['vs_best_single'], 2)}x {r['best']}")
        path: dict = {}
        for k, b in zip(r.get("seq", []), r["dp_path"]):
            path[(k.split("@")[0], b or "as planned")] = \
                path.get((k.split("@")[0], b or "as planned"), 0) + 1
        where = ", ".join(f"{k} x{c} on {b}" for (k, b), c in path.items())
        lines.append(f"  - fused oracle: {', '.join(r['fused_won'])}")
        lines.append(f"  - DP: {where or 'no placement'}, predicted "
                     f"{f(r['dp_predicted_ms'], 1)} ms; measure chose {r['chosen']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=MODELS)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--budget", type=float, default=900.0, help="measure.time_budget_s")
    p.add_argument("--repeats", type=int, default=7, help="measure.repeats")
    p.add_argument("--timeout", type=float, default=1500.0, help="seconds per model")
    p.add_argument("--json", default="", help="write the raw results here")
    p.add_argument("--omp-passive", action="store_true",
                   help="OMP_WAIT_POLICY=PASSIVE in the model processes (torch's OpenMP "
                        "threads sleep at barriers instead of spinning: on a loaded machine "
                        "spinning slows eager and Inductor several times, bench/README.md)")
    p.add_argument("--from", dest="saved", nargs="+", default=[],
                   help="render these per-model JSON files (written by earlier runs' "
                        "model processes, --keep) instead of running")
    p.add_argument("--keep", default="", help="a folder for each model's raw JSON")
    p.add_argument("--one", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.saved:
        res = [json.loads(Path(x).read_text()) for x in args.saved]
        rows = [summarize(r) for r in res]
        loads = {r["model"]: " -> ".join(u.split("load average:")[-1].strip()
                                         for u in r.get("uptime", [])) for r in res}
        print(render(rows, loads, ""))
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    if args.omp_passive:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    if args.one:
        res = run_one(args.one, args.threads, args.budget, args.repeats)
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
        return 0
    rows, loads, raw = [], {}, []
    for m in args.models:
        before = _uptime()
        out = Path(tempfile.mkstemp(prefix=f"mix-oracle-{m}-", suffix=".json",
                                    dir=args.keep or None)[1])
        print(f"[{m}] start {before}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, __file__, "--one", m, "--json", str(out),
                                   "--threads", str(args.threads), "--budget", str(args.budget),
                                   "--repeats", str(args.repeats)],
                                  timeout=args.timeout, cwd=ROOT)
            ok = proc.returncode == 0
        except subprocess.TimeoutExpired:
            ok = False
        after = _uptime()
        loads[m] = f"{before.split('load average:')[-1].strip()} -> " \
                   f"{after.split('load average:')[-1].strip()}"
        print(f"[{m}] end {after} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
              flush=True)
        if not ok or not out.stat().st_size:
            rows.append({"model": m, "note": "failed (see stderr)"})
            continue
        res = json.loads(out.read_text())
        res["uptime"] = [before, after]
        out.write_text(json.dumps(res, indent=1, default=str))
        raw.append(res)
        rows.append(summarize(res))
        print(render(rows[-1:], loads, ""), flush=True)
    cmd = ".venv/bin/python bench/mix_oracle.py " + " ".join(sys.argv[1:])
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"\n{stamp}; {os.cpu_count()} cores; threads {args.threads}; OMP_WAIT_POLICY "
          f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}\n")
    print(render(rows, loads, cmd))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "raw": raw, "loads": loads},
                                              indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
