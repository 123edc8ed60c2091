"""The ``arbiter`` command.

``main`` holds the parser and the subcommands explain, manifest and schema; the others
(backends, calibrate, report, demo, export, cache, probe) live in their own modules,
beside the built-in example models.
"""
from .main import main

__all__ = ["main"]
