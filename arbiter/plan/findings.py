"""What first-use checks found wrong: kept, so that no process tries it again.

A partition holding an (op, dtype) that no probe verified is compared with eager ATen on
its first call (config ``verify: {mode: unverified}``, the default;
arbiter/run/checks/first_use.py). When it differs, the op that differs is found by running each unverified node alone
through the backend, and a ``Finding`` is kept: the backend, its version, the op, the
dtype, which output (or every output) and what differed. From then on the planner refuses
that op, in that dtype, on that backend (and only the nodes that read the wrong output),
with the finding as its reason (``plan.capability.CapabilityTable``), in this process and,
through the persistent cache (arbiter/cache/, kind ``finding``), in later ones. A new
backend version starts over: its findings are keyed by it, as is the rule that judged them
(``JUDGE``).

When no single node reproduces the difference (it comes from the nodes together), the
finding is the partition's own (``op`` = ``partition:<cache key>``): that partition, on
that backend, is skipped at compile time by later processes (``Piece``).

``arbiter cache list`` shows findings; ``arbiter cache clear`` forgets them.
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Optional

log = logging.getLogger(__name__)

KIND = "finding"  # the persistent cache's kind for findings
#: How the first-use checks judge a difference; part of every finding's key, so that a
#: change to the rule (2: float32's rounding bound beside eager's own error, and one
#: quantization step for a quantized partition) is not held to what an older rule found
#: (a PT2E partition refused under float32's tolerance stayed refused in every later
#: process).
JUDGE = 2
#: ``Finding.output`` when every output is wrong, or the op has one output
ALL_OUTPUTS = -1
#: ``Finding.op`` of a partition's own finding (its ``dtype`` holds the partition's key)
PARTITION_OP = "<partition>"


@dataclass(frozen=True)
class Finding:
    """One op computed unlike eager by one backend version, found at first use."""

    backend: str
    version: str
    op: str  # an ATen overload (``aten._embedding_bag.default``), or ``partition:<key>``
    dtype: str  # the node's floating (else first) dtype: ``float32``
    output: int  # the wrong output's index, or ALL_OUTPUTS
    detail: str  # what differed: ``max abs error 3 (rtol 0, atol 0)``
    when: str  # UTC date and time it was found
    pid: int  # the process that found it

    def reason(self) -> str:
        which = "its output" if self.output == ALL_OUTPUTS else f"output {self.output}"
        return (f"{which} differed from eager at first use ({self.version}, {self.dtype} "
                f"node: {self.detail}; found {self.when}, process {self.pid}; "
                "`arbiter cache clear` forgets it)")

    def label(self) -> str:
        """What was found wrong, in a few words."""
        if self.op == PARTITION_OP:
            return "the partition as a whole"
        return f"{self.op} {self.dtype}" + ("" if self.output < 0 else f" output {self.output}")

    def refuses(self, dtypes: Iterable[str], used: Optional[set[int]]) -> bool:
        """Whether a node with tensors of ``dtypes`` reading outputs ``used`` (None:
        read whole) is refused by this finding."""
        if self.dtype not in set(dtypes):
            return False
        return self.output == ALL_OUTPUTS or used is None or self.output in used


class Findings:
    """Findings by (backend, version, op): this process's, and the persistent cache's.

    One per process (``findings()``); ``cache`` is attached by each Arbiter that has one
    (each is read and written). ``generation`` counts the findings added in this process:
    a capability table that cached answers under an older one forgets them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[tuple[str, str, str], list[Finding]] = {}
        self._caches: list[Any] = []
        self.generation = 0

    def attach(self, cache: Any) -> None:
        if cache is not None and all(c is not cache for c in self._caches):
            with self._lock:
                self._caches.append(cache)
                # an op looked up before this cache was attached is looked up again
                self._known = {k: v for k, v in self._known.items() if v}
                self.generation += 1

    def for_op(self, backend: str, version: str, op: str) -> list[Finding]:
        key = (backend, version, op)
        with self._lock:
            hit = self._known.get(key)
        if hit is not None:
            return hit
        found: list[Finding] = []
        for cache in list(self._caches):
            for raw in cache.get_json(KIND, _key(*key)) or ():
                try:
                    f = Finding(**raw)
                except TypeError:
                    log.warning("arbiter cache: ignoring a malformed finding for %s on %s",
                                op, backend)
                    continue
                if f not in found:
                    found.append(f)
        with self._lock:
            return self._known.setdefault(key, found)

    def add(self, finding: Finding) -> None:
        key = (finding.backend, finding.version, finding.op)
        known = self.for_op(*key)
        with self._lock:
            if finding in known:
                return
            known.append(finding)
            every = list(known)
            caches = list(self._caches)
            self.generation += 1
        for cache in caches:
            cache.put_json(KIND, _key(*key), [asdict(f) for f in every])
        log.warning("%s %s on %s: %s", finding.op, finding.dtype, finding.backend,
                    finding.reason())


    def forget(self) -> int:
        """Forget every finding, this process's and the attached caches' (``arbiter cache
        clear`` removes the persistent ones too). Returns the cache entries removed."""
        with self._lock:
            self._known.clear()
            self.generation += 1
            caches = list(self._caches)
        return sum(cache.remove_kind(KIND) for cache in caches)


def new_finding(backend: str, version: str, op: str, dtype: str, output: int,
                detail: str) -> Finding:
    return Finding(backend, version, op, dtype, output, detail[:300],
                   time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getpid())


def _key(backend: str, version: str, op: str) -> str:
    return hashlib.sha256(f"{backend}\0{version}\0{op}\0{JUDGE}".encode()).hexdigest()


_FINDINGS = Findings()


def findings() -> Findings:
    """The process's findings."""
    return _FINDINGS
