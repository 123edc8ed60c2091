"""`arbiter report MODEL`: what runs where, as tables, JSON and a self-contained HTML page.

    arbiter report mlp                                # compile, run once, print the tables
    arbiter report mlp --dry-run                      # plan only: nothing compiles
    arbiter report my_model.py:build --json r.json --html r.html
    arbiter report mlp --config a.yaml --config b.yaml  # side by side
    arbiter report mlp --time 50                      # time 50 calls: per-partition times

MODEL is a built-in example or ``path/to/file.py:factory`` (a function returning
``(model, example_inputs)``). Compile progress (one line per partition) goes to stderr.
"""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path


def add_arguments(parser) -> None:
    import argparse

    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # keep the examples' lines
    parser.add_argument("model", help="built-in example name, or path/to/file.py:factory")
    parser.add_argument("--config", action="append", default=None,
                        help="config file or shipped name; repeat to compare side by side")
    parser.add_argument("--json", metavar="PATH", help="write the report(s) as JSON")
    parser.add_argument("--html", metavar="PATH", help="write a self-contained HTML page")
    parser.add_argument("--dry-run", action="store_true",
                        help="plan only (arbiter.explain): nothing is compiled")
    parser.add_argument("--time", type=int, default=0, metavar="N",
                        help="after compiling, time N calls (per-partition times and shares)")
    parser.add_argument("--train", action="store_true",
                        help="trace with gradients: forward and backward graphs "
                             "(default: inference: model.eval(), under torch.no_grad)")
    parser.add_argument("--no-breaks", action="store_true",
                        help="leave Dynamo's graph breaks (counted while compiling) out")
    parser.add_argument("--width", type=int, default=100, help="terminal width of the tables")
    parser.add_argument("--quiet", action="store_true", help="no compile progress on stderr")


class _Progress(logging.Handler):
    """Prints the runtime's compile and fallback messages, numbered, to stderr."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if record.levelno == logging.INFO and ": compiling with " in msg:
            self.count += 1
            msg = f"[{self.count}] {msg}"
        print(f"arbiter: {msg}", file=sys.stderr, flush=True)


def _attach_progress(quiet: bool):
    logger = logging.getLogger("arbiter.run.piece")
    saved = (logger.level, logger.propagate)
    handler = _Progress()
    if not quiet:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False  # one line each, not also through the root handler

    def detach():
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
    return detach


def _label(spec, k: int) -> str:
    if spec is None:
        return "default"
    name = Path(str(spec)).stem if str(spec).endswith((".yaml", ".yml")) else str(spec)
    return name or f"config {k}"


def build_report(model, inputs, config, *, dry_run: bool, train: bool, time_calls: int,
                 label: str = ""):
    """One report for ``model`` under ``config`` (compiled and run unless ``dry_run``)."""
    import torch

    from ..arbiter import Arbiter
    from ..dryrun import explain, flatten_outputs
    from ..report import TimingReport

    grad = torch.enable_grad() if train else torch.no_grad()
    torch._dynamo.reset()
    if dry_run:
        with grad:
            report = explain(model, *inputs, config=config, backward=train)
    else:
        be = Arbiter(config)
        compiled = torch.compile(model, backend=be)
        with grad:
            out = compiled(*inputs)
            if train:
                flat = [t for t in flatten_outputs(out)
                        if isinstance(t, torch.Tensor) and t.requires_grad]
                if flat:
                    torch.autograd.backward(flat, [torch.ones_like(t) for t in flat])
            timing = None
            if time_calls > 0:
                be.set_timing(True)
                start = time.perf_counter()
                for _ in range(time_calls):
                    compiled(*inputs)
                total = time.perf_counter() - start
                be.set_timing(False)
        report = be.report()  # this Arbiter compiled this model only
        if time_calls > 0:
            pieces = sum(p.run_s for g in report.graphs for p in g.partitions)
            timing = TimingReport(
                calls=time_calls, total_s=round(total, 6), pieces_s=round(pieces, 6),
                note="forward calls only; the rest of each call is inline (eager) "
                     "partitions, stitching and Dynamo's guards")
        report.timing = timing
    report.label = label
    return report


def run(args) -> int:
    import torch

    from ..report.text import render
    from .examples import load_model

    model, inputs = load_model(args.model)
    inputs = tuple(inputs)
    if not args.train and isinstance(model, torch.nn.Module):
        model.eval()  # inference: dropout off, batch norm on running statistics
    configs = args.config or [None]
    reports = []
    detach = _attach_progress(args.quiet)
    try:
        for k, cfg in enumerate(configs):
            r = build_report(model, inputs, cfg, dry_run=args.dry_run, train=args.train,
                             time_calls=args.time, label=_label(cfg, k))
            r.model = args.model
            if args.no_breaks:
                r.graph_breaks = None
            reports.append(r)
    finally:
        detach()
    sys.stdout.write(render(reports, width=args.width, color=sys.stdout.isatty()))
    if args.json:
        from ..report import Report

        path = Path(args.json)
        if len(reports) == 1:
            path.write_text(reports[0].model_dump_json(indent=1))
        else:  # a list of reports: the schema's `items`
            import json

            path.write_text(json.dumps([r.model_dump(mode="json") for r in reports], indent=1))
        print(f"wrote {path} (schema: docs/report.schema.json, version "
              f"{Report.model_fields['schema_version'].default})", file=sys.stderr)
    if args.html:
        from ..report.html import render_html

        Path(args.html).write_text(render_html(reports), encoding="utf-8")
        print(f"wrote {args.html}", file=sys.stderr)
    return 0
