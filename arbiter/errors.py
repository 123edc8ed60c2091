"""One exception tree for everything torch-arbiter raises on purpose.

Every error carries what it is about (a file, a key path, a line, an op, a backend) as
attributes, and its message says what would have been valid.
"""
from __future__ import annotations

import difflib
import sys
import threading
import traceback
import warnings
from collections.abc import Iterable


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """Return " (did you mean 'x'?)" for the closest option, or "" when none is close."""
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_name(what: str, name: str, valid: Iterable[str]) -> str:
    """The message for a name that is not one of ``valid``: "unknown dtype 'x' (did you
    mean 'y'?); valid: a, b"."""
    valid = [str(v) for v in valid]
    return f"unknown {what} {name!r}{did_you_mean(name, valid)}; valid: {', '.join(valid)}"


def require_known(what: str, names: Iterable[str], valid: Iterable[str]) -> None:
    """Raise ValueError (pydantic turns it into a located error) for the first of
    ``names`` that is not in ``valid``."""
    valid = list(valid)
    for name in names:
        if name not in valid:
            raise ValueError(unknown_name(what, name, valid))


def describe(exc: BaseException) -> str:
    """One line for an exception a backend raised: its type, the first line of its
    message (300 characters at most), and the file:line it came from."""
    msg = str(exc).strip().splitlines()
    first = msg[0] if msg else ""
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    loc = f" [at {where[0].filename.rsplit('/', 1)[-1]}:{where[0].lineno}]" if where else ""
    return f"{type(exc).__name__}: {first[:300]}{loc}"


def _user_frame():
    """The innermost frame outside torch, arbiter and the standard library's wrappers:
    the user's line that called the compiled model (or torch.compile)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name == "torch" or name.startswith(("torch.", "arbiter", "importlib",
                                                     "contextlib", "functools"))):
            return frame
        frame = frame.f_back
    return None


def warn_at_user_line(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the user's line (not to arbiter or Dynamo)."""
    frame = _user_frame()
    if frame is None:
        warnings.warn(message, category, stacklevel=2)
        return
    warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno,
                           module=frame.f_globals.get("__name__"),
                           registry=frame.f_globals.setdefault("__warningregistry__", {}))


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(message: str, category: type[Warning] = UserWarning) -> None:
    """A warning at the user's line, once per message per process."""
    with _warned_lock:
        if message in _warned:
            return
        _warned.add(message)
    warn_at_user_line(message, category)


class ArbiterError(Exception):
    """Base class of every error torch-arbiter raises deliberately."""


class ConfigError(ArbiterError, ValueError):
    """A config or manifest file is malformed; names the file, key path and line."""

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None,
                 line: int | None = None):
        self.file, self.key, self.line, self.reason = file, key, line, message
        where = file or "<config>"
        if line is not None:
            where += f":{line}"
        if key:
            where += f": {key}"
        super().__init__(f"{where}: {message}")


class ManifestError(ConfigError):
    """A capability manifest (capabilities/<backend>.yaml) is malformed."""


class UnknownBackendError(ArbiterError, LookupError):
    """A backend name that nothing registered."""

    def __init__(self, name: str, known: Iterable[str]):
        self.name, self.known = name, sorted(known)
        super().__init__(
            f"unknown backend {name!r}{did_you_mean(name, self.known)}; "
            f"known backends: {', '.join(self.known)} (`arbiter backends` lists them)")


class UnknownOpError(ArbiterError, LookupError):
    """An operator name that does not resolve to a torch operator."""
