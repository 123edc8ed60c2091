"""The report as terminal tables (rich), a one-line summary first.

Reads only the ``Report`` model. Fits a 100-column terminal: long cells (op lists,
refusal reasons) wrap onto more lines, never cut.
``str(report)`` stays the plain, greppable rendering of ``arbiter.report``.
"""
from __future__ import annotations

import io
from collections.abc import Sequence

from .model import GraphReport, Report, pattern_line

WIDTH = 100


def _e(text: str) -> str:
    """Data, not markup: reasons such as "[at file.py:12]" must print as written."""
    from rich.markup import escape

    return escape(str(text))


def _short(op: str) -> str:
    return op.removeprefix("aten.").removesuffix(".default")


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _shapes(ts) -> str:
    """The first data tensor's shape (frozen weights, `constant`, come last) and how many
    more: the table stays one line a partition."""
    if not ts:
        return "-"
    first = next((t for t in ts if t.source != "constant"), ts[0])
    text = "x".join(map(str, first.shape)) or "()"
    return text + (f" +{len(ts) - 1}" if len(ts) > 1 else "")


def _backend_cell(p, dry_run: bool) -> str:
    if not p.compiled:
        return f"{p.planned_backend} (plan)"
    if p.backend != p.planned_backend:
        return f"{p.backend} [red](planned {p.planned_backend})[/red]"
    return p.backend


