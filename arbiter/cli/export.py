"""`arbiter export MODEL --out PATH`: export, compile and save a model (docs/deploy.md).

    arbiter export my_model.py:build --out model.arbiter
    arbiter export my_model.py:build --out model.arbiter --config cpu_all --dynamic 0.0=2:64

MODEL is a built-in example or path/to/file.py:factory, a function returning (model,
example_inputs); the model is exported in eval mode, for inference (arbiter.export).
--dynamic ARG.DIM=MIN:MAX makes dimension DIM of positional input ARG a symbol with that
range (repeat it; one range per input dimension, each its own symbol). `arbiter report
PATH` then reads the saved program's report.
"""
from __future__ import annotations

import sys
import time


def add_arguments(parser) -> None:
    import argparse

    from .models import MODEL_ARG, models_epilog

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = models_epilog()
    parser.add_argument("model", metavar="MODEL", help=MODEL_ARG)
    parser.add_argument("--out", required=True, metavar="PATH", help="the file to write")
    parser.add_argument("--config", default=None,
                        help="config file or shipped name; default: the embedded default")
    parser.add_argument("--dynamic", action="append", default=[], metavar="ARG.DIM=MIN:MAX",
                        help="a symbolic dimension of a positional input, with its range")


def dynamic_shapes(specs: list[str], n_args: int):
    """``--dynamic`` values -> torch.export's dynamic_shapes (a tuple per positional arg)."""
    import re

    import torch

    from ..errors import ArbiterError

    if not specs:
        return None
    shapes: list = [None] * n_args
    for k, spec in enumerate(specs):
        m = re.fullmatch(r"(\d+)\.(\d+)=(\d+):(\d+)", spec.strip())
        if m is None:
            raise ArbiterError(f"--dynamic {spec!r}: expected ARG.DIM=MIN:MAX, e.g. 0.0=2:64")
        arg, dim, lo, hi = map(int, m.groups())
        if arg >= n_args:
            raise ArbiterError(f"--dynamic {spec!r}: the model takes {n_args} input(s)")
        shapes[arg] = dict(shapes[arg] or {})
        shapes[arg][dim] = torch.export.Dim(f"d{arg}_{dim}_{k}", min=lo, max=hi)
    return tuple(shapes)


def run(args) -> int:
    from ..deploy import export
    from .examples import load_model

    model, inputs = load_model(args.model)
    inputs = tuple(inputs)
    if hasattr(model, "eval"):
        model = model.eval()
    start = time.perf_counter()
    program = export(model, inputs, dynamic_shapes=dynamic_shapes(args.dynamic, len(inputs)),
                     config=args.config)
    compiled = time.perf_counter() - start
    program.save(args.out)
    report = program.report()
    print(report.summary())
    print(f"wrote {args.out} (exported and compiled in {compiled:.1f} s); "
          f"`arbiter report {args.out}` reads its report", file=sys.stderr)
    return 0
