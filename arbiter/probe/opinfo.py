"""Probing a backend with PyTorch's OpInfo samples, to verify its manifest.

For each OpInfo (``torch.testing._internal.common_methods_invocations.op_db``) and each
dtype to try, one sample is traced with ``make_fx`` to an ATen graph (tensor arguments
become graph inputs), compiled by the backend alone (``backend.compile``, no fallback, so
failures are visible; the nodes its manifest's ``decompositions:`` names decomposed for
it, as a partition would be: arbiter/decompose.py) and run; its outputs are checked
against the graph's traced metadata and against eager ATen on the same inputs
(``arbiter.run.verify``, per-dtype tolerances).

``grad``: the sample's backward graph instead, as AOTAutograd hands it to arbiter
(``trace_grad_sample``: ``*_backward`` ops, the forward's saved tensors as real inputs
taken from a real forward), checked the same way: what a training step's backward
partition runs.

Blame and credit, per ATen overload:
* a sample that passes credits every op of its graph with the dtypes of the tensors each
  op read and wrote there (an op decomposed for the backend, and the ops of its
  decomposition, alike; ``ProbeResult.decomposed`` lists the decomposed ones);
* a sample that fails marks every op of its graph as tried and not passed in the dtypes
  its tensors had there (``ProbeResult.failed_dtypes``), but blames the op as a whole only
  when its graph has a single op (a graph of several ops says nothing about which one
  failed);
* a sample is skipped when PyTorch flags its OpInfo's outputs as nondeterministic
  (``empty*``: uninitialized memory), when its graph holds an op not in the manifest, an
  in-place or random op, or a node a validator of the backend refuses (arbiter never
  hands those to it), or when every (op, dtype) in it has already passed;
* a sample that passed runs again with every output of its tuple-returning ops returned
  (``expose_outputs``: what a backward graph reads, such as ``total_weight``), each
  compared with eager on its own (``probe_unreturned``): a wrong one becomes that op's
  ``wrong_outputs`` in the sample's dtype (nodes of that dtype reading it are refused).

``arbiter.probe.update.manifest_update`` turns the result into manifest entries
(``manifest_dtypes`` is the rule): an op keeps the dtypes it allowed before the probe (its entry's ``dtypes:``, or the
manifest's defaults) minus the dtypes tried in a failed sample and passed in none, plus the
dtypes that passed; an op with a passing sample becomes ``verified: probed`` with
``probed_dtypes:`` the dtypes that passed. A dtype no sample tried stays allowed, as
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
Dynamic shapes (``probe(..., dynamic=True)``, ``arbiter probe --dynamic``): each sample is
traced with symbolic sizes (``make_fx(tracing_mode="symbolic")``: every size of 2 or more
a symbol, equal sizes one symbol), compiled once by the backend as a symbolic partition
(``arbiter.run.dynamic.Symbolic``: what arbiter does with a dynamic graph) and run at two
sizes: the sample's own, and a second assignment of its symbols that satisfies the trace's
guards, with inputs tiled from the sample's (``arbiter.shapes``); both are compared with
eager ATen. A passing sample credits each op of its graph that read or wrote a symbolic
tensor (``ProbeResult.dynamic_passed``); a failing one of a single op blames it
(``dynamic_failed``). ``arbiter.probe.update.dynamic_update`` writes ``dynamic: true`` on
the ops that passed, except those whose sample alone gave wrong numbers at some size (a
silent error; an exception at a size is loud, and demotes the partition at run time)
and those that failed alone and passed nowhere (``ProbeResult.dynamic_refused``).
"""
from __future__ import annotations

import contextlib
import logging
import math
import operator
import re
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ..plan.capability import tensor_descs
from ..errors import ArbiterError, describe
from ..manifest import DTYPES
from ..ops import is_getitem, is_mutating, is_random, op_name, packet_name, reads_floating
from ..registry import Backend
from ..decompose import for_backend
from ..run.verify import check_meta, compare, dtype_name, output_specs

log = logging.getLogger(__name__)

DEFAULT_DTYPES = ("float32", "int64", "bool", "float16")


@dataclass
class SampleResult:
    opinfo: str
    dtype: str
    ops: list[str]
    status: str  # passed | failed | skipped
    stage: str = ""  # trace | compile | run | meta | numbers | nonfinite | eager (why not)
    reason: str = ""
    max_error: Optional[float] = None


