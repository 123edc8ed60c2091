"""``backend="arbiter"``: the entry point torch.compile finds without ``import arbiter``.

pyproject.toml registers ``arbiter_backend`` in the ``torch_dynamo_backends`` entry-point
group. torch.compile passes its ``options`` and ``mode`` here (read by
config/torch_compile.py); the Arbiter of those settings is shared (sessions.py, which also
finds each compiled model's report).

Errors: Dynamo wraps what a backend raises in ``BackendCompilerFailed``; arbiter's own
errors (``arbiter.ConfigError`` for a bad config or option, at the first call) are
re-raised so that ``except arbiter.ConfigError`` catches them (``_through_dynamo``).
"""
from __future__ import annotations

from typing import Any, Optional

from .config.torch_compile import FILE
from .errors import ArbiterError, ConfigError
from .run.owner import current_owner
from .sessions import arbiter_for, drop_all, note_last


def arbiter_backend(gm, example_inputs, options: Optional[dict] = None,
                    mode: Optional[str] = None, **kwargs):
    try:
        return _backend(gm, example_inputs, options, mode, kwargs)
    except ArbiterError as exc:
        raise _through_dynamo(exc) from exc.__cause__


def _through_dynamo(exc: ArbiterError) -> ArbiterError:
    """``exc`` as an instance of a subclass of its own class and of Dynamo's
    ``ShortenTraceback``, which Dynamo re-raises as it is: any other exception from a
    backend reaches the user wrapped in ``BackendCompilerFailed``, where
    ``except arbiter.ConfigError`` would miss it. Same message and attributes; Dynamo
    prints it from the line that raised (an arbiter error is deliberate, its message
    says what is wrong), not through its own frames."""
    try:
        from torch._dynamo.exc import ShortenTraceback
    except ImportError:  # a torch without it: as it is
        return exc
    base = type(exc)
    cls = _PASSTHROUGH.get(base)
    if cls is None:
        cls = _PASSTHROUGH[base] = type(base.__name__, (base, ShortenTraceback), {
            "__module__": base.__module__, "__qualname__": base.__qualname__,
            "__doc__": base.__doc__})
    new = cls.__new__(cls)
    new.args = exc.args
    new.__dict__.update(exc.__dict__)
    # Dynamo prints the traceback from this frame on (TORCHDYNAMO_VERBOSE=1: all of it):
    # the line that raised, under the user's own lines, without Dynamo's internals
    new.first_useful_frame = _innermost(exc.__traceback__)
    return new.with_traceback(exc.__traceback__)


def _innermost(tb: Any) -> Any:
    """The frame of the last entry of traceback ``tb`` (where it was raised), or None."""
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame if tb is not None else None


_PASSTHROUGH: dict = {}


def _backend(gm, example_inputs, options: Optional[dict], mode: Optional[str], kwargs: dict):
    if kwargs:
        raise ConfigError(f"unexpected torch.compile argument(s) {', '.join(sorted(kwargs))}; "
                          "arbiter takes options= and mode=", file=FILE)
    be = arbiter_for(options, mode)
    note_last(be, current_owner())
    return be(gm, example_inputs)


def _reset() -> None:
    """``torch._dynamo.reset()`` calls this (through torch.compile's backend wrapper):
    as in a fresh process, the shared Arbiters and their reports are dropped."""
    drop_all()


arbiter_backend.reset = _reset  # type: ignore[attr-defined]
