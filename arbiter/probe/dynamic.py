"""The dynamic probe (``arbiter probe --dynamic``): samples traced with symbolic sizes.

Each is compiled once as arbiter compiles a symbolic partition
(``arbiter.run.dynamic.Symbolic``, which checks the artifact at a second shape) and run
at the sample's own sizes. Per (OpInfo, dtype), up to ``DYNAMIC_SAMPLES`` samples are
looked at and up to ``DYNAMIC_RUNS`` run, until every op they hold has passed. Every size
of 2 or more is a symbol first (equal sizes one symbol, as Dynamo does); a sample left
with no second shape, or failing, is traced again with the innermost size of each input
static (a feature size, fixed by weights in a model), then with a symbol per size. A
passing sample credits each op that read or wrote a symbolic tensor; a failing one of a
single op blames it (``ProbeResult.record``; what the manifest becomes:
``arbiter.probe.update.dynamic_update``).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.fx

from ..plan.capability import tensor_descs
from ..errors import describe
from ..ops import op_name
from ..backend import Backend
from ..run.checks.verify import output_specs
from .judge import run_and_compare
from .result import SampleResult
from .sampling import graph_ops, nondeterministic, quiet_warnings, samples, trace_sample
from .settings import Case, Probe

#: OpInfo samples looked at, and run, per (OpInfo, dtype) by the dynamic probe.
DYNAMIC_SAMPLES = 16
DYNAMIC_RUNS = 6

#: How a sample is traced with symbols, in order, until one has a second shape:
#: (innermost sizes static, equal sizes one symbol). Duck sizing first (Dynamo's way);
#: without it, a sample whose sizes are all 2 is not one symbol pinned by a fixed size.
_TRACINGS = ((False, True), (True, True), (False, False))


def dynamic_samples(p: Probe, case: Case) -> list[SampleResult]:
    """The OpInfo's samples (at most ``DYNAMIC_SAMPLES`` looked at, ``DYNAMIC_RUNS`` run)
    traced with symbolic sizes, each run through one artifact at two sizes. A sample is
    run when its trace has symbols, a second shape, and an op not yet passed: an
    OpInfo's later samples reach other overloads (``sum.dim_IntList`` after
    ``sum.default``). Every size of 2 or more is symbolic first; a sample that then has
    no second shape (``layer_norm`` over a shape equal to its input's: one symbol,
    pinned) or fails is traced again with the innermost size of each input static, as a
    model's feature sizes are (``_innermost_static``). Returns the samples run, or the
    reason the last one looked at was skipped."""
    if nondeterministic(case.info):
        return [case.skipped("nondeterministic",
                             "outputs are uninitialized or random: nothing to compare")]
    run: list[SampleResult] = []
    last = case.skipped("trace", "no sample")
    for sample in samples(case.info, case.dtype, DYNAMIC_SAMPLES):
        if len(run) >= DYNAMIC_RUNS:
            break
        traced = None
        for static_last, duck in _TRACINGS:
            got = _trace_dynamic(p, case, sample, static_last, duck)
            if isinstance(got, SampleResult):
                last = got
                if got.stage in ("manifest", "covered", "trace", "validator"):
                    break  # the same traced another way
                continue
            traced = (got, static_last or not duck)
            break
        if traced is None:
            continue
        (gm, inputs, names, credit), second_way = traced
        status, stage, reason, err = probe_dynamic_sample(p.backend, gm, inputs, p.tolerances)
        found = case.sample(names, status, stage, reason, err)
        if status == "failed" and not second_way:
            found = _innermost_static(p, case, sample, found) or found
        p.result.record(found, credit)
        run.append(found)
    return run or [last]


def _trace_dynamic(p: Probe, case: Case, sample, static_last: bool, duck: bool = True):
    """(graph, inputs, op names, credit) of one sample traced with symbols, or the
    SampleResult saying why it is skipped."""
    from ..shapes import input_values, second_assignment

    try:
        # no decompositions: a backend's are traced for static shapes only
        # (arbiter/decompose/), so the planner never hands it a symbolic node of an op
        # it wants decomposed
        gm, inputs = trace_sample(case.info, sample, symbolic=True,
                                  static_last=static_last, duck=duck)
    except Exception as exc:  # noqa: BLE001 - data-dependent ops cannot trace symbolically
        return case.skipped("trace", describe(exc))
    nodes, why = graph_ops(gm, allow_sizes=True)
    if why is not None:
        return case.skipped("trace", why)
    names = sorted({op_name(n.target) for n in nodes})
    missing = p.missing(names)
    if missing:
        return case.skipped("manifest", f"not in the manifest: {', '.join(missing[:5])}",
                            names)
    refused = p.refused(nodes)
    if refused:
        return case.skipped("validator", refused, names)
    memo: dict = {}
    credit = {(op_name(n.target), case.dname) for n in nodes
              if any(d.symbolic for d in tensor_descs(n, memo))}
    if not credit:
        return case.skipped("static", "no symbolic size (sizes 0 and 1 stay static)", names)
    if all(op in p.result.dynamic_passed for op, _ in credit):
        return case.skipped("covered", "every op already passed with symbols", names)
    if second_assignment(input_values(gm), inputs) is None:
        return case.skipped("shapes", "the sample fixes its sizes: no second shape", names)
    return gm, inputs, names, credit


def _innermost_static(p: Probe, case: Case, sample,
                      failed: SampleResult) -> Optional[SampleResult]:
    """The sample again with the innermost size of each input static, after it failed
    with every size symbolic: passing that way, the op takes symbols as models vary them
    (batch, sequence, image size; a feature or head size is fixed by the weights), and
    each partition's artifact is checked at a second shape anyway (run/dynamic.py). The
    full failure stays in the sample's reason. None when it fails again or cannot run."""
    got = _trace_dynamic(p, case, sample, True)
    if isinstance(got, SampleResult):
        return None
    gm, inputs, _, _ = got
    status, _, _, err = probe_dynamic_sample(p.backend, gm, inputs, p.tolerances)
    if status != "passed":
        return None
    return SampleResult(failed.opinfo, failed.dtype, failed.ops, "passed", "innermost static",
                        f"every size symbolic: {failed.stage}: {failed.reason}"[:300], err)


def probe_dynamic_sample(backend: Backend, gm: torch.fx.GraphModule, inputs: list,
                         tolerances: Optional[dict] = None) -> tuple[str, str, str, Optional[float]]:
    """(status, stage, reason, max_error) for a symbolically traced sample: compiled once
    (``run.dynamic.Symbolic``, which checks a second shape), then run at the sample's own."""
    from torch.utils._python_dispatch import _disable_current_modes

    from ..run.dynamic import ShapeError, Symbolic

    args = [t.clone() for t in inputs]
    try:
        expected = gm(*[t.clone() for t in inputs])
    except Exception as exc:  # noqa: BLE001 - eager itself failed: no reference
        return "skipped", "eager", describe(exc), None
    try:
        with _disable_current_modes(), quiet_warnings():
            fn = Symbolic(backend, tolerances).compile(gm, args)
    except ShapeError as exc:
        second = "second shape" in str(exc) and "cannot be checked" not in str(exc)
        return ("failed" if second else "skipped"), "second shape" if second else "shapes", \
            str(exc), None
    except Exception as exc:  # noqa: BLE001
        return "failed", "compile", describe(exc), None
    failed, cmp, _ = run_and_compare(fn, inputs, expected, output_specs(gm), tolerances)
    return failed if failed is not None else ("passed", "", "", cmp.max_error)