@dataclass
class ProbeResult:
    backend: str
    backend_version: str
    torch_version: str
    dtypes: list[str]
    samples: list[SampleResult] = field(default_factory=list)
    opinfos_done: int = 0
    opinfos_total: int = 0
    elapsed_s: float = 0.0
    stopped_early: bool = False
    mode: str = "run"  # "run": compiled, run, compared; "build": built only
    passed: dict[str, set] = field(default_factory=lambda: defaultdict(set))  # op -> dtypes
    # op -> {sample dtype: reason}, from failed samples whose graph is that op alone
    failed: dict[str, dict] = field(default_factory=lambda: defaultdict(dict))
    # op -> {dtype: reason}: dtypes its tensors had in a failed sample (any number of ops)
    failed_dtypes: dict[str, dict] = field(default_factory=lambda: defaultdict(dict))
    # outputs of tuple-returning ops the sample does not return (expose_outputs), from
    # samples whose own outputs passed: op -> {(index, sample dtype)} right, and
    # op -> {index: {sample dtype: why}} wrong
    outputs_passed: dict[str, set] = field(default_factory=lambda: defaultdict(set))
    outputs_failed: dict[str, dict] = field(default_factory=lambda: defaultdict(dict))
    grad: bool = False  # backward graphs were probed (trace_grad_sample)
    # ops the backend's manifest decomposes that a sample held: op -> {dtype: status}
    decomposed: dict[str, dict] = field(default_factory=lambda: defaultdict(dict))
    # dynamic probe: ops credited by a sample that passed at two sizes through one
    # artifact, and ops whose sample alone failed (op -> why)
    dynamic: bool = False
    dynamic_passed: set = field(default_factory=set)
    dynamic_failed: dict[str, str] = field(default_factory=dict)
    # ops that passed only with the innermost sizes static: op -> the full failure
    dynamic_partial: dict[str, str] = field(default_factory=dict)
    # ops whose sample alone gave wrong numbers at some size (silent, unlike an
    # exception, which demotes at run time): op -> why; they stay static
    dynamic_wrong: dict[str, str] = field(default_factory=dict)

    def dynamic_refused(self) -> dict[str, str]:
        """Ops a dynamic probe keeps static: wrong numbers alone in some sample, or failed
        alone and passed in none."""
        out = {op: why for op, why in self.dynamic_failed.items()
               if op not in self.dynamic_passed}
        out.update(self.dynamic_wrong)
        return out

    def wrong_outputs(self, op: str) -> dict[int, dict[str, str]]:
        """{output index: {dtype: why}} of ``op`` that differed from eager in a sample."""
        return {k: dict(v) for k, v in self.outputs_failed.get(op, {}).items()}

    def record(self, sample: "SampleResult", credit: Iterable[tuple[str, str]]) -> None:
        """Credit or blame for one run sample; ``credit``: the (op, dtype name) pairs of
        the tensors each op of its graph read and wrote (dynamic probe: the ops that
        read or wrote symbolic tensors, dtype names unused)."""
        if self.dynamic:
            if sample.status == "passed":
                self.dynamic_passed |= {op for op, _ in credit}
                if sample.stage == "innermost static" and len(sample.ops) == 1:
                    self.dynamic_partial.setdefault(sample.ops[0], sample.reason)
            elif sample.status == "failed" and len(sample.ops) == 1:
                why = f"{sample.stage}: {sample.reason}"[:300]
                self.dynamic_failed.setdefault(sample.ops[0], why)
                if sample.stage == "numbers" or "differs from eager" in sample.reason:
                    self.dynamic_wrong.setdefault(sample.ops[0], why)
            return
        if sample.status == "passed":
            for op, dt in credit:
                self.passed[op].add(dt)
        elif sample.status == "failed":
            why = f"{sample.stage}: {sample.reason}"
            for op, dt in credit:
                self.failed_dtypes[op].setdefault(dt, why)
            if len(sample.ops) == 1:
                self.failed[sample.ops[0]].setdefault(sample.dtype, why)

    def dropped(self, op: str) -> dict[str, str]:
        """{dtype: why} tried for ``op`` in a failed sample and passed by none."""
        return {d: why for d, why in self.failed_dtypes.get(op, {}).items()
                if d not in self.passed.get(op, ())}

    def counts(self) -> dict[str, int]:
        c = {"passed": 0, "failed": 0, "skipped": 0}
        for s in self.samples:
            c[s.status] += 1
        return c

    def summary(self) -> str:
        c = self.counts()
        if self.dynamic:
            failed = list(self.dynamic_refused())
            return (f"{self.backend} (dynamic shapes): {self.opinfos_done}/{self.opinfos_total} "
                    f"OpInfos, {c['passed'] + c['failed']} samples run at two sizes "
                    f"({c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped) in "
                    f"{self.elapsed_s:.0f} s; {len(self.dynamic_passed)} ops take symbols, "
                    f"{len(failed)} ops kept static (failed alone)"
                    f"{' (stopped at the time limit)' if self.stopped_early else ''}")
        failed_ops = [op for op in self.failed if op not in self.passed]
        dec = ""
        if self.decomposed:
            ok = sorted(op for op, per in self.decomposed.items() if "passed" in per.values())
            bad = sorted(op for op, per in self.decomposed.items()
                         if "failed" in per.values() and op not in ok)
            dec = (f"; decomposed for it: {len(ok)} ops passed"
                   f"{' (' + ', '.join(ok) + ')' if ok else ''}, {len(bad)} failed"
                   f"{' (' + ', '.join(bad) + ')' if bad else ''}")
        return (f"{self.backend}{' (backward graphs)' if self.grad else ''}: "
                f"{self.opinfos_done}/{self.opinfos_total} OpInfos, "
                f"{c['passed'] + c['failed']} samples run ({c['passed']} passed, "
                f"{c['failed']} failed, {c['skipped']} skipped) in {self.elapsed_s:.0f} s; "
                f"{len(self.passed)} ops {'built (not run)' if self.mode == 'build' else 'verified'}, "
                f"{len(failed_ops)} ops failed every "
                f"sample, {len(self.outputs_failed)} ops with wrong unreturned outputs{dec}"
                f"{' (stopped at the time limit)' if self.stopped_early else ''}")


