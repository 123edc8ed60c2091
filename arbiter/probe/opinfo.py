"""Probing a backend with PyTorch's OpInfo samples, to verify its manifest: the driver.

For each OpInfo (``torch.testing._internal.common_methods_invocations.op_db``) and each
dtype to try, one sample is traced with ``make_fx`` to an ATen graph (tensor arguments
become graph inputs: arbiter/probe/sampling.py), compiled by the backend alone
(``backend.compile``, no fallback, so failures are visible; the nodes its manifest's
``decompositions:`` names decomposed for it, as a partition would be:
arbiter/decompose/) and run; its outputs are checked against the graph's traced
metadata and against eager ATen on the same inputs (``arbiter.run.verify``, per-dtype
tolerances), then with NaN, +-inf, -0.0 and huge inputs (arbiter/probe/judge.py,
arbiter/probe/nonfinite.py).

``grad`` (the training probe, arbiter/probe/training.py): each sample's two AOTAutograd
graphs, as arbiter's lowering gets them in training, instead: the forward (``_embedding_bag``,
``max_pool2d_with_indices``, ``native_layer_norm``, ``_native_batch_norm_legit_functional``...),
with every output it returns compared, those saved for the backward included, then the
backward (``*_backward`` ops, the forward's saved tensors as real inputs). More samples
of an OpInfo whose forward holds an op with several outputs, one per new argument value.

Blame and credit, per ATen overload (arbiter/probe/credit.py):
* a sample that passes credits every op of its graph with the dtypes of the tensors each
  op read and wrote there (an op decomposed for the backend, and the ops of its
  decomposition, alike; ``ProbeResult.decomposed`` lists the decomposed ones); a
  training graph's pass is also listed in ``ProbeResult.trained``;
* a sample that fails marks every op of its graph as tried and not passed in the dtypes
  its tensors had there (``ProbeResult.failed_dtypes``), but blames the op as a whole only
  when its graph has a single op (a graph of several ops says nothing about which one
  failed);
* a sample is skipped when PyTorch flags its OpInfo's outputs as nondeterministic
  (``empty*``: uninitialized memory), when its graph holds an op not in the manifest, an
  in-place or random op, a node the backend refuses (a validator, or a tensor of a
  dtype it holds narrower: ``Backend.narrow_dtypes``), or a tensor of a
  dtype its node's entry does not allow and the probe does not try (arbiter never hands
  those to it), or when every (op, dtype) in it has already passed;
* every output of a tuple-returning op is compared on its own: those a training forward
  saves for its backward, and, in a sample that passed, those the graph does not return
  (``expose_outputs``: what a backward graph reads, such as ``total_weight``). A wrong
  one becomes that op's ``wrong_outputs`` in the sample's dtype (nodes of that dtype
  reading it are refused) and does not fail the sample; a wrong saved value of any
  other node fails it. A training forward failing loudly only with its saved outputs
  (or the user's outputs past the first of a tuple-returning op) returned credits its
  ops, makes those outputs ``wrong_outputs`` and blames the nodes
  that compute only saved values (arbiter/probe/judge.py, ``run_sample``).

``arbiter.probe.update.manifest_update`` turns the result into manifest entries
(``manifest_dtypes`` is the rule): an op keeps the dtypes it allowed before the probe (its entry's ``dtypes:``, or the
manifest's defaults) minus the dtypes tried in a failed sample and passed in none, plus the
dtypes that passed; an op with a passing sample becomes ``verified: probed`` with
``probed_dtypes:`` the dtypes that passed (``training_dtypes:`` those a training graph
passed). A dtype no sample tried stays allowed, as
declared. The rule is conservative in one direction only: a failed sample of several ops
drops the dtype for each of its ops that did not pass it elsewhere, although one op alone
may have failed. An op that passed none and whose samples alone failed in every dtype it
allowed is removed (listed with the reason under ``probe.failed``); one that failed alone
only in the dtypes tried keeps the untried ones. Dropped dtypes are listed under
``probe.dtypes_dropped``. Samples are chosen one per (OpInfo, dtype) because compiling is
the cost (ONNX export is 0.3-1 s per sample; Inductor compiles C++).

``build_only``: for a backend that can convert and build where it cannot run (TensorRT
without CUDA), each sample is built (``Backend.build_only``) and not run: passing means
"built", and the manifest says ``verified: built`` with ``built_dtypes`` (numbers were not
compared). Credit, blame and removal follow the same rules.

Dynamic shapes (``probe(..., dynamic=True)``, ``arbiter probe --dynamic``:
arbiter/probe/dynamic.py): each sample is traced with symbolic sizes, compiled once by the
backend as a symbolic partition and run at two sizes, both compared with eager ATen. A
passing sample credits each op of its graph that read or wrote a symbolic tensor
(``ProbeResult.dynamic_passed``); a failing one of a single op blames it
(``dynamic_failed``). ``arbiter.probe.update.dynamic_update`` writes ``dynamic: true`` on
the ops that passed, except those whose sample alone gave wrong numbers at some size (a
silent error; an exception at a size is loud, and demotes the partition at run time)
and those that failed alone and passed nowhere (``ProbeResult.dynamic_refused``).
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Optional

import torch

from ..errors import describe
from ..manifest import DTYPES
from ..registry import Backend
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
    from .training import probe_training

    if build_only and dynamic:
        raise ValueError("probe: build_only and dynamic are exclusive (a dynamic probe runs "
                         "each artifact at two sizes)")
    if grad and (build_only or dynamic):
        raise ValueError("probe: grad is exclusive with build_only and dynamic (training "
                         "graphs are probed with static shapes, run)")
    result = ProbeResult(backend.name, str(backend.version()), str(torch.__version__),
                         list(dtypes), mode="build" if build_only else "run", dynamic=dynamic,
                         grad=grad)
    p = Probe(backend, backend.manifest(), result, tolerances)
    infos = opinfos(ops)
    if grad:
        infos = [o for o in infos if o.supports_autograd]
    if dynamic:  # overloads no OpInfo traces to (arbiter/probe/overload_samples.py)
        infos += samples_for(ops)
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
    return probe_graph(p, case, gm, inputs)


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
