"""Probing a backend with PyTorch's OpInfo samples, to verify its manifest: the driver.

For each OpInfo and dtype tried, one sample is traced to an ATen graph (sampling.py),
compiled by the backend alone (no fallback, so failures show; the ops its manifest's
``decompositions:`` names decomposed for it, as in a partition) and run, then compared
with the traced metadata and with eager ATen, finite and special values (judge.py,
nonfinite.py). ``grad`` probes each sample's AOTAutograd forward and backward instead
(training.py), ``dynamic`` a trace with symbolic sizes run at two sizes (dynamic.py),
``build_only`` builds without running (TensorRT without CUDA: ``verified: built``).
credit.py credits and blames ops per ATen overload; update.py turns the ``ProbeResult``
into manifest entries. docs/robustness.md ("`arbiter probe BACKEND`") gives the rules:
what is skipped, credited, blamed, dropped and removed, and why.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Optional

import torch

from ..errors import describe
from ..manifest import DTYPES
from ..backend import Backend
from .credit import probe_graph
# names other modules and tests import from here
from .judge import expose_outputs, probe_build, probe_sample, probe_unreturned  # noqa: F401
from .nonfinite import NONFINITE_KINDS, nonfinite_inputs, probe_nonfinite  # noqa: F401
from .result import ProbeResult, SampleResult, summarize_failures  # noqa: F401
from .sampling import (label, nondeterministic, opinfos, pick_sample, sample_fn,  # noqa: F401
                       trace_sample)
from .settings import Case, Probe

DEFAULT_DTYPES = ("float32", "int64", "bool", "float16")


def probe(backend: Backend, *, ops: Optional[Sequence[str]] = None,
          dtypes: Sequence[str] = DEFAULT_DTYPES, limit_s: Optional[float] = None,
          progress: Optional[Callable[[ProbeResult, str], None]] = None,
          tolerances: Optional[dict] = None, build_only: bool = False,
          grad: bool = False, dynamic: bool = False) -> ProbeResult:
    """Probe ``backend`` with OpInfo samples; see the module docstring. ``build_only``:
    build each sample, do not run it. ``dynamic``: probe symbolic shapes (two sizes
    through one artifact) instead of dtypes. ``grad``: probe each sample's training
    graphs, forward and backward (OpInfos without a backward, and dtypes without one,
    are left out)."""
    from .dynamic import dynamic_samples
    from .overload_samples import samples_for
    from .quant_samples import samples_for as quant_samples_for
    from .training import probe_training

    if build_only and dynamic:
        raise ValueError("probe: build_only and dynamic are exclusive (a dynamic probe runs "
                         "each artifact at two sizes)")
    if grad and (build_only or dynamic):
        raise ValueError("probe: grad is exclusive with build_only and dynamic (training "
                         "graphs are probed with static shapes, run)")
    result = ProbeResult(backend.name, str(backend.version()), str(torch.__version__),
                         list(dtypes), mode="build" if build_only else "run", dynamic=dynamic,
                         grad=grad, every_opinfo=ops is None)
    p = Probe(backend, backend.manifest(), result, tolerances)
    infos = opinfos(ops)
    if grad:
        infos = [o for o in infos if o.supports_autograd]
    if dynamic:  # overloads no OpInfo traces to (arbiter/probe/overload_samples.py)
        infos += samples_for(ops)
    elif not grad:  # PT2E's quantize/dequantize ops (arbiter/probe/quant_samples.py)
        infos += quant_samples_for(ops)
    one = dynamic_samples if dynamic else probe_training if grad else _one
    result.opinfos_total = len(infos)
    start = time.perf_counter()
    for info in infos:
        if limit_s is not None and time.perf_counter() - start > limit_s:
            result.stopped_early = True
            break
        name = label(info)
        supported = set(info.supported_dtypes("cpu"))
        if grad:  # a dtype without a backward makes no training graph
            supported &= set(info.supported_backward_dtypes("cpu"))
        try:
            for dname in dtypes:
                if DTYPES[dname] not in supported:
                    continue
                result.samples += one(p, Case(info, name, dname, DTYPES[dname]))
        except KeyboardInterrupt:  # Ctrl-C: stop, keep (and write) what is done
            result.stopped_early = True
            break
        result.opinfos_done += 1
        result.elapsed_s = time.perf_counter() - start
        if progress is not None:
            progress(result, name)
    result.elapsed_s = time.perf_counter() - start
    return result


def _one(p: Probe, case: Case) -> list[SampleResult]:
    """One sample of the OpInfo (``pick_sample``), traced and probed."""
    if nondeterministic(case.info):
        return [case.skipped("nondeterministic",
                             "outputs are uninitialized or random: nothing to compare")]
    try:
        sample = pick_sample(case.info, case.dtype)
        if sample is None:
            return [case.skipped("trace", "no sample")]
        gm, inputs = trace_sample(case.info, sample)
    except Exception as exc:  # noqa: BLE001 - OpInfo samples some ops cannot trace
        return [case.skipped("trace", describe(exc))]
    # a hand-made sample chosen for its arguments runs even when its pairs passed
    return probe_graph(p, case, gm, inputs, force=getattr(case.info, "force", False))


def stderr_progress(every_s: float = 5.0) -> Callable[[ProbeResult, str], None]:
    """A progress callback printing ``done/total, samples, ETA`` to stderr."""
    last = [0.0]

    def show(result: ProbeResult, label: str) -> None:
        now = time.perf_counter()
        done, total = result.opinfos_done, result.opinfos_total
        if now - last[0] < every_s and done != total:
            return
        last[0] = now
        c = result.counts()
        eta = result.elapsed_s / done * (total - done) if done else 0.0
        print(f"[probe {result.backend}] {done}/{total} OpInfos ({label}); samples: "
              f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped; "
              f"{result.elapsed_s:.0f} s, ETA {eta:.0f} s", file=sys.stderr, flush=True)

    return show
