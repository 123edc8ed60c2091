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


def dynamic_shapes(specs: list[str], inputs: tuple):
    """``--dynamic`` values -> torch.export's dynamic_shapes (a tuple per positional
    input); ArbiterError naming the value where it cannot apply to ``inputs``."""
    import re

    import torch

    from ..errors import ArbiterError

    if not specs:
        return None
    shapes: list = [None] * len(inputs)
    for k, spec in enumerate(specs):
        m = re.fullmatch(r"(\d+)\.(\d+)=(\d+):(\d+)", spec.strip())
        if m is None:
            raise ArbiterError(f"--dynamic {spec!r}: expected ARG.DIM=MIN:MAX, e.g. 0.0=2:64")
        arg, dim, lo, hi = map(int, m.groups())
        if arg >= len(inputs):
            raise ArbiterError(f"--dynamic {spec!r}: the model takes {len(inputs)} input(s)")
        rank = inputs[arg].dim() if isinstance(inputs[arg], torch.Tensor) else None
        if rank is None:
            raise ArbiterError(f"--dynamic {spec!r}: input {arg} is a "
                               f"{type(inputs[arg]).__name__}, not a tensor")
        if dim >= rank:
            raise ArbiterError(f"--dynamic {spec!r}: input {arg} has {rank} dimension(s) "
                               f"(0 to {rank - 1})")
        if lo > hi:
            raise ArbiterError(f"--dynamic {spec!r}: MIN {lo} is above MAX {hi}")
        if dim in (shapes[arg] or {}):
            raise ArbiterError(f"--dynamic {spec!r}: dimension {dim} of input {arg} is "
                               "given twice")
        shapes[arg] = dict(shapes[arg] or {})
        shapes[arg][dim] = torch.export.Dim(f"d{arg}_{dim}_{k}", min=lo, max=hi)
    return tuple(shapes)


def run(args) -> int:
    from ..deploy import export
    from ..deploy.archive import writable
    from .examples import load_model

    writable(args.out, "--out")  # before the export's work, not after it
    model, inputs = load_model(args.model)
    inputs = tuple(inputs)
    if hasattr(model, "eval"):
        model = model.eval()
    shapes = dynamic_shapes(args.dynamic, inputs)
    start = time.perf_counter()
    program = export(model, inputs, dynamic_shapes=shapes, config=args.config)
    compiled = time.perf_counter() - start
    program.save(args.out)
    report = program.report()
    print(report.summary())
    print(f"wrote {args.out} (exported and compiled in {compiled:.1f} s); "
          f"`arbiter report {args.out}` reads its report", file=sys.stderr)
    return 0
