"""arbiter: one torch.compile backend that splits ATen graphs across backends, says what ran where.

    arbiter backends                     every backend: available?, why not, version;
                                         this machine's calibration
    arbiter calibrate [--out FILE]       time each backend here once (policy calibrated)
    arbiter explain MODEL [--config C]   the plan for a model, without compiling
    arbiter report MODEL [--html P]      compile, run, and report what ran where (or a
                                         saved program's report: arbiter report PATH)
    arbiter demo [--model M] [--config C]  compile a model, check it, show report and speed
    arbiter export MODEL --out PATH      export, compile and save for arbiter.load
    arbiter cache [list|size|clear]      the persistent cache
    arbiter manifest BACKEND [--write]   (re)generate a backend's capability manifest
    arbiter probe BACKEND [--write]      check a backend's manifest with PyTorch's OpInfo
    arbiter schema [--report] [--write]  the config's JSON Schema (or the report's)

MODEL is a built-in example (listed by `arbiter explain --help`) or path/to/file.py:factory,
a function returning (model, example_inputs).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from ..errors import ArbiterError


def cmd_explain(args) -> int:
    import torch

    from ..dryrun import explain
    from .examples import load_model, users_errors
    from .models import choose_mode
    from .report import named, write_text

    model, inputs = load_model(args.model)
    train, line = choose_mode(model, args)
    print(f"arbiter: {line}", file=sys.stderr)
    with users_errors(model, inputs, args.model, train), \
            torch.enable_grad() if train else torch.no_grad():
        report = explain(model, *inputs, config=args.config, backward=train)
    write_text(named(report, args.model, args.config))
    return 0


def cmd_manifest(args) -> int:
    from ..probe.generate import generate
    from ..registry import get_backend_class

    path = get_backend_class(args.backend).manifest_path()
    text = generate(args.backend, existing=path)
    if args.write:
        path.write_text(text)
        print(f"wrote {path}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_schema(args) -> int:
    if args.report:
        from ..report.schema import main as schema_main
    else:
        from ..config.schema import main as schema_main
    return schema_main(["--write"] if args.write else [])


# Subcommands that live in their own modules: each has ``add_arguments(parser)`` and
# ``run(args) -> int`` and keeps heavy imports inside ``run``.
_MODULE_COMMANDS = {
    "report": ("arbiter.cli.report", "capability report: tables, JSON, HTML"),
    "probe": ("arbiter.cli.probe", "verify a backend's manifest against PyTorch's OpInfo"),
    "cache": ("arbiter.cli.cache", "list, size or clear the persistent cache"),
    "backends": ("arbiter.cli.backends", "list backends and whether they can run here"),
    "calibrate": ("arbiter.cli.calibrate", "measure this machine's calibration "
                  "(policy `calibrated`)"),
    "demo": ("arbiter.cli.demo", "compile a model across backends; check it, report, speed"),
    "export": ("arbiter.cli.export", "export, compile and save a model (arbiter.load reads it)"),
}


def _add_explain(sub, raw) -> None:
    from .models import MODE_NOTE, MODEL_ARG, add_mode_arguments, fill, models_epilog

    p = sub.add_parser("explain", help="the partition plan for a model, without compiling",
                       formatter_class=raw, epilog=models_epilog(), description=fill(
                           "The partition plan for a model (arbiter.explain): Dynamo and "
                           "AOTAutograd trace it once in eager, every graph is planned, "
                           "nothing is compiled; prints the text report.", MODE_NOTE))
    p.add_argument("model", metavar="MODEL", help=MODEL_ARG)
    p.add_argument("--config", default=None,
                   help="config file or shipped name (default, cpu, cpu_all); default: the "
                        "embedded default config")
    add_mode_arguments(p)


def _add_manifest(sub, raw) -> None:
    from .models import fill

    p = sub.add_parser("manifest", help="generate a backend's capability manifest",
                       formatter_class=raw, description=fill(
                           "Generate a backend's capability manifest (capabilities/"
                           "<backend>.yaml) from the ops the backend declares, keeping the "
                           "existing file's `defaults` and `decompositions`; prints it, or "
                           "writes it with --write. `arbiter probe BACKEND` then verifies "
                           "its entries against PyTorch's OpInfo samples."))
    p.add_argument("backend", help="a registered backend's name (`arbiter backends` lists them)")
    p.add_argument("--write", action="store_true", help="write capabilities/<backend>.yaml")


def _add_schema(sub, raw) -> None:
    from .models import fill

    p = sub.add_parser("schema", help="the config's JSON Schema (editors complete YAML "
                                      "with it), or the report's",
                       formatter_class=raw, description=fill(
                           "Print the JSON Schema of arbiter's config (docs/config.schema."
                           "json: editors complete and check YAML configs with it), or with "
                           "--report the schema of `arbiter report --json` (docs/report."
                           "schema.json). Both are generated from the pydantic models."))
    p.add_argument("--report", action="store_true", help="the JSON report's schema instead")
    p.add_argument("--write", action="store_true",
                   help="write docs/ and the package's copy instead of printing")


#: Commands in the order ``arbiter --help`` lists them.
_ORDER = ("backends", "calibrate", "explain", "report", "demo", "export", "cache", "probe",
          "manifest", "schema")
_HANDLERS = {"explain": (_add_explain, cmd_explain), "manifest": (_add_manifest, cmd_manifest),
             "schema": (_add_schema, cmd_schema)}


def _parser() -> argparse.ArgumentParser:
    from .._version import __version__
    from .models import models_epilog

    raw = argparse.RawDescriptionHelpFormatter  # keeps the usage examples' lines
    first, *_, model = __doc__.strip().split("\n\n")
    parser = argparse.ArgumentParser(prog="arbiter", description=first, formatter_class=raw,
                                     epilog=f"{model}\n\n{models_epilog()}")
    parser.add_argument("--version", action="version", version=f"torch-arbiter {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for name in _ORDER:
        if name in _HANDLERS:
            _HANDLERS[name][0](sub, raw)
            continue
        module_name, help_text = _MODULE_COMMANDS[name]
        module = importlib.import_module(module_name)
        module.add_arguments(sub.add_parser(name, help=help_text, formatter_class=raw,
                                            description=module.__doc__))
    return parser


def main(argv=None) -> int:
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
    except BrokenPipeError:
        # `arbiter cache list | head`: the reader left; stop quietly, as `ls | head` does.
        # stdout goes to /dev/null so that the interpreter's last flush cannot fail again.
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _main(argv=None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        # a model that fails to trace: torch logs the fake-tensor traceback (20 lines)
        # before raising; the CLI says the model's error in one line (examples.users_errors)
        logging.getLogger("torch._subclasses.fake_tensor").addFilter(
            lambda r: not str(r.msg).startswith("failed while attempting to run meta"))
    handler = _HANDLERS[args.cmd][1] if args.cmd in _HANDLERS else \
        importlib.import_module(_MODULE_COMMANDS[args.cmd][0]).run
    try:
        return handler(args)
    except ArbiterError as exc:
        print(f"arbiter: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
