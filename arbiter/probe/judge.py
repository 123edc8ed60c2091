"""One traced sample through a backend alone, judged against eager ATen.

``run_sample`` compiles a sample's graph with the backend (the nodes its manifest wants
decomposed decomposed for it, as a partition's piece does: arbiter/decompose/), runs
it, checks every output against the graph's traced metadata and against eager with the
per-dtype tolerances (``arbiter.run.checks.verify``), then with special values
(arbiter/probe/nonfinite.py). A training forward graph (``saved_from``) returns, after
what the user sees, the tensors its backward reads; those are compared one by one: a
wrong output of a tuple-returning op (``offset2bag`` of ``_embedding_bag``, the ``rstd``
of ``native_layer_norm``) is that op's finding (``Outcome.wrong``), not the sample's.
``probe_unreturned`` does the same for outputs of tuple-returning ops that a graph does
not return at all (``expose_outputs``). ``probe_build`` builds without running.
"""
from __future__ import annotations

import logging
import operator
import re
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.fx

from ..decompose import for_backend
from ..errors import describe
from ..ops import is_getitem
from ..backend import Backend
from ..run.checks.verify import Comparison, check_meta, compare, output_specs
from .nonfinite import probe_nonfinite
from .sampling import quiet_warnings

log = logging.getLogger(__name__)

#: (op node, output index): one output of a tuple-returning op
Output = tuple[torch.fx.Node, int]


@dataclass
class Outcome:
    """How one sample went: ``status`` passed | failed | skipped, the ``stage`` that
    decided it, why, the largest error seen; for a training forward graph, its saved
    outputs of tuple-returning ops that matched eager (``right``) and those that did not
    (``wrong``: output -> why)."""

    status: str
    stage: str = ""
    reason: str = ""
    max_error: Optional[float] = None
    wrong: dict[Output, str] = field(default_factory=dict)
    right: list[Output] = field(default_factory=list)
    # nodes computing only what the forward returns for its backward, when returning it
    # made the graph fail (``failure``) and the graph without it passed (``run_sample``)
    saved_only: list[torch.fx.Node] = field(default_factory=list)
    failure: Optional["Outcome"] = None

    def as_tuple(self) -> tuple[str, str, str, Optional[float]]:
        return self.status, self.stage, self.reason, self.max_error


