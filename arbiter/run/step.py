"""A training graph's compiled plan against Dynamo's own graph in eager, on the user's calls.

Arbiter's candidates are ATen graphs. ``only eager`` among them runs AOTAutograd's forward
and backward op by op: functional ops, every saved tensor an output, the backward as
decomposed formulas. The user's module in eager runs fused kernels and autograd's own
backward (BERT-style step on 2 cores: 304 ms a step against 286 for the module itself,
interleaved in one process). And each half is decided alone: the forward at the first
call, the backward at the first backward. So a Dynamo graph that trains gets a
``StepChoice`` between AOTAutograd's compiled function and Dynamo's graph (what
``backend="eager"`` runs):

* forward and backward both planned (or fallen back) whole in eager ATen: Dynamo's graph
  runs them from the next call on, untimed (it is eager, with fewer ops between);
* otherwise, under config ``against_eager`` (not ``off``): the next calls alternate
  between the two (ABBA), each call timed from its start to its forward's return plus
  from the first gradient of its outputs to the last of its inputs (autograd's multi-grad
  hooks), ``TRIAL_SAMPLES`` each after a warm-up call each; Dynamo's graph runs from then
  on when faster by more than ``EAGER_MARGIN``, as a graph timed against eager does.

No call runs twice: each of the user's calls runs once, on one route, and eager's numbers
are what every compiled route is checked against. The trial's cost is at most its calls
on the slower route. The choice is per process (not cached: it costs no extra run).
"""
from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

log = logging.getLogger(__name__)

COMPILED = "compiled"
DYNAMO = "dynamo eager"
#: timed calls per route (after a warm-up call each) before the choice
TRIAL_SAMPLES = 5
#: calls without a backward graph compiled before the choice is left to the compiled plan
WAIT_CALLS = 8
#: trial calls after which the routes with too few complete samples stop the trial (a
#: backward that comes for some calls only)
TRIAL_CALLS = 8 * TRIAL_SAMPLES


@dataclass
class StepRecord:
    """What a training graph's ``StepChoice`` chose, kept on its forward and backward
    ``GraphRecord``s for the report."""

    route: str = "pending"  # "pending", "trial", COMPILED or DYNAMO
    reason: str = ""
    ms: dict[str, float] = field(default_factory=dict)  # route -> median ms per call
    samples: int = 0  # timed calls per route


def all_eager(record: Any, inline: set[str]) -> bool:
    """Whether every partition of ``record`` (a ``GraphRecord``) runs in eager ATen now:
    planned there, or fallen back there."""
    return all(record.running(p) in inline for p in record.plan.partitions)


