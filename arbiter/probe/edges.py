"""`arbiter probe BACKEND --edges`: edge-value samples through one backend (docs/robustness.md).

OpInfo samples hold ordinary values; random programs found wrong answers at values no
sample has: integer overflow (eager wraps around), empty dimensions (a mean over nothing
is NaN), huge magnitudes (a remainder of 1e8), NaN made inside a graph (0 / 0 before a
relu), an op's auxiliary outputs (an embedding bag's). ``SAMPLES`` holds one small
program per such edge. Each is traced to ATen, compiled by the backend as arbiter
compiles a partition (its decompositions, its checks of values made inside), run, and
compared with eager; and the nodes the backend refuses are named (arbiter hands it no
such node). A sample that differs from eager and that nothing refuses is a silent wrong
answer: the summary lists those first.
"""
from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ..plan.capability import CapabilityTable
from ..decompose import for_backend
from ..errors import describe
from ..ops import is_getitem, op_name
from ..backend import Backend
from ..registry import get_backend_class
from ..run.checks.verify import compare


@dataclass(frozen=True)
class EdgeSample:
    name: str
    edge: str  # "integer overflow", "empty", "huge", "NaN made inside", "outputs"
    fn: Callable[..., tuple]
    inputs: Callable[[], list]


@dataclass
class EdgeResult:
    name: str
    edge: str
    #: "matched", "differs" (numbers unlike eager), "failed" (compile or run raised)
    status: str
    detail: str = ""
    #: "op: why" for the first node the backend refuses ("" when it takes them all)
    refused: str = ""

    @property
    def silent(self) -> bool:
        """A wrong answer arbiter would hand the user: taken, and unlike eager."""
        return self.status == "differs" and not self.refused


def _ints(*values: int, dtype=torch.int64) -> Callable[[], list]:
    return lambda: [torch.tensor(values, dtype=dtype)]


def _floats(*rows: Sequence[float]) -> Callable[[], list]:
    return lambda: [torch.tensor(r, dtype=torch.float32) for r in rows]


_ZERO_OVER = _floats([0.0, 1.0, -1.0, 2.0, 0.0, 3.0], [0.0, 2.0, -1.0, 0.5, 0.0, 4.0])
_NEGATIVE = _floats([-1.0, 1.0, -2.0, 3.0, 0.5, -0.5])
_HUGE = _floats([1e8, -1e8, 123456789.0, 99999999.0, 16777217.0, 7.5],
                [3.0, 3.0, 7.0, -3.0, 3.0, -2.0])


def _bag(mode: int, padding_idx: int = -1, outputs: int = 4):
    def fn(w, i, o):
        return tuple(torch.ops.aten._embedding_bag.default(
            w, i, o, False, mode, False, None, False, padding_idx)[:outputs])
    return fn


def _bag_inputs() -> list:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(10, 3, generator=g), torch.tensor([1, 9, 4, 4, 0, 9, 7, 2, 9]),
            torch.tensor([0, 3, 3, 5])]