def _graph_tables(report: Report, g: GraphReport):
    from rich import box
    from rich.table import Table

    # Share of the whole timed calls (all graphs, inline eager and stitching included).
    total_run = report.timing.total_s if report.timing else sum(p.run_s for p in g.partitions)
    timed = any(p.calls for p in g.partitions)
    t = Table(title=f"graph {g.graph_id} ({g.kind}{', ' + g.model if g.model else ''}): "
                    f"{g.nodes} nodes, "
                    f"{len(g.partitions)} partitions, {g.constants} constant weights, "
                    f"policy {g.policy}, planned in {g.plan_s * 1e3:.1f} ms",
              title_justify="left", box=box.SIMPLE_HEAD, expand=True)
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("backend", no_wrap=True)
    t.add_column("nodes", justify="right", no_wrap=True)
    t.add_column("in -> out", overflow="fold", max_width=26)
    t.add_column("bytes in/out", justify="right", no_wrap=True)
    t.add_column("compile", justify="right", no_wrap=True)
    if timed:
        t.add_column("run/call (share)", justify="right", no_wrap=True)
    t.add_column("ops", overflow="fold", ratio=1)
    for p in g.partitions:
        ops = ", ".join(f"{_short(k)}x{v}" if v > 1 else _short(k)
                        for k, v in sorted(p.ops.items(), key=lambda kv: -kv[1]))
        row = [str(p.id), _backend_cell(p, report.dry_run), str(p.nodes),
               f"{_shapes(p.inputs)} -> {_shapes(p.outputs)}",
               f"{_bytes(p.bytes_in + p.graph_input_bytes)}/{_bytes(p.bytes_out)}",
               f"{p.compile_s:.2f} s" if p.compile_s else "-"]
        if timed:
            if p.inline:
                row.append("inline")
            elif p.calls:
                share = p.run_s / total_run if total_run else 0.0
                row.append(f"{p.run_s / p.calls * 1e3:.3f} ms ({share:.0%})")
            else:
                row.append("-")
        row.append(_e(ops))
        t.add_row(*row)
    yield t
    if g.chosen or g.candidates_ms or g.estimates_ms:
        def spread(k):
            q = g.candidates_spread_ms.get(k)
            return f" [{q[0]:.3f}-{q[1]:.3f}]" if q else ""

        cands = ", ".join(f"{k} {v:.3f} ms{spread(k)}" for k, v in g.candidates_ms.items()
                          if v is not None)  # candidates not measured are left out
        if g.measure_rounds:
            cands += (f"; {g.measure_rounds} interleaved rounds, winner "
                      + ("apart from the rest" if g.measure_confident
                         else "not apart from the rest (a close call)"))
        est = ", ".join(f"{k} ~{v:.3f} ms" for k, v in g.estimates_ms.items())
        yield _e(f"  policy {g.policy}: chose {g.chosen or '-'}" +
                 (f" ({g.measure_broadcast})" if g.measure_broadcast else "") +
                 (f"; measured: {cands}" if cands else "") +
                 (f"; estimated: {est}" if est else ""))
    if g.accuracy is not None:  # config `accuracy` (docs/precision.md)
        a = g.accuracy
        lowered = [f"{p.id} {p.precision}" for p in g.partitions if p.precision != "native"]
        yield _e(f"  accuracy rtol {a.rtol:g}, atol {a.atol:g}: "
                 + (f"partitions {', '.join(lowered)}" if lowered
               else "all at the graph's own precision")
                 + (f" (max error {a.chosen_error:.2e} against float32 eager)"
                    if a.chosen_error is not None else "")
                 + "".join(f"; {k}: error {v:.2e}" for k, v in a.errors.items())
                 + "".join(f"; refused {k}: {v}" for k, v in a.rejected.items()))
    for p in g.partitions:
        notes = []
        if p.copies or p.restride_copies:
            notes.append(f"copies {p.copies} at the boundary, {p.restride_copies} restrides")
        if p.nonfinite_guard:
            notes.append(f"inputs checked for NaN/inf ({', '.join(p.nonfinite_guard[:4])}"
                         f"{', ...' if len(p.nonfinite_guard) > 4 else ''} differ there)"
                         + (f", {p.nonfinite_eager_calls} calls ran in eager"
                            if p.nonfinite_eager_calls else ""))
        if p.verify_checks:
            err = f", max error {p.verify_max_error:.2e}" if p.verify_max_error is not None else ""
            notes.append(f"verified {p.verify_checks}x against eager{err}")
        if p.measured_ms:
            notes.append("measured " + ", ".join(f"{b} {ms:.3f} ms"
                                                 for b, ms in p.measured_ms.items()))
        if notes:
            yield _e(f"  partition {p.id}: " + "; ".join(notes))
    for e in g.weight_events:
        yield f"  [yellow]weights changed[/yellow]: {_e(e.reason)}: {_e(e.action)}"
    for m in g.patterns:
        yield _e(f"  pattern {pattern_line(m)}")
    if g.symbols:  # dynamic shapes (docs/design.md)
        yield _e("  symbolic: " + ", ".join(
            f"{s.name} in [{s.min}, {'inf' if s.max is None else s.max}]"
            + (f" ({', '.join(s.sources)})" if s.sources else "") for s in g.symbols)
            + (f"; recompile {g.recompile} of its frame" if g.recompile else ""))
    for w in g.warnings:
        yield f"  [yellow]warning[/yellow]: {_e(w)}"
    for p in g.partitions:
        for f in p.fallbacks:
            yield (f"  [yellow]fallback[/yellow] partition {p.id} at {f.stage}: "
                   f"{f.from_backend} -> {f.to_backend}: {_e(f.reason)}")

    ops = Table(title=f"graph {g.graph_id}: ops", title_justify="left", box=box.SIMPLE_HEAD,
                expand=True)
    ops.add_column("op", overflow="fold", max_width=28)
    ops.add_column("nodes", justify="right", no_wrap=True)
    ops.add_column("runs on", overflow="fold", max_width=24)
    ops.add_column("able (+fallback)", overflow="fold", max_width=22)
    ops.add_column("refused by: why", overflow="fold", ratio=1)
    for o in g.ops:
        placed = ", ".join([f"{b} {n}" for b, n in o.placed.items()] +
                           [f"{b} {n} (planned)" for b, n in o.planned.items()])
        refused = "; ".join(f"{b}: {_e(why)}" for b, why in o.refused.items())
        able = ", ".join(b for b in o.able if b != report.backends[-1].name) \
            if report.backends else ", ".join(o.able)
        ops.add_row(_short(o.op), str(o.nodes), placed, able or "-", refused or "-")
    yield ops
    cov = Table(title=f"graph {g.graph_id}: coverage", title_justify="left",
                box=box.SIMPLE_HEAD)
    cov.add_column("backend")
    cov.add_column("could run", justify="right")
    cov.add_column("runs (nodes)", justify="right")
    for b, pct in g.coverage.items():
        runs = g.placement.get(b, 0)
        planned = g.planned.get(b, 0)
        cov.add_row(b, f"{pct:.1f}%", f"{runs} (+{planned} planned)" if planned else str(runs))
    yield cov