class StepChoice:
    """What ``Arbiter.__call__`` returns for a Dynamo graph that trains: ``compiled``
    (AOTAutograd's function over arbiter's graphs) until it is decided, then the route
    chosen (module docstring). ``records``: this Dynamo graph's ``GraphRecord``s, filled as
    AOTAutograd compiles (the backward at the first backward); ``inline``: the names of
    the backends that run ATen in place; ``trial``: whether config ``against_eager``
    allows timing."""

    def __init__(self, compiled: Callable, gm: torch.fx.GraphModule, records: list,
                 inline: set[str], trial: bool, label: str):
        self._compiled = compiled
        self._gm = gm
        self._records = records
        self._inline = inline
        self._trial = trial
        self._label = label
        self.record = StepRecord()
        self._route: Optional[Callable] = None  # set once decided
        self._calls = 0
        self._start: Optional[int] = None  # the call the trial began at
        self._warm: set[str] = set()
        self._samples: dict[str, list[float]] = {COMPILED: [], DYNAMO: []}
        self._handles: list = []  # the backward hooks of timed calls
        self._spent: list = []  # those whose call was timed: removed at the next call
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        # what AOTAutograd's function carries (zero_grad, named_parameters, serialize)
        if name.startswith("__") or name in ("_compiled",):
            raise AttributeError(name)
        return getattr(self._compiled, name)

    def __call__(self, *args: Any) -> Any:
        fn = self._route
        if fn is not None:
            return fn(*args)
        with self._lock:
            n = self._calls
            self._calls += 1
            for h in self._spent:
                h.remove()
            self._spent.clear()
            route = self._next(n)
            decided, trial = self._route, self._start is not None
        if decided is not None:
            return decided(*args)
        if not trial:
            return self._compiled(*args)
        return self._timed(route, args)

    # -- the choice ----------------------------------------------------------------------
    def _halves(self) -> tuple[Any, Any]:
        fw = next((r for r in self._records if r.kind == "forward"), None)
        bw = next((r for r in self._records if r.kind == "backward"), None)
        for r in (fw, bw):
            if r is not None:
                r.step = self.record
        return fw, bw

    def _next(self, n: int) -> str:
        """The route of call ``n`` (under the lock); decides when it is time."""
        if n == 0:
            return COMPILED  # the first call compiles (the backward at its backward)
        if self._start is None:
            fw, bw = self._halves()
            if fw is None or bw is None:
                if n >= WAIT_CALLS:
                    self._decide(COMPILED, f"no backward ran in its first {n} calls: the "
                                 "compiled plan kept, not measured")
                return COMPILED
            if all_eager(fw, self._inline) and all_eager(bw, self._inline):
                self._decide(DYNAMO, "forward and backward run whole in eager ATen: "
                             "Dynamo's graph runs them in eager instead (the module's own "
                             "kernels and autograd's backward, not AOTAutograd's graphs op "
                             "by op)")
                return DYNAMO
            if not self._trial:
                self._decide(COMPILED, "config against_eager off: not timed against "
                             "Dynamo's graph")
                return COMPILED
            self._start = n
            self.record.route = "trial"
            log.info("%s: the compiled plan and Dynamo's graph in eager alternate on the next "
                     "calls, %d timed each", self._label, TRIAL_SAMPLES)
        k = n - self._start
        done = min(len(s) for s in self._samples.values())
        if done >= TRIAL_SAMPLES or k >= TRIAL_CALLS:
            return self._from_samples()
        return DYNAMO if k % 4 in (0, 3) else COMPILED

    def _from_samples(self) -> str:
        done = min(len(s) for s in self._samples.values())
        if done == 0:
            self._decide(COMPILED, f"no call's backward was timed on both routes in "
                         f"{TRIAL_CALLS} calls: the compiled plan kept")
            return COMPILED
        ms = {r: statistics.median(s) * 1e3 for r, s in self._samples.items()}
        self.record.ms = {r: round(v, 3) for r, v in ms.items()}
        self.record.samples = done
        from ..plan.policy import EAGER_MARGIN

        c, d = ms[COMPILED], ms[DYNAMO]
        each = (f"{d:.3g} ms against {c:.3g} ms a call (forward and backward, median of "
                f"{done} interleaved calls each)")
        if d < c * (1 - EAGER_MARGIN):
            self._decide(DYNAMO, "Dynamo's graph in eager was measured faster than the "
                         f"compiled plan: {each}")
            return DYNAMO
        self._decide(COMPILED, f"the compiled plan kept: Dynamo's graph in eager {each}, "
                     f"not faster by more than {EAGER_MARGIN:.0%}")
        return COMPILED

    def _decide(self, route: str, reason: str) -> None:
        self.record.route = route
        self.record.reason = reason
        self._halves()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._spent.clear()
        self._route = self._gm if route == DYNAMO else self._compiled
        log.info("%s: the step runs %s: %s", self._label,
                 "Dynamo's graph in eager" if route == DYNAMO else "the compiled plan", reason)

    # -- timing --------------------------------------------------------------------------
    def _timed(self, route: str, args: Sequence[Any]) -> Any:
        fn = self._gm if route == DYNAMO else self._compiled
        start = time.perf_counter()
        out = fn(*args)
        forward = time.perf_counter() - start
        with self._lock:
            warm = route in self._warm
            self._warm.add(route)
        if warm:
            self._watch_backward(route, forward, args, out)
        return out

    def _watch_backward(self, route: str, forward: float, args: Sequence[Any],
                        out: Any) -> None:
        """Time this call's backward: from the first gradient of its outputs to the last
        of its inputs that need one; the call's sample is its forward plus that."""
        from torch.autograd.graph import register_multi_grad_hook
        from torch.utils._pytree import tree_leaves

        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        ins = [t for t in args if isinstance(t, torch.Tensor) and t.requires_grad]
        if not outs or not ins:
            return
        began: list[float] = []
        handles: list = []

        def start(_grad: Any) -> None:
            if not began:
                began.append(time.perf_counter())

        def end(_grads: Any) -> None:
            # the inputs (weights among them) see every later backward too: this call's
            # sample is taken once, and its hooks removed at the next call (not from
            # inside autograd's running hooks)
            if began and handles:
                took = forward + time.perf_counter() - began[0]
                with self._lock:
                    if self._route is None:
                        self._samples[route].append(took)
                    self._spent += handles
                handles.clear()

        with self._lock:
            if self._route is not None:
                return
            handles += [register_multi_grad_hook(outs, start, mode="any"),
                        register_multi_grad_hook(ins, end, mode="all")]
            self._handles += handles
