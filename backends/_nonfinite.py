"""The ``exact_nonfinite`` option, shared by backends whose probe found ops that compute
unlike eager when an input holds NaN or inf (docs/robustness.md, "Non-finite values").

A backend mixes in ``ExactNonfinite`` and sets ``own_validators`` (always applied) and
``nonfinite_checks`` (``arbiter.ops.nonfinite_validators``). Per the option: ``true``
refuses those ops on floating inputs (they join ``validators``); ``"guard"`` takes them,
and ``nonfinite_guard`` names them so that the partition checks its inputs on every call
(arbiter/run/piece.py); ``false`` takes them unchecked.
"""
from __future__ import annotations

import functools
from typing import ClassVar

from arbiter.ops import nonfinite_nodes


class ExactNonfinite:
    own_validators: ClassVar[dict] = {}
    nonfinite_checks: ClassVar[dict] = {}

    def _mode(self):
        return getattr(getattr(self, "options", None), "exact_nonfinite", True)

    @property
    def validators(self) -> dict:
        """Its own validators, plus the non-finite ones while ``exact_nonfinite`` is true."""
        return self._exact() if self._mode() is True else self.own_validators

    @classmethod
    @functools.cache
    def _exact(cls) -> dict:
        return {**cls.nonfinite_checks, **cls.own_validators}

    def nonfinite_guard(self, gm) -> list[str]:
        return nonfinite_nodes(gm, self.nonfinite_checks) if self._mode() == "guard" else []