def renderables(report: Report):
    """The rich renderables of one report, summary line first."""
    yield "[bold]" + _e(("[dry run] " if report.dry_run else "") + report.summary()) + "[/bold]"
    head = []
    if report.model:
        head.append(f"model {report.model}")
    head.append(f"config {report.label or report.config or 'default'}")
    head.append(report.created)
    yield _e(" | ".join(head))
    yield _e("versions: " + "; ".join(f"{k}: {v}" for k, v in report.versions.items()))
    for b in report.backends:
        if not b.available:
            yield (f"[red]backend {_e(b.name)} unavailable[/red]: {_e(b.reason)}"
                   + (" (this dry run plans onto it)" if b.plans_only else ""))
    for w in report.warnings:
        yield f"[yellow]warning[/yellow]: {_e(w)}"
    if report.graph_breaks is not None:
        gb = report.graph_breaks
        yield f"Dynamo: {gb.graphs} graph(s), {gb.breaks} graph break(s)"
        for r in gb.reasons:
            yield f"  break: {_e(r)}"
    if report.resources:
        yield "resources in force:"
        for k, v in report.resources.items():
            text = ", ".join(f"{a}={b}" for a, b in v.items()) if isinstance(v, dict) else str(v)
            yield _e(f"  {k}: {text}")
    if report.timing is not None:
        tm = report.timing
        yield (f"timed run: {tm.calls} calls, {tm.total_s / max(tm.calls, 1) * 1e3:.3f} ms "
               f"per call; partitions run by backends: "
               f"{tm.pieces_s / tm.total_s:.0%} of it" if tm.total_s else "timed run: no calls")
        if tm.note:
            yield f"  {_e(tm.note)}"
    for g in report.graphs:
        yield ""
        yield from _graph_tables(report, g)
    if report.advice:
        yield ""
        yield "[bold]advice[/bold]"
        for a in report.advice:
            yield f"  - {_e(a.message)}"


def compare_table(reports: Sequence[Report]):
    """Several configs on the same model, one column each."""
    from rich import box
    from rich.table import Table

    t = Table(title="side by side", title_justify="left", box=box.SIMPLE_HEAD)
    t.add_column("")
    for r in reports:
        t.add_column(r.label or r.config or "default", overflow="fold")

    def row(name, fn):
        t.add_row(name, *[fn(r) for r in reports])

    def placement(r: Report) -> str:
        c: dict[str, int] = {}
        for g in r.graphs:
            for b, n in g.placement.items():
                c[b] = c.get(b, 0) + n
            for b, n in g.planned.items():
                c[f"{b} (planned)"] = c.get(f"{b} (planned)", 0) + n
        tot = sum(c.values()) or 1
        return "\n".join(f"{b} {n / tot:.0%}" for b, n in sorted(c.items(), key=lambda x: -x[1]))

    parts = lambda r: [p for g in r.graphs for p in g.partitions]  # noqa: E731
    row("partitions", lambda r: str(len(parts(r))))
    row("nodes by backend", placement)
    row("fallbacks", lambda r: str(sum(len(p.fallbacks) for p in parts(r))))
    row("compile", lambda r: f"{sum(p.compile_s for p in parts(r)):.2f} s")
    row("bytes across", lambda r: _bytes(sum(p.bytes_in for p in parts(r))))
    row("ms per call", lambda r: f"{r.timing.total_s / r.timing.calls * 1e3:.3f}"
        if r.timing and r.timing.calls else "-")
    return t


def render(reports: Report | Sequence[Report], width: int = WIDTH, color: bool = False) -> str:
    """The text report (several reports: a comparison table, then each in full).

    Without rich (the `report` extra) this is the plain rendering of ``str(report)``."""
    reports = [reports] if isinstance(reports, Report) else list(reports)
    try:
        from rich.console import Console
    except ImportError:
        return "\n\n".join(str(r) for r in reports) + "\n"

    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=color, no_color=not color,
                      highlight=False, soft_wrap=False)
    if len(reports) > 1:
        console.print(compare_table(reports))
        console.print()
    for k, r in enumerate(reports):
        if k:
            console.rule(r.label or r.config or "")
        for item in renderables(r):
            console.print(item)
    return buf.getvalue()