def opinfos(names: Optional[Sequence[str]] = None) -> list:
    """OpInfos of PyTorch's op_db, optionally only those matching ``names`` (an OpInfo
    name such as ``nn.functional.gelu``, or an ATen op ``aten.gelu[.overload]``)."""
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ImportError as exc:  # expecttest is what is usually missing
        raise ArbiterError(f"cannot import PyTorch's OpInfo database ({exc}); install the "
                           "test extra: pip install 'torch-arbiter[test]'") from None
    if not names:
        return list(op_db)
    wanted = set()
    for n in names:
        wanted.add(n)
        if n.startswith("aten."):
            wanted.add(n.split(".")[1])
    return [o for o in op_db if o.name in wanted or o.aten_name in wanted
            or (o.name.rsplit(".", 1)[-1] in wanted and o.name.startswith("nn.functional"))]


def pick_grad_sample(opinfo, dtype: torch.dtype):
    """The first sample with a differentiable tensor input of more than one element."""
    torch.manual_seed(0)
    for k, s in enumerate(opinfo.sample_inputs("cpu", dtype, requires_grad=True)):
        if isinstance(s.input, torch.Tensor) and s.input.numel() > 1 and s.input.requires_grad:
            return s
        if k >= 8:
            break
    return None


def _pick_sample(opinfo, dtype: torch.dtype):
    """The first sample whose input has more than one element, else the first sample."""
    torch.manual_seed(0)
    first = None
    for k, s in enumerate(opinfo.sample_inputs("cpu", dtype, requires_grad=False)):
        if first is None:
            first = s
        if isinstance(s.input, torch.Tensor) and s.input.numel() > 1:
            return s
        if k >= 8:
            break
    return first


def sample_fn(opinfo, sample):
    """(fn, real input tensors) for one OpInfo sample: ``fn(*tensors)`` calls the op with
    the sample's other arguments and returns its tensor outputs as a tuple."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    idx = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    tensors = [leaves[i].detach().clone() for i in idx]

    def fn(*ts):
        vals = list(leaves)
        for i, t in zip(idx, ts):
            vals[i] = t
        inp, args, kwargs = pytree.tree_unflatten(vals, spec)
        out = opinfo.op(inp, *args, **kwargs)
        return tuple(o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor))

    return fn, tensors


def trace_sample(opinfo, sample, decompositions: Optional[dict] = None,
                 symbolic: bool = False, static_last: bool = False, duck: bool = True):
    """(ATen graph returning a tuple, real input tensors) for one OpInfo sample;
    ``symbolic``: sizes traced as symbols (``symbolic_inputs``; 0 and 1 stay static)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    call, tensors = sample_fn(opinfo, sample)

    def fn(*ts):
        flat = call(*ts)
        if not flat:
            raise TypeError("the op returned no tensor")
        return flat

    if not symbolic:
        return make_fx(fn, tracing_mode="fake",
                       decomposition_table=decompositions or {})(*tensors), tensors
    return make_fx(fn, tracing_mode="symbolic", decomposition_table=decompositions or {})(
        *symbolic_inputs(tensors, static_last, duck)), tensors