SAMPLES: tuple[EdgeSample, ...] = (
    EdgeSample("pow_int64_overflow", "integer overflow", lambda x: (torch.pow(x, 40),),
               _ints(3, 7, -5, 12, 2, 100)),
    EdgeSample("pow_int64_past_2_53", "integer overflow", lambda x: (torch.pow(x, 39),),
               _ints(3, -3)),
    EdgeSample("pow_int32_overflow", "integer overflow", lambda x: (torch.pow(x, 25),),
               _ints(3, 7, -5, 12, dtype=torch.int32)),
    EdgeSample("add_int64_past_2_31", "integer overflow", lambda x: (x + 2 ** 31,),
               _ints(1, -1, 2 ** 31, 7)),
    EdgeSample("mul_int64_past_2_31", "integer overflow", lambda x: (x * 3,),
               _ints(2 ** 31, -(2 ** 40), 3 ** 39, 7)),
    EdgeSample("sum_int64_past_2_53", "integer overflow", lambda x: (x.sum(),),
               _ints(2 ** 62, -(2 ** 62), 3 ** 39, 7)),
    EdgeSample("cumsum_int64_past_2_31", "integer overflow", lambda x: (x.cumsum(0),),
               _ints(2 ** 31, 2 ** 31, 5, -7)),
    EdgeSample("prod_int64_past_2_53", "integer overflow", lambda x: (x.prod(),),
               _ints(3 ** 20, 3 ** 19)),
    EdgeSample("floor_divide_int64_past_2_24", "integer overflow",
               lambda x: (torch.div(x, 3, rounding_mode="floor"),),
               _ints(2 ** 53 + 1, -(2 ** 62) - 1, 2 ** 24 + 1, -7)),
    EdgeSample("mean_empty_dim", "empty", lambda x: (torch.mean(x, dim=1),),
               lambda: [torch.randn(3, 0)]),
    EdgeSample("mean_empty", "empty", lambda x: (torch.mean(x),), lambda: [torch.randn(0, 4)]),
    EdgeSample("var_empty", "empty", lambda x: (torch.var(x, dim=1, correction=0),),
               lambda: [torch.randn(3, 0)]),
    EdgeSample("std_empty", "empty", lambda x: (torch.std(x, dim=1),),
               lambda: [torch.randn(3, 0)]),
    EdgeSample("logsumexp_empty", "empty", lambda x: (torch.logsumexp(x, dim=1),),
               lambda: [torch.randn(3, 0)]),
    EdgeSample("prod_empty", "empty", lambda x: (torch.prod(x, dim=1),),
               lambda: [torch.randn(3, 0)]),
    EdgeSample("remainder_1e8", "huge", lambda a, b: (torch.remainder(a, b),), _HUGE),
    EdgeSample("remainder_scalar_1e8", "huge", lambda a, b: (torch.remainder(a, 3.0),), _HUGE),
    EdgeSample("fmod_1e8", "huge", lambda a, b: (torch.fmod(a, b),), _HUGE),
    EdgeSample("floor_divide_1e8", "huge", lambda a, b: (torch.floor_divide(a, b),), _HUGE),
    EdgeSample("relu_of_0_over_0", "NaN made inside", lambda x, y: (torch.relu(x / y),),
               _ZERO_OVER),
    EdgeSample("gt_of_0_over_0", "NaN made inside",
               lambda x, y: ((lambda v: (v > v, v > 0.5))(x / y)), _ZERO_OVER),
    EdgeSample("sign_of_0_over_0", "NaN made inside", lambda x, y: (torch.sign(x / y),),
               _ZERO_OVER),
    EdgeSample("bool_of_0_over_0", "NaN made inside", lambda x, y: ((x / y).bool(),),
               _ZERO_OVER),
    EdgeSample("clamp_of_0_over_0", "NaN made inside",
               lambda x, y: (torch.clamp(x / y, -1.0, 1.0),), _ZERO_OVER),
    EdgeSample("exp_of_log_negative", "NaN made inside",
               lambda x: (torch.exp(torch.log(x)),), _NEGATIVE),
    EdgeSample("maximum_of_log_negative", "NaN made inside",
               lambda x: (torch.maximum(torch.log(x), x),), _NEGATIVE),
    EdgeSample("softmax_of_sqrt_negative", "NaN made inside",
               lambda x: (torch.softmax(torch.sqrt(x), 0),), _NEGATIVE),
    EdgeSample("relu_of_inf_minus_inf", "NaN made inside",
               lambda x: (torch.relu(x * 1e30 * 1e30 - x * 1e30 * 1e30),), _NEGATIVE),
    EdgeSample("embedding_bag_sum_outputs", "outputs", _bag(0), _bag_inputs),
    EdgeSample("embedding_bag_mean_outputs", "outputs", _bag(1), _bag_inputs),
    EdgeSample("embedding_bag_max_outputs", "outputs", _bag(2), _bag_inputs),
    EdgeSample("embedding_bag_padding_idx", "outputs", _bag(0, padding_idx=9, outputs=1),
               _bag_inputs),
)


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _refused(table: CapabilityTable, backend: Backend, gm: torch.fx.GraphModule) -> str:
    """"op: why" for the first compute node ``backend`` refuses in ``gm`` ("" if none)."""
    for n in gm.graph.nodes:
        if n.op != "call_function" or is_getitem(n):
            continue
        why = table.support(n).refusals.get(backend.name)
        if why:
            return f"{op_name(n.target)}: {why}"
    return ""


