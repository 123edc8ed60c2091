"""`arbiter report`: placeholder until implemented."""
from __future__ import annotations


def add_arguments(parser) -> None:
    pass


def run(args) -> int:
    raise SystemExit("arbiter report: not implemented yet")