def symbolic_inputs(tensors: Sequence[torch.Tensor], static_last: bool = False,
                    duck: bool = True) -> list:
    """Fake copies of ``tensors`` with a symbol for every size of 2 or more; equal sizes
    share one ("duck" sizing, as Dynamo does: a sample's equal sizes are often meant
    equal, such as the key and value lengths of attention, which no meta kernel checks);
    ``static_last``: the innermost size of each stays static (a feature or head size,
    fixed by weights in a model); ``duck=False``: a symbol per size."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (DimDynamic, ShapeEnv,
                                                       StatelessSymbolicContext)

    mode = FakeTensorMode(shape_env=ShapeEnv())
    out = []
    for t in tensors:
        dims = [(DimDynamic.DUCK if duck else DimDynamic.DYNAMIC)
                if n > 1 and not (static_last and d == t.dim() - 1)
                else DimDynamic.STATIC for d, n in enumerate(t.shape)]
        out.append(mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(
            dynamic_sizes=dims)))
    return out


def trace_grad_sample(opinfo, sample):
    """(backward ATen graph returning a tuple of tensors, its real inputs) for one OpInfo
    sample: AOTAutograd's backward graph as arbiter's lowering gets it (no
    decompositions), its inputs (the forward's saved tensors, the cotangents) captured
    from a real forward and backward with a fixed random cotangent per differentiable
    output. Gradients that are None (inputs without one) are left out of the outputs."""
    from functorch.compile import aot_function, make_boxed_func

    leaves = [v for v in pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
              if isinstance(v, torch.Tensor)]
    if any(t.layout != torch.strided for t in leaves):
        raise TypeError("sparse or other non-strided input")
    wants = [t.requires_grad for t in leaves]
    call, tensors = sample_fn(opinfo, sample)
    captured: dict = {}

    def fw(gm, _inputs):
        return make_boxed_func(gm)

    def bw(gm, _inputs):
        captured["gm"] = gm

        def run(args):
            captured["args"] = [a.detach().clone() if isinstance(a, torch.Tensor) else a
                                for a in args]
            return gm(*args)

        run._boxed_call = True
        return run

    ins = [t.clone().requires_grad_(w) for t, w in zip(tensors, wants)]
    outs = aot_function(call, fw_compiler=fw, bw_compiler=bw)(*ins)
    diff = [o for o in outs if o.requires_grad]
    grads_of = [t for t in ins if t.requires_grad]
    if not diff or not grads_of:
        raise TypeError("no differentiable output or input")
    gen = torch.Generator().manual_seed(1)
    cots = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in diff]
    torch.autograd.grad(diff, grads_of, cots, allow_unused=True)
    if "gm" not in captured or "args" not in captured:
        raise TypeError("AOTAutograd made no backward graph")
    gm, args = captured["gm"], captured["args"]
    if not all(isinstance(a, torch.Tensor) for a in args):
        raise TypeError("the backward graph takes a non-tensor input")
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    kept = tuple(a for a in out.args[0] if isinstance(a, torch.fx.Node))
    if not kept:
        raise TypeError("the backward graph returns no tensor")
    out.args = (kept,)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm, args


def expose_outputs(gm: torch.fx.GraphModule) -> list[tuple[torch.fx.Node, int]]:
    """Make ``gm`` also return every tensor output of its tuple-returning ops that it
    does not return already (``total_weight`` of ``nll_loss_forward``, the statistics of
    ``native_layer_norm``, SDPA's ``logsumexp``...): outputs a user never sees but a
    backward graph reads. Returns (node, output index) per output added, in the order
    they now follow the graph's own outputs."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    returned = list(out.args[0]) if isinstance(out.args[0], (tuple, list)) else [out.args[0]]
    added = []
    for n in list(gm.graph.nodes):
        val = n.meta.get("val")
        if n.op != "call_function" or not isinstance(val, (tuple, list)) \
                or not isinstance(n.target, torch._ops.OpOverload):
            continue
        getitems = {u.args[1]: u for u in n.users if is_getitem(u)}
        for k, v in enumerate(val):
            if not isinstance(v, torch.Tensor):
                continue
            g = getitems.get(k)
            if g is None:
                with gm.graph.inserting_after(n):
                    g = gm.graph.call_function(operator.getitem, (n, k))
                g.meta["val"] = v
            if g not in returned:
                returned.append(g)
                added.append((n, k))
    out.args = (tuple(returned),)
    gm.recompile()
    return added


def _graph_ops(gm: torch.fx.GraphModule, allow_sizes: bool = False
               ) -> tuple[list[torch.fx.Node], Optional[str]]:
    """The ATen compute nodes of a sample's graph, or why it cannot be probed.
    ``allow_sizes``: size computations (``sym_size``, ``operator.mul`` of sizes) are left
    out rather than refused (a symbolic trace has them; arbiter runs them in place)."""
    nodes = []
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output", "get_attr") or is_getitem(n):
            continue
        if allow_sizes and isinstance(n.meta.get("val"), (torch.SymInt, torch.SymBool,
                                                          torch.SymFloat, int, bool)):
            continue
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            return [], f"non-ATen node {n.format_node()[:80]}"
        if is_mutating(n):
            return [], f"{op_name(n.target)} mutates its input (never handed to a backend)"
        if is_random(n):
            return [], f"{op_name(n.target)} is random (never handed to a backend)"
        nodes.append(n)
    if not nodes:
        return [], "the graph has no ATen op"
    return nodes, None


def _run_and_compare(fn, inputs: list, expected, specs, tolerances) -> tuple:
    """Run a compiled sample on copies of ``inputs`` and judge it against ``expected``:
    (failure, None) with failure = (status, stage, reason, max_error), or (None, the
    comparison)."""
    try:
        with _quiet_warnings():
            got = fn(*[t.clone() for t in inputs])
    except Exception as exc:  # noqa: BLE001 - recorded, that is what a probe is for
        return ("failed", "run", describe(exc), None), None
    if specs is not None:
        why = check_meta(got, specs)
        if why is not None:
            return ("failed", "meta", why, None), None
    cmp = compare(list(expected), list(got), tolerances)
    if not cmp.ok:
        return ("failed", "numbers", cmp.detail, cmp.max_error), None
    return None, cmp


def probe_sample(backend: Backend, gm: torch.fx.GraphModule, inputs: list,
                 tolerances: Optional[dict] = None) -> tuple[str, str, str, Optional[float]]:
    """(status, stage, reason, max_error) for one traced sample through ``backend`` (the
    nodes it wants decomposed decomposed for it, as a partition's piece does), compared
    with ``gm`` run in eager."""
    from torch.utils._python_dispatch import _disable_current_modes

    specs = output_specs(gm)
    try:
        expected = gm(*[t.clone() for t in inputs])
    except Exception as exc:  # noqa: BLE001 - eager itself failed: no reference
        return "skipped", "eager", describe(exc), None
    try:
        with _disable_current_modes(), _quiet_warnings():
            fn = backend.compile(for_backend(gm, backend), [t.clone() for t in inputs])
    except Exception as exc:  # noqa: BLE001 - recorded, that is what a probe is for
        return "failed", "compile", describe(exc), None
    failed, cmp = _run_and_compare(fn, inputs, expected, specs, tolerances)
    if failed is not None:
        return failed
    found = probe_nonfinite(fn, gm, inputs, tolerances)
    if "nan" in found:  # a NaN that vanishes or appears: refused (docs/robustness.md)
        return "failed", "nonfinite", "; ".join(found.values()), None
    # +-inf, -0.0 and huge values: reported, not refused (inf arithmetic, signed zeros
    # and overflow inside composite formulas differ even between eager and Inductor)
    note = "; ".join(found.values())
    return "passed", "", f"not refused: {note}" if note else "", cmp.max_error


#: The special values ``nonfinite_inputs`` writes, by kind.
NONFINITE_KINDS = ("nan", "inf", "zero", "huge")


def _specials(kind: str, dtype: torch.dtype) -> list[float]:
    if kind == "nan":
        return [math.nan]
    if kind == "inf":
        return [math.inf, -math.inf]
    if kind == "zero":
        return [-0.0]
    huge = float(torch.finfo(dtype).max) / 4
    return [huge, -huge]


def nonfinite_inputs(inputs: Sequence[torch.Tensor],
                     kinds: Sequence[str] = NONFINITE_KINDS,
                     first_only: bool = False) -> Optional[list]:
    """Copies of ``inputs`` whose floating tensors hold special values of ``kinds``: NaN,
    +-inf, -0.0, and huge values of both signs (a quarter of the dtype's largest),
    spread over the elements (so that a reduction's rows get different ones) and
    shifted from one input to the next (so that a binary op meets NaN against a
    number); None when no input gets any. ``first_only``: only the first floating
    tensor (an OpInfo sample's input, not its weights). Deterministic."""
    out, changed = [], False
    for i, t in enumerate(inputs):
        t = t.clone()
        if t.is_floating_point() and t.numel() and not (first_only and changed):
            specials = [v for k in kinds for v in _specials(k, t.dtype)]
            r = i % len(specials)
            specials = specials[r:] + specials[:r]
            n = t.numel()
            step = max(1, n // len(specials))
            flat = t.detach().flatten().clone()
            for k, v in enumerate(specials[:n]):
                flat[(k * step + i) % n] = v
            with torch.no_grad():
                t.copy_(flat.view(t.shape))
            changed = True
        out.append(t)
    return out if changed else None


def probe_nonfinite(fn: Callable, gm: torch.fx.GraphModule, inputs: Sequence[torch.Tensor],
                    tolerances: Optional[dict] = None) -> dict[str, str]:
    """{kind: how ``fn`` (the backend's compiled ``gm``) differs from eager} when its
    first floating input (the op's input, not its weights: a NaN weight at a padded
    position is NaN in eager's convolution only) holds values of that kind
    (``NONFINITE_KINDS``: NaN, +-inf, -0.0, huge; one kind at a time, so the reason says
    which); empty when it does not. Eager failing on
    them, or the backend raising, is not judged: a raise is loud at run time too (the
    piece falls back); only a silent difference is (OpenVINO's exp(NaN) is inf,
    maximum(NaN, 0) is 0: eager says NaN). Float -> integer conversions are not judged:
    undefined for such values in eager too."""
    if _converts_float_to_int(gm):
        return {}
    found: dict[str, str] = {}
    for kind in NONFINITE_KINDS:
        special = nonfinite_inputs(inputs, (kind,), first_only=True)
        if special is None:
            return {}
        try:
            with _quiet_warnings():
                expected = list(gm(*[t.clone() for t in special]))
        except Exception:  # noqa: BLE001 - eager refuses such inputs: nothing to compare
            continue
        try:
            with _quiet_warnings():
                got = list(fn(*[t.clone() for t in special]))
        except Exception:  # noqa: BLE001 - loud at run time too
            log.debug("non-finite inputs: the backend raised", exc_info=True)
            continue
        cmp = compare(expected, got, tolerances)
        if not cmp.ok:
            found[kind] = f"with {_KIND_NAMES[kind]} inputs: {cmp.detail}"
    return found


_KIND_NAMES = {"nan": "NaN", "inf": "+-inf", "zero": "-0.0", "huge": "huge"}


def _converts_float_to_int(gm: torch.fx.GraphModule) -> bool:
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if n.op == "call_function" and isinstance(val, torch.Tensor) \
                and not val.is_floating_point() and not val.is_complex() \
                and val.dtype != torch.bool and reads_floating(n) \
                and op_name(n.target).split(".")[1] in ("_to_copy", "to", "convert_element_type"):
            return True
    return False


def probe_build(backend: Backend, gm: torch.fx.GraphModule,
                inputs: list) -> tuple[str, str, str, Optional[float]]:
    """(status, stage, reason, None) for one traced sample built by ``backend`` and not
    run (``Backend.build_only``): "passed" means converted and built."""
    from torch.utils._python_dispatch import _disable_current_modes

    try:
        with _disable_current_modes(), _quiet_warnings():
            what = backend.build_only(for_backend(gm, backend), [t.clone() for t in inputs])
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - recorded, that is what a probe is for
        return "failed", "build", describe(exc), None
    return "passed", "", what or "built (not run)", None


def probe_unreturned(backend: Backend, gm: torch.fx.GraphModule, inputs: list,
                     tolerances: Optional[dict] = None) -> tuple[list, dict]:
    """For a graph that passed ``probe_sample``: its ops' outputs it does not return
    (``expose_outputs``, which changes ``gm``), each compared with eager on its own.
    Returns (the (node, output index) pairs checked, {pair: why} for each wrong one).
    A graph that fails to compile or run with them returned checks none: such a failure
    is loud at run time too (the piece falls back), only wrong numbers are silent."""
    from torch.utils._python_dispatch import _disable_current_modes

    added = expose_outputs(gm)
    if not added:
        return [], {}
    first = len(output_specs(gm) or ()) - len(added)
    try:
        expected = list(gm(*[t.clone() for t in inputs]))[first:]
        with _disable_current_modes(), _quiet_warnings():
            fn = backend.compile(for_backend(gm, backend), [t.clone() for t in inputs])
            got = list(fn(*[t.clone() for t in inputs]))[first:]
    except Exception:  # noqa: BLE001 - not silent; see the docstring
        log.debug("unreturned outputs: compile or run failed", exc_info=True)
        return [], {}
    wrong = {}
    for a, e, g in zip(added, expected, got):
        cmp = compare([e], [g], tolerances)
        if not cmp.ok:
            wrong[a] = re.sub(r"^output 0 \([^)]*\):? ?", "", cmp.detail)
    return added, wrong


@contextlib.contextmanager
def _quiet_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def probe(backend: Backend, *, ops: Optional[Sequence[str]] = None,
          dtypes: Sequence[str] = DEFAULT_DTYPES, limit_s: Optional[float] = None,
          progress: Optional[Callable[[ProbeResult, str], None]] = None,
          tolerances: Optional[dict] = None, build_only: bool = False,
          grad: bool = False, dynamic: bool = False) -> ProbeResult:
    """Probe ``backend`` with OpInfo samples; see the module docstring. ``build_only``:
    build each sample, do not run it. ``dynamic``: probe symbolic shapes (two sizes
    through one artifact) instead of dtypes. ``grad``: probe each sample's backward graph
    (OpInfos without a backward are left out)."""
    if build_only and dynamic:
        raise ValueError("probe: build_only and dynamic are exclusive (a dynamic probe runs "
                         "each artifact at two sizes)")
    if grad and (build_only or dynamic):
        raise ValueError("probe: grad is exclusive with build_only and dynamic (backward "
                         "graphs are probed with static shapes, run)")
    manifest = backend.manifest()
    result = ProbeResult(backend.name, str(backend.version()), str(torch.__version__),
                         list(dtypes), mode="build" if build_only else "run", dynamic=dynamic,
                         grad=grad)
    infos = opinfos(ops)
    if grad:
        infos = [o for o in infos if o.supports_autograd]
    if dynamic:  # overloads no OpInfo traces to (arbiter/probe/samples.py)
        from .samples import samples_for

        infos += samples_for(ops)
    # a dynamic probe decomposes nothing: a backend's decompositions are traced for
    # static shapes only (arbiter/decompose.py), so the planner never hands it a symbolic
    # node of an op it wants decomposed
    decomps: dict = {}
    result.opinfos_total = len(infos)
    start = time.perf_counter()
    for info in infos:
        if limit_s is not None and time.perf_counter() - start > limit_s:
            result.stopped_early = True
            break
        label = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
        supported = info.supported_dtypes("cpu")
        try:
            for dname in dtypes:
                dtype = DTYPES[dname]
                if dtype not in supported:
                    continue
                if dynamic:
                    result.samples += _dynamic_samples(backend, manifest, info, label, dname,
                                                       dtype, decomps, result, tolerances)
                    continue
                result.samples.append(_one(backend, manifest, info, label, dname, dtype,
                                           result, tolerances))
        except KeyboardInterrupt:  # Ctrl-C: stop, keep (and write) what is done
            result.stopped_early = True
            break
        result.opinfos_done += 1
        result.elapsed_s = time.perf_counter() - start
        if progress is not None:
            progress(result, label)
    result.elapsed_s = time.perf_counter() - start
    return result


def _nondeterministic(info) -> bool:
    """OpInfos whose outputs no comparison can judge (uninitialized memory, randomness),
    by PyTorch's own flags on them."""
    return bool(getattr(info, "has_nondeterministic_output", False)
                or getattr(info, "skip_correctness_check_compile_vs_eager", False))


def _one(backend, manifest, info, label, dname, dtype, result, tolerances) -> SampleResult:
    if _nondeterministic(info):
        return SampleResult(label, dname, [], "skipped", "nondeterministic",
                            "outputs are uninitialized or random: nothing to compare")
    try:
        sample = pick_grad_sample(info, dtype) if result.grad else _pick_sample(info, dtype)
        if sample is None:
            return SampleResult(label, dname, [], "skipped", "trace", "no sample")
        gm, inputs = trace_grad_sample(info, sample) if result.grad else trace_sample(info, sample)
    except Exception as exc:  # noqa: BLE001 - OpInfo samples some ops cannot trace
        return SampleResult(label, dname, [], "skipped", "trace", describe(exc))
    nodes, why = _graph_ops(gm)
    if why is not None:
        return SampleResult(label, dname, [], "skipped", "trace", why)
    names = [op_name(n.target) for n in nodes]
    try:  # what the backend gets: the nodes it wants decomposed, decomposed
        dgm = for_backend(gm, backend)
    except Exception as exc:  # noqa: BLE001 - the planner would refuse such a node
        return SampleResult(label, dname, sorted(set(names)), "skipped", "decompose",
                            describe(exc))
    dnodes, why = _graph_ops(dgm) if dgm is not gm else (nodes, None)
    if why is not None:
        return SampleResult(label, dname, sorted(set(names)), "skipped", "decompose", why)
    decomposed = sorted(set(names) - {op_name(n.target) for n in dnodes})
    dnames = [op_name(n.target) for n in dnodes]
    missing = sorted({n for n in dnames if manifest.entry(n) is None})
    if missing:
        return SampleResult(label, dname, sorted(set(names)), "skipped", "manifest",
                            f"not in the manifest: {', '.join(missing[:5])}"
                            + (f" (decomposing {', '.join(decomposed)})" if decomposed else ""))
    refused = _refused(backend, dnodes)
    if refused:
        return SampleResult(label, dname, sorted(set(names)), "skipped", "validator", refused)
    memo: dict = {}
    credit = {(op_name(n.target), dtype_name(d.dtype)) for n in nodes
              for d in tensor_descs(n, memo)}
    if dgm is not gm:
        dmemo: dict = {}
        credit |= {(op_name(n.target), dtype_name(d.dtype)) for n in dnodes
                   for d in tensor_descs(n, dmemo)}
    if all(dt in result.passed.get(op, ()) for op, dt in credit):
        return SampleResult(label, dname, sorted(set(names)), "skipped", "covered",
                            "every (op, dtype) already passed")
    if result.mode == "build":
        status, stage, reason, err = probe_build(backend, gm, inputs)
    else:
        status, stage, reason, err = probe_sample(backend, gm, inputs, tolerances)
    sample = SampleResult(label, dname, sorted(set(names)), status, stage, reason, err)
    result.record(sample, credit)
    for op in decomposed:
        if result.decomposed[op].get(dname) != "passed":
            result.decomposed[op][dname] = status
    if status != "passed" or result.mode == "build":
        return sample
    added, wrong = probe_unreturned(backend, gm, inputs, tolerances)
    for node, k in added:
        op = op_name(node.target)
        why = wrong.get((node, k))
        if why is None:
            result.outputs_passed[op].add((k, dname))
            continue
        result.outputs_failed[op].setdefault(k, {}).setdefault(
            dname, f"differs from eager ({label}): {why}"[:200])
        sample.reason += f"{'; ' if sample.reason else ''}unreturned output {k} of {op} wrong"
    return sample


def _dynamic_samples(backend, manifest, info, label, dname, dtype, decomps, result,
                     tolerances) -> list[SampleResult]:
    """The OpInfo's samples (at most ``DYNAMIC_SAMPLES`` looked at, ``DYNAMIC_RUNS`` run)
    traced with symbolic sizes, each run through one artifact at two sizes. A sample is
    run when its trace has symbols, a second shape, and an op not yet passed: an
    OpInfo's later samples reach other overloads (``sum.dim_IntList`` after
    ``sum.default``). Every size of 2 or more is symbolic first; a sample that then has
    no second shape (``layer_norm`` over a shape equal to its input's: one symbol,
    pinned) or fails is traced again with the innermost size of each input static, as a
    model's feature sizes are (``_innermost_static``). Returns the samples run, or the
    reason the last one looked at was skipped."""
    if _nondeterministic(info):
        return [SampleResult(label, dname, [], "skipped", "nondeterministic",
                             "outputs are uninitialized or random: nothing to compare")]
    run: list[SampleResult] = []
    last = SampleResult(label, dname, [], "skipped", "trace", "no sample")
    for sample in _samples(info, dtype, DYNAMIC_SAMPLES):
        if len(run) >= DYNAMIC_RUNS:
            break
        traced = None
        for static_last, duck in _TRACINGS:
            got = _trace_dynamic(backend, manifest, info, label, dname, sample, decomps,
                                 result, static_last, duck)
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
        status, stage, reason, err = probe_dynamic_sample(backend, gm, inputs, tolerances)
        found = SampleResult(label, dname, names, status, stage, reason, err)
        if status == "failed" and not second_way:
            found = _innermost_static(backend, manifest, info, label, dname, sample, decomps,
                                      result, found, tolerances) or found
        result.record(found, credit)
        run.append(found)
    return run or [last]


#: How a sample is traced with symbols, in order, until one has a second shape:
#: (innermost sizes static, equal sizes one symbol). Duck sizing first (Dynamo's way);
#: without it, a sample whose sizes are all 2 is not one symbol pinned by a fixed size.
_TRACINGS = ((False, True), (True, True), (False, False))


def _trace_dynamic(backend, manifest, info, label, dname, sample, decomps, result,
                   static_last: bool, duck: bool = True):
    """(graph, inputs, op names, credit) of one sample traced with symbols, or the
    SampleResult saying why it is skipped."""
    from ..shapes import input_values, second_assignment

    try:
        gm, inputs = trace_sample(info, sample, decomps, symbolic=True,
                                  static_last=static_last, duck=duck)
    except Exception as exc:  # noqa: BLE001 - data-dependent ops cannot trace symbolically
        return SampleResult(label, dname, [], "skipped", "trace", describe(exc))
    nodes, why = _graph_ops(gm, allow_sizes=True)
    if why is not None:
        return SampleResult(label, dname, [], "skipped", "trace", why)
    names = sorted({op_name(n.target) for n in nodes})
    missing = sorted({n for n in names if manifest.entry(n) is None})
    if missing:
        return SampleResult(label, dname, names, "skipped", "manifest",
                            f"not in the manifest: {', '.join(missing[:5])}")
    refused = _refused(backend, nodes)
    if refused:
        return SampleResult(label, dname, names, "skipped", "validator", refused)
    memo: dict = {}
    credit = {(op_name(n.target), dname) for n in nodes
              if any(d.symbolic for d in tensor_descs(n, memo))}
    if not credit:
        return SampleResult(label, dname, names, "skipped", "static",
                            "no symbolic size (sizes 0 and 1 stay static)")
    if all(op in result.dynamic_passed for op, _ in credit):
        return SampleResult(label, dname, names, "skipped", "covered",
                            "every op already passed with symbols")
    if second_assignment(input_values(gm), inputs) is None:
        return SampleResult(label, dname, names, "skipped", "shapes",
                            "the sample fixes its sizes: no second shape")
    return gm, inputs, names, credit


def _innermost_static(backend, manifest, info, label, dname, sample, decomps, result,
                      failed: SampleResult, tolerances) -> Optional[SampleResult]:
    """The sample again with the innermost size of each input static, after it failed
    with every size symbolic: passing that way, the op takes symbols as models vary them
    (batch, sequence, image size; a feature or head size is fixed by the weights), and
    each partition's artifact is checked at a second shape anyway (run/dynamic.py). The
    full failure stays in the sample's reason. None when it fails again or cannot run."""
    got = _trace_dynamic(backend, manifest, info, label, dname, sample, decomps, result, True)
    if isinstance(got, SampleResult):
        return None
    gm, inputs, _, _ = got
    status, _, _, err = probe_dynamic_sample(backend, gm, inputs, tolerances)
    if status != "passed":
        return None
    return SampleResult(failed.opinfo, failed.dtype, failed.ops, "passed", "innermost static",
                        f"every size symbolic: {failed.stage}: {failed.reason}"[:300], err)


#: OpInfo samples looked at, and run, per (OpInfo, dtype) by the dynamic probe.
DYNAMIC_SAMPLES = 16
DYNAMIC_RUNS = 6


def _samples(opinfo, dtype: torch.dtype, limit: int):
    """The OpInfo's first ``limit`` samples, less those of one element or fewer."""
    torch.manual_seed(0)
    for k, s in enumerate(opinfo.sample_inputs("cpu", dtype, requires_grad=False)):
        if k >= limit:
            return
        first = s.input[0] if isinstance(s.input, (list, tuple)) and s.input else s.input
        if isinstance(first, torch.Tensor) and first.numel() > 1:
            yield s


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
        with _disable_current_modes(), _quiet_warnings():
            fn = Symbolic(backend, tolerances).compile(gm, args)
    except ShapeError as exc:
        second = "second shape" in str(exc) and "cannot be checked" not in str(exc)
        return ("failed" if second else "skipped"), "second shape" if second else "shapes", \
            str(exc), None
    except Exception as exc:  # noqa: BLE001
        return "failed", "compile", describe(exc), None
    failed, cmp = _run_and_compare(fn, inputs, expected, output_specs(gm), tolerances)
    return failed if failed is not None else ("passed", "", "", cmp.max_error)


def _refused(backend: Backend, nodes: Sequence[torch.fx.Node]) -> str:
    """Why the backend's validators refuse a node of the sample ("" if none): arbiter
    never hands such a node to it, so the sample says nothing about the backend."""
    for n in nodes:
        name = op_name(n.target)
        check = backend.validators.get(name) or backend.validators.get(packet_name(name))
        why = check(n) if check is not None else None
        if why:
            return f"{name}: {why}"
    return ""


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


def summarize_failures(samples: Iterable[SampleResult], limit: int = 20) -> list[str]:
    out = []
    for s in samples:
        if s.status == "failed":
            out.append(f"{s.opinfo} [{s.dtype}] {s.stage}: {s.reason[:160]}")
    return out[:limit]
