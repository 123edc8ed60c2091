"""`arbiter report MODEL`: what runs where, as tables, JSON and a self-contained HTML page.

    arbiter report mlp                                # compile, run once, print the tables
    arbiter report mlp --dry-run                      # plan only: nothing compiles
    arbiter report my_model.py:build --json r.json --html r.html
    arbiter report mlp --config a.yaml --config b.yaml  # side by side
    arbiter report mlp --time 50                      # time 50 calls: per-partition times
    arbiter report mlp --explorer plan                # plan.json + node data: Model Explorer

MODEL is a built-in example (below) or path/to/file.py:factory (a function returning
(model, example_inputs)), or a program saved by `arbiter export` (its saved report, with
nothing compiled or loaded). Training or inference: as the model is (model.training; the
built-in examples are in eval mode), --train or --inference overrides. Progress (loading,
tracing, a bar of partitions compiled, timing) and warnings go to stderr (rich on a
terminal, plain lines elsewhere). Off a terminal (a file, a pipe) the tables are as wide
as their cells up to 100 columns, wrapped between words, never inside one (wider where a
table's words need it), and no line ends in spaces; explain and demo write alike.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Optional


def add_arguments(parser) -> None:
    from .models import MODEL_ARG, add_mode_arguments, models_epilog

    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # keep the examples' lines
    parser.epilog = models_epilog()
    parser.add_argument("model", metavar="MODEL", help=MODEL_ARG)
    parser.add_argument("--config", action="append", default=None,
                        help="config file or shipped name; repeat to compare side by side")
    parser.add_argument("--json", metavar="PATH", help="write the report(s) as JSON")
    parser.add_argument("--html", metavar="PATH", help="write a self-contained HTML page")
    parser.add_argument("--explorer", metavar="STEM",
                        help="write STEM.json (graphs) and STEM.backends.json, "
                             "STEM.fallbacks.json (node data) for Google's Model Explorer")
    parser.add_argument("--dry-run", action="store_true",
                        help="plan only (arbiter.explain): nothing is compiled")
    parser.add_argument("--time", type=_calls, default=0, metavar="N",
                        help="after compiling, time N calls (per-partition times and shares)")
    add_mode_arguments(parser)
    parser.add_argument("--no-breaks", action="store_true",
                        help="leave Dynamo's graph breaks (counted while compiling) out")
    parser.add_argument("--width", type=int, default=None,
                        help="width of the tables (default: the terminal's; off a terminal "
                             "100, tables only as wide as their cells)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _calls(text: str) -> int:
    """``--time``'s N: a count of calls, 0 or more."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of calls") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n}: a number of calls is 0 or more")
    return n


def config_label(spec, k: int = 0) -> str:
    """How a report names the config ``spec`` (a shipped name, a file's stem), the same
    in every command."""
    if spec is None:
        return "default"
    name = Path(str(spec)).stem if str(spec).endswith((".yaml", ".yml")) else str(spec)
    return name or f"config {k}"


def build_report(model, inputs, config, *, dry_run: bool, train: bool, time_calls: int,
                 label: str = "", progress=None):
    """One report for ``model`` under ``config`` (compiled and run unless ``dry_run``)."""
    import torch

    from ..arbiter import Arbiter
    from ..config import load_config
    from ..dryrun import explain, flatten_outputs
    from ..report import TimingReport
    from .progress import Progress

    progress = progress or Progress(quiet=True)
    grad = torch.enable_grad() if train else torch.no_grad()
    torch._dynamo.reset()
    progress.stage(f"{label or 'config'}: tracing (Dynamo, AOTAutograd), planning"
                   + ("" if dry_run else ", compiling"))
    if dry_run:
        with grad:
            report = explain(model, *inputs, config=config, backward=train)
    else:
        config = load_config(config)
        config.measure.progress = False  # measuring shows in this command's progress
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
                progress.stage(f"{label or 'config'}: timing {time_calls} calls", time_calls)
                be.set_timing(True)
                total = 0.0
                for _ in range(time_calls):
                    start = time.perf_counter()
                    compiled(*inputs)
                    total += time.perf_counter() - start
                    progress.advance(f"{label or 'config'}: timing {time_calls} calls")
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
    from ..deploy.archive import writable

    configs = args.config or [None]
    for flag, path in (("--json", args.json), ("--html", args.html),
                       ("--explorer", args.explorer and args.explorer + ".json")):
        if path:
            writable(path, flag)
    reports = []
    if _saved_program(args.model):  # a file `arbiter export` / Program.save wrote
        from ..deploy.report import saved_report
        from ..errors import ArbiterError

        given = [flag for flag, on in (("--config", args.config), ("--dry-run", args.dry_run),
                                       ("--time", args.time)) if on]
        if given:  # what the saved program holds is read, nothing is compiled or run
            raise ArbiterError(f"{args.model}: a saved program's report is read as it was "
                               f"saved; {' and '.join(given)} "
                               f"{'does' if len(given) == 1 else 'do'} not apply (arbiter.load "
                               "with a config compiles it again: docs/deploy.md)")

        reports.append(saved_report(args.model))
    else:
        _compile_reports(args, configs, reports)
    _write(args, reports)
    return 0


def _saved_program(spec: str) -> bool:
    """Whether ``spec`` names a saved program: a file ending in ``.arbiter`` (existing or
    not: its errors are a file's, not an unknown model's), or any other existing file that
    is not Python (read as one, so a truncated or foreign file is named as such)."""
    if spec.endswith(".arbiter"):
        return True
    return Path(spec).is_file() and not spec.endswith(".py") and ":" not in spec


def _compile_reports(args, configs, reports) -> None:
    from .examples import load_model, users_errors
    from .models import choose_mode
    from .progress import Progress

    with Progress(quiet=args.quiet, verbose=getattr(args, "verbose", False)) as progress:
        progress.stage(f"loading {args.model}")
        model, inputs = load_model(args.model)
        inputs = tuple(inputs)
        train, line = choose_mode(model, args)
        progress.note(line)
        for k, cfg in enumerate(configs):
            with users_errors(model, inputs, args.model, train):
                r = build_report(model, inputs, cfg, dry_run=args.dry_run, train=train,
                                 time_calls=args.time, label=config_label(cfg, k),
                                 progress=progress)
            r.model = args.model
            if args.no_breaks:
                r.graph_breaks = None
            reports.append(r)


def named(report, model: str, config) -> Any:
    """``report`` named as every command names it: the MODEL argument and the config's
    ``config_label`` (not the model's class and the config's path)."""
    report.model = model
    report.label = config_label(config)
    return report


def write_text(reports, width: Optional[int] = None) -> None:
    """The text report on stdout, as every command writes it: a terminal's width (at
    most 100) and colors there, else 100 columns where the tables' words allow."""
    from ..report.text import render

    tty = sys.stdout.isatty()
    width = width or (min(100, shutil.get_terminal_size().columns) if tty else 100)
    sys.stdout.write(render(reports, width=width, color=tty, fit=tty))


def _write(args, reports) -> None:
    write_text(reports, args.width)
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
    if args.explorer:
        from ..report.explorer import write_explorer

        paths = write_explorer(reports, args.explorer)
        print(f"wrote {', '.join(map(str, paths))} (model-explorer {paths[0]} "
              f"--node_data_paths={paths[1]},{paths[2]})", file=sys.stderr)