def probe_edge(backend: Backend, sample: EdgeSample,
               table: Optional[CapabilityTable] = None) -> EdgeResult:
    """One sample through ``backend`` (see the module docstring)."""
    from torch.utils._python_dispatch import _disable_current_modes

    if table is None:
        table = CapabilityTable([backend, get_backend_class("eager")()])
    inputs = sample.inputs()
    with _quiet():
        expected = list(sample.fn(*[t.clone() for t in inputs]))
        gm = make_fx(sample.fn, tracing_mode="fake")(*inputs)
    refused = _refused(table, backend, gm)
    out = EdgeResult(sample.name, sample.edge, "matched", refused=refused)
    try:
        with _disable_current_modes(), _quiet():
            fn = backend.compile(for_backend(gm, backend), [t.clone() for t in inputs])
            got = list(fn(*[t.clone() for t in inputs]))
    except Exception as exc:  # noqa: BLE001 - recorded: a loud failure, not a wrong answer
        out.status, out.detail = "failed", describe(exc)
        return out
    cmp = compare(expected, got)
    if not cmp.ok:
        out.status, out.detail = "differs", cmp.detail
    elif not math.isfinite(cmp.max_error) or cmp.max_error:
        out.detail = f"max abs error {cmp.max_error:.3g}"
    return out


def probe_edges(backend: Backend, names: Optional[Sequence[str]] = None,
                progress: Optional[Callable[[EdgeResult], Any]] = None) -> list[EdgeResult]:
    """Every sample of ``SAMPLES`` (or those named) through ``backend``."""
    known = {s.name for s in SAMPLES}
    unknown = sorted(set(names or ()) - known)
    if unknown:
        raise ValueError(f"unknown edge samples {unknown}; known: {', '.join(sorted(known))}")
    table = CapabilityTable([backend, get_backend_class("eager")()])
    results = []
    for sample in SAMPLES:
        if names and sample.name not in names:
            continue
        results.append(probe_edge(backend, sample, table))
        if progress is not None:
            progress(results[-1])
    return results


def summary(backend: str, results: Sequence[EdgeResult]) -> list[str]:
    """Lines for the CLI: the silent wrong answers first, then every sample."""
    silent = [r for r in results if r.silent]
    lines = [f"{backend}: {len(results)} edge samples, {len(silent)} silently wrong "
             f"(differ from eager, not refused), "
             f"{sum(r.status == 'differs' and bool(r.refused) for r in results)} wrong and "
             f"refused, {sum(r.status == 'failed' for r in results)} failed loudly"]
    for r in sorted(results, key=lambda r: (not r.silent, r.edge, r.name)):
        mark = "SILENT " if r.silent else ""
        text = f"  {mark}{r.name} [{r.edge}]: {r.status}"
        if r.detail:
            text += f" ({r.detail})"
        if r.refused:
            text += f"; refused: {r.refused}"
        lines.append(text)
    return lines


def run_cli(backend: Backend, args) -> int:
    """``arbiter probe BACKEND --edges [--ops SAMPLE ...] [--json PATH]``: the summary on
    stdout (exit status 0: what differs is a finding, not an error)."""
    import json
    from dataclasses import asdict

    from ..errors import ArbiterError

    if args.write or args.dynamic or args.build_only or args.grad:
        raise ArbiterError("--edges runs its own samples and writes nothing: it cannot be "
                           "combined with --write, --dynamic, --build-only or --grad")
    try:
        results = probe_edges(backend, args.ops)
    except ValueError as exc:
        raise ArbiterError(f"--ops: {exc}") from None
    print("\n".join(summary(backend.name, results)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**asdict(r), "silent": r.silent} for r in results], f, indent=1)
    return 0
