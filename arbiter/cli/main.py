"""The ``arbiter`` command.

    arbiter backends                     every backend: available?, why not, version
    arbiter explain MODEL [--config C]   the plan for a model, without compiling
    arbiter demo [--model M] [--config C]  compile a model, check it, show report and speed
    arbiter manifest BACKEND [--write]   (re)generate a backend's capability manifest
    arbiter schema [--report] [--write]  the config's JSON Schema (or the report's)

MODEL is a built-in example (`arbiter explain --list`) or ``path/to/file.py:factory``,
a function returning ``(model, example_inputs)``.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from ..errors import ArbiterError


def cmd_backends(args) -> int:
    from ..registry import backend_names, get_backend_class

    for name in backend_names():
        cls = get_backend_class(name)
        be = cls()
        ok, why = be.available()
        try:
            size = cls.manifest().verification()  # and how its entries are known
        except ArbiterError as exc:
            size = f"manifest error: {exc}"
        builds = not ok and be.plannable()[0]  # builds and plans, cannot run (TensorRT)
        version = be.version() if ok or builds else ""
        status = "available" if ok else f"builds and plans only: {why}" if builds else \
            f"unavailable: {why}" + (f" (install: {cls.install_hint})" if cls.install_hint else "")
        print(f"{name:<12} {status:<12} {size:<10} {version}")
    return 0


def cmd_explain(args) -> int:
    import torch

    from ..dryrun import explain
    from .examples import load_model

    model, inputs = load_model(args.model)
    if args.inference and isinstance(model, torch.nn.Module):
        model.eval()
    with torch.no_grad() if args.inference else _null():
        report = explain(model, *inputs, config=args.config)
    print(report)
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
        from ..config_schema import main as schema_main
    return schema_main(["--write"] if args.write else [])


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args.model, args.config, rounds=args.rounds)


# Subcommands that live in their own modules: each has ``add_arguments(parser)`` and
# ``run(args) -> int`` and keeps heavy imports inside ``run``.
_MODULE_COMMANDS = {
    "report": ("arbiter.cli.report", "capability report: tables, JSON, HTML"),
    "probe": ("arbiter.cli.probe", "verify a backend's manifest against PyTorch's OpInfo"),
    "cache": ("arbiter.cli.cache", "list, size or clear the persistent cache"),
}


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main(argv=None) -> int:
    from .._version import __version__

    parser = argparse.ArgumentParser(prog="arbiter", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"torch-arbiter {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("backends", help="list backends and whether they can run here")
    p = sub.add_parser("explain", help="the partition plan for a model, without compiling")
    p.add_argument("model")
    p.add_argument("--config", default=None)
    p.add_argument("--inference", action="store_true", help="model.eval(), traced under torch.no_grad()")
    p = sub.add_parser("demo", help="compile a model across backends; report and speed")
    p.add_argument("--model", default="gpt2_tiny")
    p.add_argument("--config", default=None)
    p.add_argument("--rounds", type=int, default=5)
    p = sub.add_parser("manifest", help="generate a backend's capability manifest")
    p.add_argument("backend")
    p.add_argument("--write", action="store_true", help="write capabilities/<backend>.yaml")
    p = sub.add_parser("schema", help="the config's JSON Schema (editors complete YAML "
                                      "with it), or the report's")
    p.add_argument("--report", action="store_true", help="the JSON report's schema instead")
    p.add_argument("--write", action="store_true",
                   help="write docs/ and the package's copy instead of printing")
    handlers = {"backends": cmd_backends, "explain": cmd_explain, "demo": cmd_demo,
                "manifest": cmd_manifest, "schema": cmd_schema}
    for name, (module_name, help_text) in _MODULE_COMMANDS.items():
        module = importlib.import_module(module_name)
        module.add_arguments(sub.add_parser(name, help=help_text,
                                            description=module.__doc__))
        handlers[name] = module.run
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    handler = handlers[args.cmd]
    try:
        return handler(args)
    except ArbiterError as exc:
        print(f"arbiter: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
