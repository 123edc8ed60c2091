"""One thread budget and one memory arena for every backend in the process.

Backends left alone each size their own thread pools for the whole machine, keep them
spinning after a run, and keep their own memory arenas. A graph split across backends
runs its partitions one after another, so each backend should get the whole budget
while it runs and leave the cores alone while the others run. This module decides the
budget once per process (``Budget``) and hands it to every backend through
``Backend.configure_resources(budget)``; what each backend says it applied is the
``settings in force`` that ``Arbiter.report()`` shows under ``resources``. The first
budget of a process stays (``OMP_WAIT_POLICY`` and shared arenas cannot change later);
a later config asking otherwise gets a warning, except for ``spin``, each config's own.
No backend is named here. docs/resources.md ("What can change when") has the table.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterable, Optional

from ..backend import bounded_threads, usable_cpus
from ..errors import warn_once

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Budget:
    """The resources every backend of the process shares.

    ``threads``: intra-op threads each backend may use while it runs (they run one at a
    time). ``spin``: the one backend whose idle threads may keep spinning (``none``: no
    backend's). ``shared_arena``: backends that can share one memory arena do.
    ``coordinate``: False leaves every backend at its own defaults (the uncoordinated
    baseline of bench/resources.py).
    """

    threads: int
    spin: str = "none"
    shared_arena: bool = True
    coordinate: bool = True

    def may_spin(self, backend_name: str) -> bool:
        return self.spin == backend_name


def cores() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count)."""
    return usable_cpus()


def _ranks() -> int:
    """The processes of a torch.distributed group (world size), 1 when none is up."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
    except (ImportError, RuntimeError):
        pass
    return 1


def auto_threads() -> int:
    """``threads: auto``: torch's own intra-op thread count as the process holds it
    (``torch.set_num_threads``, ``OMP_NUM_THREADS``, or torch's default: the physical
    cores), at most the CPUs this process may run on; under torch.distributed (several
    processes, each with its own budget) also at most the cores divided among the host's
    ranks (``LOCAL_WORLD_SIZE``, set by torchrun): every rank taking every core made a
    2-rank DDP step 10x slower here (bench/README.md, training_ddp.py).

    torch's count is the user's: arbiter sizes its backends by it and never changes it.
    Setting it from a compile broke the user's program: Dynamo asserts that the count
    does not change while it traces, and ``backend="arbiter"`` makes its budget there, so
    ``torch.set_num_threads(1)`` before ``torch.compile`` (or any machine whose torch
    default, the physical cores, is below its logical CPUs) failed the first call."""
    import torch

    usable = cores()
    threads = max(1, min(usable, torch.get_num_threads()))
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if _ranks() > 1 and local.isdigit() and int(local) > 0:
        threads = max(1, min(threads, usable // int(local)))
    return threads


def resolve(options: Any, first_backend: str = "none", training: bool = False) -> Budget:
    """A Budget from the config's ``resources:`` (``config.ResourcesOptions``).

    ``spin: auto`` gives the spin to ``first_backend``, the config's first backend, which
    by priority takes the most nodes: a backend whose pool may not spin may get fewer
    threads (ONNX Runtime's global pool gets no workers), and the backend doing most of
    the work needs them most; with ``training`` (the process's first graph trains) to no
    backend: eager work runs between the backends' calls in a training step (the
    optimizer step, graphs eager runs faster), and a spinning pool takes its cores
    (docs/resources.md)."""
    threads = auto_threads() if options.threads == "auto" else bounded_threads(
        int(options.threads), "resources.threads")
    spin = options.spin
    if spin == "auto":
        spin = "none" if training else first_backend
    return Budget(threads=threads, spin=spin, shared_arena=options.shared_arena,
                  coordinate=options.coordinate)


def spin_follows(plan: Any, backends: dict[str, Any], inline: set[str]) -> Optional[str]:
    """``spin: auto`` once a graph's plan is chosen, in a process that does not train: the
    backend holding most of the plan's nodes outside eager gets this config's spin
    (``Backend.use_budget``; pieces read it when they compile, at their first call), so
    that the backend doing the work is the one whose pool spins, whatever the config's
    order (policy ``calibrated`` may choose its last backend: cpu_all lists OpenVINO first
    and ran BERT-base on ONNX Runtime, whose non-spinning sessions were 0-12% slower in
    inference, docs/resources.md). Returns the backend given the spin, or None when it
    stays where it was."""
    size: dict[str, int] = {}
    for part in plan.partitions:
        base = part.backend.split(":")[0]  # a lower-precision variant: its backend's
        if part.backend not in inline and base in backends:
            size[base] = size.get(base, 0) + part.size
    if not size:
        return None
    owner = max(size, key=lambda b: size[b])
    budgets = [b for b in backends.values() if getattr(b, "budget", None) is not None]
    if all(b.budget.spin == owner for b in budgets):
        return None
    for b in budgets:
        b.use_budget(replace(b.budget, spin=owner))
    return owner


def omp_wait_policy() -> str:
    """What torch's OpenMP threads do when idle; fixed when torch was imported."""
    value = os.environ.get("OMP_WAIT_POLICY")
    if value:
        return value.lower()
    return "unset (libgomp: spin a while, then sleep)"


# -- process-wide state ------------------------------------------------------------------
_lock = threading.Lock()
_budget: Optional[Budget] = None
_in_force: dict[str, Any] = {}       # "torch" / backend name -> its settings
_configured: set[str] = set()        # backends already given the budget


def apply(options: Any, backends: Iterable[Any], first_backend: str = "none",
          training: bool = False) -> dict[str, Any]:
    """Apply the config's ``resources:`` to torch and ``backends``, once per process.

    The first call fixes the process's budget; later calls configure backends not
    configured yet with that same budget, and warn (naming each setting) when their
    own options ask for something else. Returns the settings in force.
    """
    global _budget
    wanted = resolve(options, first_backend, training)
    with _lock:
        if _budget is None:
            _budget = wanted
            _in_force["budget"] = asdict(wanted)
            _in_force["torch"] = _configure_torch(wanted)
        else:
            # `spin` is each config's own (backends apply it per compiled model); the
            # rest was fixed by the process's first budget
            diffs = [f"{k}={getattr(wanted, k)!r} (in force: {getattr(_budget, k)!r})"
                     for k in asdict(wanted)
                     if k != "spin" and getattr(wanted, k) != getattr(_budget, k)]
            msg = ("resources: this config asks for " + ", ".join(diffs) + ", but the "
                   "process's thread budget and arenas were set by the first Arbiter and "
                   "stay (torch's thread count is the user's to change; ONNX Runtime's "
                   "arena exists from its first session; OMP_WAIT_POLICY from torch's "
                   "import)")
            if diffs:
                warn_once(msg, RuntimeWarning)  # once per message, at the user's line
        budget = _budget
        own = replace(budget, spin=wanted.spin)
        for backend in backends:
            backend.use_budget(own)
        for backend in backends:
            if backend.name in _configured:
                continue
            _configured.add(backend.name)
            try:
                settings = backend.configure_resources(budget)
            except Exception as exc:  # noqa: BLE001 - a backend's failure is reported
                settings = {"error": f"{type(exc).__name__}: {exc}"}
                log.warning("backend %s could not apply the resource budget: %s",
                            backend.name, exc)
            if settings:
                _in_force[backend.name] = settings
        return in_force()


def in_force(backends: Iterable[Any] = ()) -> dict[str, Any]:
    """The settings in force in this process (a copy), for the report; with a config's
    ``backends``, the budget's ``spin`` is that config's own (``spin_follows``)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in _in_force.items()}
    spins = {b.budget.spin for b in backends if getattr(b, "budget", None) is not None}
    if "budget" in out and len(spins) == 1:
        out["budget"]["spin"] = spins.pop()
    if "torch" in out:
        import torch

        out["torch"]["intra_op_threads"] = torch.get_num_threads()  # may have been changed
    return out


def _configure_torch(budget: Budget) -> dict[str, Any]:
    """torch's side of the budget, as it stands: its thread count is the user's and is
    never changed (``auto_threads``); a config's number that differs is said once."""
    import torch

    threads = torch.get_num_threads()
    if budget.coordinate and threads != budget.threads:
        warn_once(f"resources.threads: {budget.threads} sizes the backends' thread pools; "
                  f"torch's own intra-op pool (eager ops between partitions) keeps the "
                  f"{threads} thread(s) this process gave it. It is yours to set: "
                  f"torch.set_num_threads({budget.threads}) before compiling",
                  RuntimeWarning)
    return {"intra_op_threads": threads, "set_by": "the process (never changed by arbiter)",
            "omp_wait_policy": omp_wait_policy(),
            "tqdm_monitor": _no_tqdm_monitor() if budget.coordinate else "tqdm's default"}


def _no_tqdm_monitor() -> str:
    """AOTAutograd runs ``torch.fx.Interpreter``, whose (disabled) tqdm progress bar
    starts tqdm's monitor thread, which then stays for the life of the process: one
    thread over the budget. ``monitor_interval = 0`` keeps it from starting; it only
    watches for stalled progress bars."""
    import sys

    tqdm_mod = sys.modules.get("tqdm.std")
    if tqdm_mod is None:
        try:
            import tqdm.std as tqdm_mod
        except ImportError:
            return "tqdm not installed"
    cls = tqdm_mod.tqdm
    if getattr(cls, "monitor", None) is not None:
        return "already running (started before arbiter)"
    cls.monitor_interval = 0
    return "off"
