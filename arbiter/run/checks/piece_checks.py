"""A piece's accuracy checks against eager ATen: which calls are checked, and how.

Which calls are checked (config ``verify``: ``every_n``, ``first``), a checked call
judged (inputs written, buffers reused, numbers), and verify mode ``unverified``'s
first-use checks (first_use.py) planned and recorded. ``run.piece.Piece`` compiles, runs
and demotes; this decides and judges, and tells the piece what failed.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch

from ...config import VerifyOptions
from ...errors import describe
from ..chain import Entry, Mode
from ..compiling import compile_lock
from ..record import PieceRecord
from .calls import restore, same_bits, shared_buffers
from .first_use import FirstUse, FirstUseCheck
from .quantized import judge_outputs

log = logging.getLogger("arbiter.run.piece")  # a piece's own log


class PieceChecks:
    """The verify settings of one piece and the state of its checks."""

    def __init__(self, record: PieceRecord, gm: torch.fx.GraphModule, label: str,
                 verify: Optional[VerifyOptions], lowered_verify: Optional[VerifyOptions],
                 first_use: Optional[FirstUse],
                 draws_random: bool):
        self.record = record
        self.gm = gm
        self._label = label
        self._verify_cfg = verify
        self._lowered_cfg = lowered_verify
        self.first_use = first_use or FirstUse(verify.tolerances if verify is not None
                                               else None)
        # the check under way: (level, graph the backend got, its unverified pairs)
        self._checking: Optional[tuple[int, torch.fx.GraphModule, list]] = None
        self._draws_random = draws_random
        self.use(verify)
        self._since_compile = 0  # calls of the current backend (verify `every`)
        self._verify_pending = False  # verify `first`: the next call is checked

    def use(self, verify: Optional[VerifyOptions]) -> None:
        """Take ``verify``'s settings (a VerifyOptions, or None: off)."""
        self.mode = verify.mode if verify is not None else "off"
        if self.mode not in ("off", "unverified") and self._draws_random:
            # a partition drawing random numbers (config `random: backend`) cannot equal
            # eager's draw: nothing to compare
            log.info("%s partition %d draws random numbers: verify skips it", self._label,
                     self.record.partition_id)
            self.mode = "off"
        self._verify_every = verify.every_n if verify is not None else 1
        self._tolerances = verify.tolerances if verify is not None else None

    def checks_unverified(self, backend: Entry) -> bool:
        """Whether ``backend`` runs under verify mode ``unverified`` here."""
        lowered = bool(backend.precision) and self._lowered_cfg is not None
        cfg = self._lowered_cfg if lowered else self._verify_cfg
        return not backend.inline_aten and cfg is not None and cfg.mode == "unverified"

    def start(self, level: int, backend: Entry, got: torch.fx.GraphModule) -> None:
        """A backend of the chain now runs (at ``level``; it compiled ``got``): its
        settings (a lower-precision one has its own), its first-use check planned."""
        lowered = bool(backend.precision)  # a variant: its own checks
        self.use(self._lowered_cfg if lowered and self._lowered_cfg is not None
                 else self._verify_cfg)
        self._checking = None
        if self.mode == "unverified":
            self.mode = "off"
            if not backend.inline_aten:
                self._plan_first_use(level, backend, got)
        self._since_compile = 0
        self._verify_pending = not backend.inline_aten

    def due(self) -> bool:
        """Whether this call is checked (and counted, for ``every_n``)."""
        if self.mode == "first":
            due, self._verify_pending = self._verify_pending, False
            # checked once: later calls are unchecked, as under `off` (the piece's short
            # path then serves them); a new backend's ``start`` sets the mode again
            self.mode = "off"
            return due
        n = self._since_compile
        self._since_compile = n + 1
        return n % self._verify_every == 0

    def judge(self, level: int, backend: Entry, fn: Callable, args: Sequence[Any],
              before: list, out: Any) -> tuple[Optional[str], Optional[list]]:
        """A checked call of ``backend`` (at ``level``): (what failed, eager's result), or
        (None, None) when it passed.

        ``before`` holds copies of the inputs taken before the backend ran: the reference
        is eager ATen on them, so a backend writing into its inputs cannot change the
        reference. Checked in order: the inputs were not written (they are restored if
        they were: eager nodes after this partition read them); a second call does not
        return the first call's buffers (a result the user holds would change under
        them); the numbers match eager within tolerance."""
        rec = self.record
        rec.verify_checks += 1
        why = None
        again = None
        try:
            again = fn(*args)  # a second call on the same inputs: are buffers reused?
        except Exception as exc:  # noqa: BLE001 - a backend failure demotes the piece
            why = f"failed on a second call with the same inputs ({describe(exc)})"
        written = [k for k, (a, b) in enumerate(zip(args, before))
                   if isinstance(a, torch.Tensor) and not same_bits(a, b)]
        if written:
            restore(args, before)
            why = (f"wrote into its input{'s' if len(written) > 1 else ''} "
                   f"{', '.join(map(str, written))} (partition inputs are read-only)")
        elif why is None:
            shared = shared_buffers(out, again, args)
            if shared is not None:
                why = (f"returns the same output buffer on every call (output {shared[1]} of "
                       f"a second call is output {shared[0]} of the first): results the "
                       "caller holds would change")
        expected = list(self.gm(*before))
        if why is None:
            cmp = judge_outputs(self.gm, before, expected, list(out),
                                self._tolerances)
            if rec.verify_max_error is None or cmp.max_error > rec.verify_max_error:
                rec.verify_max_error = cmp.max_error
            if cmp.ok:
                self._first_use_done(level, backend, None, before)
                return None, None
            why = f"differs from eager: {cmp.detail}"
        self._first_use_done(level, backend, why, before)
        return why, expected

    def _plan_first_use(self, level: int, backend: Entry, got: torch.fx.GraphModule) -> None:
        """Verify mode ``unverified``: the next call is checked against eager when
        ``got`` (what the backend compiled) holds an unverified (op, dtype)."""
        symbolic = backend.mode is Mode.SYMBOLIC
        items = self.first_use.needed(backend, got, symbolic)
        if not items:
            return
        check = FirstUseCheck(backend.name, [str(u) for u in items])
        self.record.first_use.append(check)
        if self._draws_random:
            check.result = "not checked: the partition draws random numbers"
            log.warning("%s partition %d: %s runs unverified ops (%s) unchecked: the "
                        "partition draws random numbers (random: backend)", self._label,
                        self.record.partition_id, backend.name, check.unverified[0])
            return
        self.mode = "first"
        self._checking = (level, got, items)
        log.info("%s partition %d: %s holds ops no probe verified (%s%s): its first call "
                 "is checked against eager", self._label, self.record.partition_id,
                 backend.name, ", ".join(check.unverified[:3]),
                 f" and {len(items) - 3} more" if len(items) > 3 else "")

    def _first_use_done(self, level: int, backend: Entry, why: Optional[str],
                        before: list) -> None:
        """Record the outcome of a first-use check (``why``: what failed, or None)."""
        checking, self._checking = self._checking, None
        if checking is None or checking[0] != level or not self.record.first_use:
            return
        check = self.record.first_use[-1]
        if why is None:
            check.result = "passed"
            return
        check.result, check.detail = "failed", why.removeprefix("differs from eager: ")
        if not why.startswith("differs from eager"):
            return  # not wrong numbers (an input written, a buffer reused, a second call
            # that raised): demoted, nothing to trace to an op
        _, got, items = checking
        with compile_lock():
            found = self.first_use.localize(backend, got, before, items, why)
        check.findings = [f.label() for f in found]
