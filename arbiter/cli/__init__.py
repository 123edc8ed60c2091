"""The ``arbiter`` command: ``main`` (subcommands backends, explain, demo, manifest),
``report`` and ``probe`` in their own modules, the built-in example models."""
from .main import main

__all__ = ["main"]