def returned_nodes(gm: torch.fx.GraphModule) -> list:
    """What ``gm``'s output node returns, as a list."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return list(out.args[0]) if isinstance(out.args[0], (tuple, list)) else [out.args[0]]


def returns_tuple(node: torch.fx.Node) -> bool:
    """Whether ``node`` is an ATen op returning several outputs."""
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) \
        and isinstance(node.meta.get("val"), (tuple, list))


def tuple_output(node) -> Optional[Output]:
    """(op node, index) when ``node`` is output ``index`` of a tuple-returning ATen op."""
    if isinstance(node, torch.fx.Node) and is_getitem(node) and returns_tuple(node.args[0]):
        return node.args[0], node.args[1]
    return None


def expose_outputs(gm: torch.fx.GraphModule) -> list[Output]:
    """Make ``gm`` also return every tensor output of its tuple-returning ops that it
    does not return already (``total_weight`` of ``nll_loss_forward``, the statistics of
    ``native_layer_norm``, SDPA's ``logsumexp``...): outputs a user never sees but a
    backward graph reads. Returns (node, output index) per output added, in the order
    they now follow the graph's own outputs."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    returned = returned_nodes(gm)
    added = []
    for n in list(gm.graph.nodes):
        if not returns_tuple(n):
            continue
        getitems = {u.args[1]: u for u in n.users if is_getitem(u)}
        for k, v in enumerate(n.meta["val"]):
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


def run_and_compare(fn, inputs: list, expected, specs, tolerances,
                    first: Optional[int] = None) -> tuple:
    """Run a compiled sample on copies of ``inputs`` and judge it against ``expected``
    (every output's metadata; the numbers of the first ``first`` outputs, all when
    None): (failure, None, None) with failure = (status, stage, reason, max_error), or
    (None, the comparison, the outputs)."""
    try:
        with quiet_warnings():
            got = list(fn(*[t.clone() for t in inputs]))
    except Exception as exc:  # noqa: BLE001 - recorded, that is what a probe is for
        return ("failed", "run", describe(exc), None), None, None
    if specs is not None:
        why = check_meta(got, specs)
        if why is not None:
            return ("failed", "meta", why, None), None, None
    n = len(expected) if first is None else first
    cmp = compare(list(expected)[:n], got[:n], tolerances)
    if not cmp.ok:
        return ("failed", "numbers", cmp.detail, cmp.max_error), None, None
    return None, cmp, got


def _alone(cmp: Comparison) -> str:
    """A one-output comparison's detail without its "output 0 (dtype)" prefix."""
    return re.sub(r"^output 0 \([^)]*\):? ?", "", cmp.detail)


def run_sample(backend: Backend, gm: torch.fx.GraphModule, inputs: list,
               tolerances: Optional[dict] = None, saved_from: Optional[int] = None) -> Outcome:
    """One traced sample through ``backend``, compared with ``gm`` run in eager (see the
    module docstring). ``saved_from``: the graph is a training forward whose outputs
    from that position on are saved for its backward; each is compared on its own, and
    a wrong one fails the sample only when it is not an output of a tuple-returning op
    (then it is ``Outcome.wrong``). Such a graph that fails loudly (compile, run,
    metadata) is run again returning only what the user sees (``_failing_saved``)."""
    out = _run_sample(backend, gm, inputs, tolerances, saved_from)
    if saved_from is None or out.status != "failed" or out.stage not in ("compile", "run",
                                                                         "meta"):
        return out
    return _failing_saved(backend, gm, inputs, tolerances, saved_from, out) or out


def _failing_saved(backend: Backend, gm: torch.fx.GraphModule, inputs: list,
                   tolerances: Optional[dict], saved_from: int,
                   failed: Outcome) -> Optional[Outcome]:
    """A training forward that failed loudly, again without the outputs saved for its
    backward (what an inference partition of the same ops returns), and without the
    outputs past the first of its tuple-returning ops that the user sees (the
    ``native_batch_norm`` OpInfo returns ``save_mean`` and ``save_invstd``, which OpenVINO
    cannot return; arbiter's graphs read them only in training). When that passes, the
    failure is what the forward returns: those outputs of its tuple-returning ops are
    ``Outcome.wrong`` ("fails when returned": a node using one is refused), and the nodes
    that compute only saved values are ``Outcome.saved_only`` (blamed). None when it
    fails too, or when there is nothing to blame (a saved value computed on the way to a
    returned one)."""
    returned = returned_nodes(gm)
    user_seen = returned[:saved_from]
    extra = [n for n in user_seen if (o := tuple_output(n)) is not None and o[1] > 0]
    graph = torch.fx.Graph()
    env: dict = {}
    graph.graph_copy(gm.graph, env)
    graph.output(tuple(env[n] for n in user_seen if n not in extra))
    graph.eliminate_dead_code()
    user = torch.fx.GraphModule(gm, graph)
    kept = {n.name for n in graph.nodes}
    why = f"{failed.stage}: {failed.reason}"
    wrong = {o: f"fails when returned{' for the backward' * (k >= saved_from)}: {why}"
             for k, o in enumerate(map(tuple_output, returned))
             if (k >= saved_from or returned[k] in extra) and o is not None
             and o[0].name in kept}
    saved_only = [n for n in gm.graph.nodes if n.op == "call_function"
                  and n.name not in kept and not is_getitem(n)]
    if not wrong and not saved_only:
        return None
    out = _run_sample(backend, user, inputs, tolerances)
    if out.status != "passed":
        return None
    out.wrong, out.saved_only, out.failure = wrong, saved_only, failed
    return out


def _run_sample(backend: Backend, gm: torch.fx.GraphModule, inputs: list,
                tolerances: Optional[dict] = None, saved_from: Optional[int] = None) -> Outcome:
    from torch.utils._python_dispatch import _disable_current_modes

    specs = output_specs(gm)
    try:
        expected = list(gm(*[t.clone() for t in inputs]))
    except Exception as exc:  # noqa: BLE001 - eager itself failed: no reference
        return Outcome("skipped", "eager", describe(exc))
    try:
        with _disable_current_modes(), quiet_warnings():
            fn = backend.compile(for_backend(gm, backend), [t.clone() for t in inputs])
    except Exception as exc:  # noqa: BLE001 - recorded, that is what a probe is for
        return Outcome("failed", "compile", describe(exc))
    failed, cmp, got = run_and_compare(fn, inputs, expected, specs, tolerances, saved_from)
    if failed is not None:
        return Outcome(*failed)
    out = Outcome("passed", max_error=cmp.max_error)
    returned = returned_nodes(gm)
    for i in range(len(expected) if saved_from is None else saved_from, len(expected)):
        one = compare([expected[i]], [got[i]], tolerances)
        owner = tuple_output(returned[i])
        if not one.ok and owner is None:  # a saved value of a one-output op: the graph's
            return Outcome("failed", "numbers", f"saved output {i} ({returned[i]}): "
                           f"{_alone(one)}", one.max_error)
        if one.ok:
            out.max_error = max(out.max_error or 0.0, one.max_error)
            if owner is not None:
                out.right.append(owner)
        else:
            out.wrong[owner] = f"differs from eager: {_alone(one)}"
    wrong_at = {i for i, n in enumerate(returned) if tuple_output(n) in out.wrong}
    found = probe_nonfinite(fn, gm, inputs, tolerances, ignore=wrong_at)
    if "nan" in found:  # a NaN that vanishes or appears: refused (docs/robustness.md)
        return Outcome("failed", "nonfinite", "; ".join(found.values()))
    # +-inf, -0.0 and huge values: reported, not refused (inf arithmetic, signed zeros
    # and overflow inside composite formulas differ even between eager and Inductor)
    note = "; ".join(found.values())
    out.reason = f"not refused: {note}" if note else ""
    return out


def probe_sample(backend: Backend, gm: torch.fx.GraphModule, inputs: list,
                 tolerances: Optional[dict] = None) -> tuple[str, str, str, Optional[float]]:
    """(status, stage, reason, max_error) for one traced sample through ``backend``,
    every output compared with ``gm`` run in eager (``run_sample``)."""
    return run_sample(backend, gm, inputs, tolerances).as_tuple()


def probe_build(backend: Backend, gm: torch.fx.GraphModule,
                inputs: list) -> tuple[str, str, str, Optional[float]]:
    """(status, stage, reason, None) for one traced sample built by ``backend`` and not
    run (``Backend.build_only``): "passed" means converted and built."""
    from torch.utils._python_dispatch import _disable_current_modes

    try:
        with _disable_current_modes(), quiet_warnings():
            what = backend.build_only(for_backend(gm, backend), [t.clone() for t in inputs])
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - recorded, that is what a probe is for
        return "failed", "build", describe(exc), None
    return "passed", "", what or "built (not run)", None


def probe_unreturned(backend: Backend, gm: torch.fx.GraphModule, inputs: list,
                     tolerances: Optional[dict] = None) -> tuple[list, dict]:
    """For a graph that passed ``run_sample``: its ops' outputs it does not return
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
        with _disable_current_modes(), quiet_warnings():
            fn = backend.compile(for_backend(gm, backend), [t.clone() for t in inputs])
            got = list(fn(*[t.clone() for t in inputs]))[first:]
    except Exception:  # noqa: BLE001 - not silent; see the docstring
        log.debug("unreturned outputs: compile or run failed", exc_info=True)
        return [], {}
    wrong = {}
    for a, e, g in zip(added, expected, got):
        cmp = compare([e], [g], tolerances)
        if not cmp.ok:
            wrong[a] = f"differs from eager: {_alone(cmp)}"
    return added, wrong
