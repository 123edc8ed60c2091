"""Progress of a long CLI command on stderr, with arbiter's warnings above it, never in it.

Stages (loading, tracing) and bars (compiling partitions, timing calls). On a terminal
with rich (the `report` extra) this is a ``rich.progress.Progress``; the records of the
``arbiter`` loggers go through its console, so a log line and the bar never share a
line. Elsewhere (a pipe, CI, no rich) each stage and each compile is one plain line.
Compile progress is read from the runtime's own INFO records (``Arbiter`` logs how many
partitions a graph has to compile, ``Piece`` each compile), so the library prints nothing.
"""
from __future__ import annotations

import logging
import re
import sys
from typing import Any, Optional

_PLANNED = re.compile(r"; (\d+) to compile$")
_COMPILING = re.compile(r"^(.*) partition (\d+): compiling with (\S+)$")


class Progress(logging.Handler):
    def __init__(self, quiet: bool = False, verbose: bool = False,
                 inline: frozenset = frozenset({"eager"})):
        super().__init__(logging.INFO)
        self.quiet, self.verbose, self.inline = quiet, verbose, inline
        self._rich: Any = None
        self._tasks: dict[str, Any] = {}
        self._compiled = 0
        self._saved: Optional[tuple] = None

    # -- context -------------------------------------------------------------------
    def __enter__(self) -> "Progress":
        if self.quiet:
            return self
        try:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bar,
                                       SpinnerColumn, TextColumn, TimeElapsedColumn)
        except ImportError:
            Console = None  # noqa: N806
        if Console is not None and Console(stderr=True).is_terminal:
            self._rich = Bar(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                             MofNCompleteColumn(), TimeElapsedColumn(),
                             console=Console(stderr=True), transient=False)
            self._rich.start()
        logger = logging.getLogger("arbiter")
        self._saved = (logger.level, logger.propagate)
        logger.addHandler(self)
        logger.setLevel(logging.INFO)
        logger.propagate = False  # one line each, not also through the root handler
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._saved is not None:
            logger = logging.getLogger("arbiter")
            logger.removeHandler(self)
            logger.setLevel(self._saved[0])
            logger.propagate = self._saved[1]
        if self._rich is not None:
            for task in self._tasks.values():  # a finished stage shows as done
                t = self._task(task)
                self._rich.update(task, total=t.total or 1, completed=t.total or 1)
            self._rich.stop()

    def _task(self, task: Any) -> Any:
        return next(t for t in self._rich.tasks if t.id == task)

    # -- stages --------------------------------------------------------------------
    def stage(self, name: str, total: Optional[int] = None) -> None:
        """Start a stage (the previous one is done): a spinner, or a bar of ``total``."""
        if self.quiet:
            return
        for key, task in self._tasks.items():
            if key.startswith("stage:") and self._rich is not None:
                t = self._task(task)
                self._rich.update(task, total=t.total or 1, completed=t.total or 1)
        if self._rich is None:
            self._print(name + (f" ({total})" if total else ""))
            self._tasks["stage:" + name] = None
            return
        self._tasks["stage:" + name] = self._rich.add_task(name, total=total)

    def note(self, text: str) -> None:
        """A line of its own (above the bars on a terminal)."""
        if not self.quiet:
            self._print(text)

    def advance(self, name: str, n: int = 1) -> None:
        task = self._tasks.get("stage:" + name)
        if self._rich is not None and task is not None:
            self._rich.advance(task, n)

    def _print(self, text: str, style: str = "") -> None:
        if self._rich is not None:
            from rich.markup import escape

            self._rich.console.print(f"[{style}]{escape(text)}[/{style}]" if style
                                     else escape(text), highlight=False)
        else:
            print(f"arbiter: {text}", file=sys.stderr, flush=True)

    # -- the runtime's records ------------------------------------------------------
    def emit(self, record: logging.LogRecord) -> None:
        if self.quiet:
            return
        try:
            msg = record.getMessage()
            if record.levelno >= logging.WARNING:
                self._print(msg, "yellow")
                if " failed to " in msg and any(msg.rstrip().endswith(f"falling back to {b}")
                                                for b in self.inline):
                    self._compile_done()
                return
            m = _PLANNED.search(msg)
            if m:
                self._add_compiles(int(m.group(1)))
            elif (m := _COMPILING.match(msg)) is not None:
                text = f"compiling {m.group(1)} #{m.group(2)} with {m.group(3)}"
                if self._rich is not None and "compile" in self._tasks:
                    self._rich.update(self._tasks["compile"], description=text)
                elif self._rich is None:
                    self._print(f"[{self._compiled + 1}] {msg}")
            elif ": compiled with " in msg:
                self._compile_done()
                if self._rich is None or self.verbose:
                    self._print(msg)
            elif self.verbose or "measur" in msg or "refining" in msg:
                if self._rich is not None and ("measur" in msg or "refining" in msg):
                    task = self._tasks.get("measure")
                    if task is None:
                        task = self._tasks["measure"] = self._rich.add_task(msg, total=None)
                    self._rich.update(task, description=msg)
                else:
                    self._print(msg)
        except Exception:  # noqa: BLE001 - progress must never break the command
            self.handleError(record)

    def _add_compiles(self, n: int) -> None:
        if not n:
            return
        if self._rich is None:
            return
        task = self._tasks.get("compile")
        if task is None:
            self._tasks["compile"] = self._rich.add_task("compiling partitions", total=n)
        else:
            self._rich.update(task, total=(self._task(task).total or 0) + n)

    def _compile_done(self) -> None:
        self._compiled += 1
        if self._rich is not None and "compile" in self._tasks:
            self._rich.advance(self._tasks["compile"], 1)
