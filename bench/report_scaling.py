"""How long the capability report takes as graphs grow: build, advice, text, JSON, HTML.

Uses partition_scaling.py's synthetic graphs (3 backends; in each block of 50 nodes 10 are
pinned to inductor and 1 runs only in eager). For each size: plan once, then time
(median of --repeats, wall clock):

* build: the report's graph record from the plan (``arbiter.report.from_record.graph_report``: per-op
  table, coverage, boundaries with bytes, the node list for drawing)
* advice: replanning for min_block_size 1..8 and for the ops on the fallback
* json: ``model_dump_json``; text: the rich tables (100 columns); html: ``render_html``
  (its size is printed too)

Target (issue 3: "large graphs stay usable"): report + HTML of a 5,000-node graph within
a few seconds, growing linearly.

    .venv/bin/python bench/report_scaling.py [--sizes 1000 5000 20000] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import arbiter  # noqa: E402
from arbiter.plan.policy import PolicyOutcome  # noqa: E402
from arbiter.report.from_record import graph_report  # noqa: E402
from arbiter.run.record import GraphRecord  # noqa: E402
from arbiter.plan.capability import MUTATES, NOT_ATEN, RANDOM, SCALAR  # noqa: E402
from arbiter.report import Report  # noqa: E402
from arbiter.report.advice import advise  # noqa: E402
from arbiter.report.html import render_html  # noqa: E402
from arbiter.report.text import render  # noqa: E402
from arbiter.run.piece import PieceRecord  # noqa: E402
from partition_scaling import CONFIG, _Light, build_graph  # noqa: E402


def median_time(fn, repeats: int):
    runs, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 20000])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with FakeTensorMode():
        fake = torch.empty(8, 16)
    print(f"torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}; "
          f"{os.cpu_count()} cpus; median of {args.repeats}")
    print(f"{'nodes':>7} {'parts':>6} {'build s':>8} {'advice s':>9} {'json s':>7} "
          f"{'text s':>7} {'html s':>7} {'html MB':>8}")
    for n in args.sizes:
        be = arbiter.Arbiter(CONFIG, dry_run=True)
        plan = be.plan(_Light(build_graph(n, fake)))
        records = {p.id: PieceRecord(p.id, p.backend, [p.backend]) for p in plan.partitions}
        rec = GraphRecord(0, "inference", plan, records, PolicyOutcome(), 0.0)
        t_build, g = median_time(lambda: graph_report(rec, be.backends), args.repeats)
        t_adv, tips = median_time(lambda: advise([plan], be.planner.table, CONFIG["min_block_size"],
                                                 (MUTATES, NOT_ATEN, RANDOM, SCALAR)),
                                  args.repeats)
        rep = Report(dry_run=True, graphs=[g], advice=tips)
        t_json, _ = median_time(rep.model_dump_json, args.repeats)
        t_text, _ = median_time(lambda: render(rep), args.repeats)
        t_html, page = median_time(lambda: render_html(rep), args.repeats)
        print(f"{n:>7} {len(plan.partitions):>6} {t_build:>8.3f} {t_adv:>9.3f} {t_json:>7.3f} "
              f"{t_text:>7.3f} {t_html:>7.3f} {len(page) / 1e6:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
