"""The report's accuracy section (config `accuracy`), filled from a graph's outcome.

The bound, every lower-precision candidate's measures, the per-module search (each
module's precision and backend), speed against float32, the drift watch
(docs/precision.md).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from .accuracy_model import (AccuracyReport, Measures, ModulePrecision,
                              PrecisionSearchReport)


def accuracy_report(o: Any, parts: Sequence[Any]) -> Optional[AccuracyReport]:
    """``o``: the graph's PolicyOutcome; ``parts``: its PartitionReports (what runs now)."""
    if o.tolerance is None:
        return None
    chosen = o.errors.get(o.chosen)
    out = AccuracyReport(rtol=o.tolerance[0], atol=o.tolerance[1],
                         errors={k: float(v) for k, v in o.errors.items()},
                         rejected=dict(o.rejected),
                         chosen_error=float(chosen) if chosen is not None else None)
    p = o.precision
    if p is None:
        return out
    out.bound = p.bound
    out.measures = {k: Measures(**v) for k, v in p.measures.items()}
    out.holdout = Measures(**p.holdout) if p.holdout else None
    out.float32, out.float32_ms, out.chosen_ms = p.f32, p.f32_ms, p.chosen_ms
    if p.f32_ms and p.chosen_ms:
        out.speedup = round(p.f32_ms / p.chosen_ms, 3)
    out.checks, out.drift = p.checks, list(p.drift)
    out.worst = Measures(**p.worst) if p.worst else None
    if p.variant:
        out.search = PrecisionSearchReport(
            variant=p.variant, depth=p.depth, evaluations=p.evaluations,
            search_s=p.search_s, samples=p.samples, candidate=p.candidate,
            notes=list(p.notes))
    elif p.notes:
        out.search = PrecisionSearchReport(variant="", notes=list(p.notes))
    where = {n: x for x in parts for n in x.node_names}
    for s in p.segments:
        part = where.get(p.first_node.get(s.index, ""))
        backend = (part.backend or part.planned_backend) if part is not None else ""
        out.modules.append(ModulePrecision(
            index=s.index, module=s.path, cls=s.cls,
            precision=backend if part is not None and part.precision != "native"
            else "float32", backend=backend, f32_ms=s.f32_ms, low_ms=s.low_ms,
            alone=Measures(**s.alone) if s.alone else None, why=s.why))
    return out


def module_lines(a: AccuracyReport) -> list[str]:
    """The text report's lines of the per-module search and the drift watch."""
    lines = []
    if a.search is not None:
        s = a.search
        lines.append(f"  precision per module ({s.variant or 'no variant'}): "
                     f"{s.evaluations} evaluations on {s.samples} input(s) in "
                     f"{s.search_s:.1f} s" + (f"; candidate {s.candidate}" if s.candidate
                                              else "")
                     + "".join(f"; {n}" for n in s.notes))
    low = [m for m in a.modules if m.precision != "float32"]
    if a.modules:
        lines.append(f"  modules: {len(low)} of {len(a.modules)} at lower precision: " + (
            ", ".join(f"{m.module or 'top level'} ({m.cls}) on {m.precision}" for m in low)
            or "none"))
    if a.float32_ms is not None and a.chosen_ms is not None:
        lines.append(f"  speed: {a.chosen_ms:.3f} ms against {a.float32} {a.float32_ms:.3f} "
                     f"ms at float32 ({a.speedup or 0:.2f}x)")
    if a.holdout is not None:
        h = a.holdout
        lines.append(f"  on {h.inputs} held-out input(s): max abs {h.max_abs}, rel norm "
                     f"{h.rel_norm}" + (f", agreement {h.agreement:.1%}"
                                        if h.agreement is not None else ""))
    if a.checks:
        lines.append(f"  drift watch: {a.checks} check(s)" + "".join(f"; {d}" for d in a.drift))
    return lines
