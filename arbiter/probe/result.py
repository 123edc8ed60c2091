"""What a probe found: a ``SampleResult`` per graph, and the ``ProbeResult`` over them.

One ``SampleResult`` per graph run or skipped; the ``ProbeResult`` credits and blames
ops from them (the rules: docs/robustness.md, "`arbiter probe BACKEND`"; what the
manifest becomes: arbiter/probe/update.py).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class SampleResult:
    opinfo: str
    dtype: str
    ops: list[str]
    status: str  # passed | failed | skipped
    stage: str = ""  # trace | compile | run | meta | numbers | nonfinite | eager (why not)
    reason: str = ""
    max_error: Optional[float] = None
    # the training probe (``grad``): "forward" (AOTAutograd's forward graph, every output
    # it returns compared, saved-for-backward ones included) or "backward"; "" otherwise
    graph: str = ""


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
    # every OpInfo was selected (no ``ops``): its counts replace a record's earlier ones
    # instead of adding to them (a rerun would count every sample twice)
    every_opinfo: bool = False
    mode: str = "run"  # "run": compiled, run, compared; "build": built only
    passed: dict[str, set] = field(default_factory=lambda: defaultdict(set))  # op -> dtypes
    # op -> {sample dtype: reason}, from failed samples whose graph is that op alone
    failed: dict[str, dict] = field(default_factory=lambda: defaultdict(dict))
    # op -> {dtype: reason}: dtypes its tensors had in a failed sample (any number of ops)
    failed_dtypes: dict[str, dict] = field(default_factory=lambda: defaultdict(dict))
    # op -> {sample dtype: reason}: a sample of that op alone gave wrong numbers (silent);
    # a dtype another sample passed (other arguments) stays allowed, not verified
    wrong_alone: dict[str, dict] = field(default_factory=lambda: defaultdict(dict))
    # outputs of tuple-returning ops compared one by one (those a sample does not return,
    # expose_outputs; a training forward's saved ones), from samples whose own outputs
    # passed: op -> {(index, sample dtype)} right, and op -> {index: {sample dtype: why}}
    # wrong
    outputs_passed: dict[str, set] = field(default_factory=lambda: defaultdict(set))
    outputs_failed: dict[str, dict] = field(default_factory=lambda: defaultdict(dict))
    grad: bool = False  # training graphs were probed (arbiter/probe/training.py)
    # training probe: op -> dtypes credited by a passing training graph (forward or backward)
    trained: dict[str, set] = field(default_factory=lambda: defaultdict(set))
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
                if sample.graph:
                    self.trained[op].add(dt)
        elif sample.status == "failed":
            why = f"{sample.stage}: {sample.reason}"
            if sample.graph:
                why = f"{sample.graph} graph, {why}"
            for op, dt in credit:
                self.failed_dtypes[op].setdefault(dt, why)
            if len(sample.ops) == 1:
                self.failed[sample.ops[0]].setdefault(sample.dtype, why)
                if sample.stage == "numbers":
                    self.wrong_alone[sample.ops[0]].setdefault(sample.dtype, why[:200])

    def record_output(self, op: str, k: int, dtype: str, why: Optional[str]) -> None:
        """Output ``k`` of ``op``, compared on its own in a sample of ``dtype``: right
        (``why`` None) or wrong."""
        if why is None:
            self.outputs_passed[op].add((k, dtype))
        else:
            self.outputs_failed[op].setdefault(k, {}).setdefault(dtype, why[:200])

    def dropped(self, op: str) -> dict[str, str]:
        """{dtype: why} tried for ``op`` in a failed sample and passed by none."""
        return {d: why for d, why in self.failed_dtypes.get(op, {}).items()
                if d not in self.passed.get(op, ())}

    def counts(self, graph: Optional[str] = None) -> dict[str, int]:
        """Samples per status (``graph``: only those of that training graph)."""
        c = {"passed": 0, "failed": 0, "skipped": 0}
        for s in self.samples:
            if graph is None or s.graph == graph:
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
        graphs = ""
        if self.grad:
            per = {g: self.counts(g) for g in ("forward", "backward")}
            graphs = " [" + "; ".join(
                f"{g}: {n['passed']} passed, {n['failed']} failed, {n['skipped']} skipped"
                for g, n in per.items()) + "]"
        return (f"{self.backend}{' (training graphs: forward and backward)' if self.grad else ''}"
                f": {self.opinfos_done}/{self.opinfos_total} OpInfos, "
                f"{c['passed'] + c['failed']} samples run ({c['passed']} passed, "
                f"{c['failed']} failed, {c['skipped']} skipped){graphs} in "
                f"{self.elapsed_s:.0f} s; "
                f"{len(self.passed)} ops {'built (not run)' if self.mode == 'build' else 'verified'}, "
                f"{len(failed_ops)} ops failed every "
                f"sample, {len(self.outputs_failed)} ops with wrong outputs compared one by "
                f"one{dec}{' (stopped at the time limit)' if self.stopped_early else ''}")


def summarize_failures(samples: Iterable[SampleResult], limit: int = 20) -> list[str]:
    out = []
    for s in samples:
        if s.status == "failed":
            where = f"{s.dtype}, {s.graph}" if s.graph else s.dtype
            out.append(f"{s.opinfo} [{where}] {s.stage}: {s.reason[:160]}")
    return out[:limit]
