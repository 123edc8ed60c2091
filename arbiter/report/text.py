"""The report as text: one description of what it says, rendered two ways.

``items(report)`` is the single source: lines and tables (``Line``, ``Table``), built from
the ``Report`` model alone. ``render`` draws them with rich (terminal tables that fit a
100-column terminal: long cells, op lists and refusal reasons, wrap onto more lines, never
cut); ``plain`` writes them without rich and without wrapping (``str(report)``: greppable,
one line per row). Neither imports rich at import time. The model does not import this
module: importing it makes ``plain`` what ``str(report)`` returns
(``model.use_text_rendering``; the package imports it).
"""
from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Optional, Union

from .cells import (Cell, Col, Item, Line, Table, bytes_text,  # noqa: F401
                    distributed_entries, distributed_summary,
                    human_bytes as _bytes, kind_entries, kind_fell_back,
                    kind_where, ops_text, partition_notes, plural, shapes_summary as _shapes,
                    short_op as _short)

from .accuracy import module_lines
from .choice import choice_line, not_chosen_lines, step_line
from .model import use_text_rendering

if TYPE_CHECKING:
    from .model import GraphReport, PatternReport, Report

WIDTH = 100


def pattern_line(m: PatternReport) -> str:
    """One line for a pattern match: where it runs and who claimed or refused it."""
    how = "whole" if m.whole else "op by op"
    where = f"{m.backend} ({how}, #{m.partition}{'' if m.compiled else ', planned'})"
    who = (f"; claimed by {', '.join(m.claimed_by)}" if m.claimed_by else "") + "".join(
        f"; {b} refused: {why}" for b, why in m.refused.items())
    return f"{m.pattern} [{', '.join(m.node_names)}]: {where}{who}"


def _backend_cell(p) -> Cell:
    if not p.compiled:
        return f"{p.planned_backend} (plan)"
    if p.backend != p.planned_backend:
        return Line(f"{p.backend} ", ("red", f"(planned {p.planned_backend})"))
    return p.backend


# -- per graph kind, and the distributed section -------------------------------------
def kind_table(report: Report) -> Optional[Table]:
    """What ran where per graph kind (forward, backward, inference): one row each."""
    if not report.kinds:
        return None
    timed = any(k.calls for k in report.kinds)
    cols = [Col("kind", wrap=True, max_width=12), Col("nodes", right=True),
            Col("runs on: nodes in partitions", wrap=True, ratio=3),
            Col("eager: its ops", wrap=True, ratio=2), Col("fell back", wrap=True, ratio=1),
            Col("compile", right=True)]
    if timed:
        cols.append(Col("run/call", right=True))
    t = Table("what ran where, per graph kind", cols)
    for k in report.kinds:
        graphs = f" ({len(k.graphs)} graphs)" if len(k.graphs) > 1 else ""
        not_yet = k.partitions - k.compiled_partitions
        where = (kind_entries(k) or ["-"]) + ([f"{not_yet} of {k.partitions} partitions "
                                               "not compiled"] if not_yet else [])
        row: list[Cell] = [k.kind + graphs, str(k.nodes), where,
                           ops_text(k.eager_ops, 4) if k.eager_nodes else "-",
                           kind_fell_back(k), f"{k.compile_s:.2f} s" if k.compile_s else "-"]
        if timed:
            row.append(f"{k.run_s / k.calls * 1e3:.3f} ms" if k.calls else "-")
        t.rows.append(row)
    return t


def distributed_lines(report: Report) -> Iterator[Line]:
    """Which decisions were broadcast under torch.distributed (nothing when none was)."""
    if report.distributed is None:
        return
    yield Line(("bold", "distributed"), ": " + distributed_summary(report.distributed))
    for x in distributed_entries(report.distributed):
        yield Line("  " + x)


def deployed_lines(report: Report) -> Iterator[Line]:
    """A loaded program (arbiter.load): its file, the check at load, each partition."""
    d = report.deployed
    if d is None:
        return
    yield Line(("bold", "loaded"), f" from {d.path} in {d.load_s:.2f} s (format {d.format_version}); "
               f"check at load: {d.check or 'not run'}")
    for n in d.notes:
        yield Line(("yellow", "  note"), f": {n}")
    for p in d.partitions:
        yield Line(f"  partition {p.id}: saved {p.saved_backend} as {p.artifact}; {p.loaded}"
                   + (f" ({p.reason})" if p.reason else ""))


def _refused(refusals) -> str:
    """``b1, b2: reason; b3: other``: backends giving the same reason share it; a backend
    with several reasons for one op says for how many nodes each."""
    by: dict[str, list[str]] = {}
    per: dict[str, int] = {}
    for r in refusals:
        per[r.backend] = per.get(r.backend, 0) + 1
    for r in refusals:
        by.setdefault(r.reason, []).append(r.backend + (f" (x{r.nodes})"
                                                        if per[r.backend] > 1 else ""))
    return "; ".join(f"{', '.join(bs)}: {why}" for why, bs in by.items())


# -- one graph -----------------------------------------------------------------------
def _graph_items(report: Report, g: GraphReport) -> Iterator[Item]:
    # Share of the whole timed calls (all graphs, inline eager and stitching included).
    total_run = report.timing.total_s if report.timing else sum(p.run_s for p in g.partitions)
    timed = any(p.calls for p in g.partitions)
    cols = [Col("#", right=True), Col("backend"), Col("nodes", right=True),
            Col("in -> out", wrap=True, max_width=26), Col("bytes in/out", right=True),
            Col("compile", right=True)]
    if timed:
        cols.append(Col("run/call (share)", right=True))
    cols.append(Col("ops", wrap=True, ratio=1))
    t = Table(f"graph {g.graph_id} ({g.kind}{', ' + g.model if g.model else ''}): "
              f"{plural(g.nodes, 'node')}, {plural(len(g.partitions), 'partition')}, "
              f"{plural(g.constants, 'constant weight')}, policy {g.policy}, planned in {g.plan_s * 1e3:.1f} ms", cols)
    for p in g.partitions:
        ctime = f"{p.compile_s:.2f} s" if p.compile_s else "-"
        if p.shapes not in ("static", "eager"):
            ctime += f", {p.shapes}" + (f" x{p.specializations}" if p.shapes == "per shape"
                                        else "")
        row: list[Cell] = [str(p.id), _backend_cell(p), str(p.nodes),
                           f"{_shapes(p.inputs)} -> {_shapes(p.outputs)}",
                           bytes_text(p),
                           ctime]
        if timed:
            if p.inline:
                row.append("inline")
            elif p.calls:
                share = p.run_s / total_run if total_run else 0.0
                row.append(f"{p.run_s / p.calls * 1e3:.3f} ms ({share:.0%})")
            else:
                row.append("-")
        row.append(ops_text(p.ops))
        t.rows.append(row)
    yield t
    choice = choice_line(g)
    if choice:
        yield Line(f"  {choice}")
    for line in not_chosen_lines(g):
        yield Line(f"  {line}")
    step = step_line(g)
    if step:
        yield Line(f"  {step}")
    if g.accuracy is not None:  # config `accuracy` (docs/precision.md)
        a = g.accuracy
        lowered = [f"{p.id} {p.precision}" for p in g.partitions if p.precision != "native"]
        yield Line(f"  accuracy {a.bound or f'rtol {a.rtol:g}, atol {a.atol:g}'}: "
                   + (f"partitions {', '.join(lowered)}" if lowered
                      else "all at the graph's own precision")
                   + (f" (max error {a.chosen_error:.2e} against float32 eager)"
                      if a.chosen_error is not None else "")
                   + "".join(f"; {k}: error {v:.2e}" for k, v in a.errors.items())
                   + "".join(f"; refused {k}: {v}" for k, v in a.rejected.items()))
        for line in module_lines(a):
            yield Line(line)
    for p in g.partitions:
        notes = partition_notes(p)
        if notes:
            yield Line(f"  partition {p.id}: " + "; ".join(notes))
    for e in g.weight_events:
        yield Line("  ", ("yellow", "weights changed"), f": {e.reason}: {e.action}")
    for m in g.patterns:
        yield Line(f"  pattern {pattern_line(m)}")
    if g.symbols:  # dynamic shapes (docs/design.md)
        yield Line("  symbolic: " + ", ".join(
            f"{s.name} in [{s.min}, {'inf' if s.max is None else s.max}]"
            + (f" ({', '.join(s.sources)})" if s.sources else "") for s in g.symbols)
            + (f"; recompile {g.recompile} of its frame" if g.recompile else ""))
    for w in g.warnings:
        yield Line("  ", ("yellow", "warning"), f": {w}")
    for p in g.partitions:
        for f in p.fallbacks:
            yield Line("  ", ("yellow", "fallback"), f" at {f.stage}: {f.from_backend} -> "
                       f"{f.to_backend} (partition {p.id}): {f.reason}")

    ops = Table(f"graph {g.graph_id}: ops",
                [Col("op", wrap=True, max_width=28), Col("nodes", right=True),
                 Col("runs on", wrap=True, max_width=24),
                 Col("able (+fallback)", wrap=True, max_width=22),
                 Col("refused by: why", wrap=True, ratio=1)])
    every: dict[str, list] = {}  # op -> every (backend, reason, nodes), not the first only
    for r in g.refusals:
        every.setdefault(r.op, []).append(r)
    for o in g.ops:
        placed = ", ".join([f"{b} {n}" for b, n in o.placed.items()] +
                           [f"{b} {n} (planned)" for b, n in o.planned.items()])
        refused = _refused(every[o.op]) if o.op in every else \
            "; ".join(f"{b}: {why}" for b, why in o.refused.items())
        able = ", ".join(b for b in o.able if b != report.backends[-1].name) \
            if report.backends else ", ".join(o.able)
        ops.rows.append([_short(o.op), str(o.nodes), placed, able or "-", refused or "-"])
    yield ops
    cov = Table(f"graph {g.graph_id}: coverage",
                [Col("backend"), Col("could run", right=True),
                 Col("runs (nodes)", right=True)], expand=False)
    for b, pct in g.coverage.items():
        runs = g.placement.get(b, 0)
        planned = g.planned.get(b, 0)
        cov.rows.append([b, f"{pct:.1f}%",
                         f"{runs} (+{planned} planned)" if planned else str(runs)])
    yield cov


# -- the whole report ----------------------------------------------------------------
def items(report: Report) -> Iterator[Item]:
    """What the text report says, in order: the one source both renderings draw."""
    yield Line(("bold", ("[dry run] " if report.dry_run else "") + report.summary()))
    head = []
    if report.model:
        head.append(f"model {report.model}")
    head.append(f"config {report.label or report.config or 'default'}")
    head.append(report.created)
    yield Line(" | ".join(head))
    for b in report.backends:
        if not b.available:
            yield Line(("red", f"backend {b.name} unavailable"), f": {b.reason}"
                       + (" (this dry run plans onto it)" if b.plans_only else ""))
    for w in report.warnings:
        yield Line(("yellow", "warning"), f": {w}")
    kinds = kind_table(report)
    if kinds is not None:
        yield kinds
    yield from distributed_lines(report)
    yield Line("versions: " + "; ".join(f"{k}: {v}" for k, v in report.versions.items()))
    yield from deployed_lines(report)
    if report.graph_breaks is not None:
        gb = report.graph_breaks
        yield Line(f"Dynamo: {plural(gb.graphs, 'graph')}, {plural(gb.breaks, 'graph break')}")
        for r in gb.reasons:
            yield Line(f"  break: {r}")
    if report.resources:
        yield Line("resources in force:")
        for k, v in report.resources.items():
            text = ", ".join(f"{a}={b}" for a, b in v.items()) if isinstance(v, dict) else str(v)
            yield Line(f"  {k}: {text}")
    if report.timing is not None:
        tm = report.timing
        yield Line(f"timed run: {plural(tm.calls, 'call')}, {tm.total_s / max(tm.calls, 1) * 1e3:.3f} ms "
                   f"per call; partitions run by backends: "
                   f"{tm.pieces_s / tm.total_s:.0%} of it" if tm.total_s else "timed run: no calls")
        if tm.note:
            yield Line(f"  {tm.note}")
    for g in report.graphs:
        yield Line()
        yield from _graph_items(report, g)
    if report.advice:
        yield Line()
        yield Line(("bold", "advice"))
        for a in report.advice:
            yield Line(f"  - {a.message}")


def compare_table(reports: Sequence[Report]) -> Table:
    """Several configs on the same model, one column each."""
    t = Table("side by side", [Col("")] + [Col(r.label or r.config or "default", wrap=True)
                                           for r in reports], expand=False)

    def row(name, fn):
        t.rows.append([name, *[fn(r) for r in reports]])

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


# -- the two renderings ----------------------------------------------------------------
def _plain_cell(c: Cell) -> str:
    if isinstance(c, list):
        return ", ".join(c)
    return c.plain() if isinstance(c, Line) else str(c)


def _rich_cell(c: Cell) -> str:
    if isinstance(c, list):
        return "\n".join(Line(x).markup() for x in c)
    return (c if isinstance(c, Line) else Line(str(c))).markup()


def plain_table(t: Table) -> list[str]:
    """Columns padded to their widest cell, never wrapped (a cell's own newlines make
    more lines of its row)."""
    head = [c.name for c in t.columns]
    rows = [[_plain_cell(c).split("\n") for c in r] for r in t.rows]
    widths = [max([len(h)] + [len(x) for r in rows for x in r[k]])
              for k, h in enumerate(head)]

    def line(cells: list[str]) -> str:
        out = [c.rjust(w) if col.right else c.ljust(w)
               for c, w, col in zip(cells, widths, t.columns)]
        return ("  " + "  ".join(out)).rstrip()

    lines = [t.title, line(head), "  " + "  ".join("-" * w for w in widths)]
    for r in rows:
        for k in range(max(len(c) for c in r)):
            lines.append(line([c[k] if k < len(c) else "" for c in r]))
    return lines


def _plain_items(stream: Sequence[Item]) -> list[str]:
    out: list[str] = []
    for it in stream:
        out += plain_table(it) if isinstance(it, Table) else [it.plain()]
    return out


def plain(reports: Union[Report, Sequence[Report]]) -> str:
    """The text report without rich and without wrapping (``str(report)``)."""
    reports = list(reports) if isinstance(reports, (list, tuple)) else [reports]
    lines: list[str] = []
    if len(reports) > 1:
        lines += plain_table(compare_table(reports)) + [""]
    for k, r in enumerate(reports):
        if k:
            lines += ["", f"---- {r.label or r.config or ''}"]
        lines += _plain_items(list(items(r)))
    return "\n".join(lines)


def _cell_lines(c: Cell) -> list[str]:
    """A cell's text, line by line, as the rich rendering lays it out."""
    if isinstance(c, list):
        return [Line(x).plain() if not isinstance(x, str) else x for x in c]
    return _plain_cell(c).split("\n")


def column_widths(t: Table, width: int) -> list[int]:
    """Widths for ``t``'s columns within ``width`` where its words allow: every column as
    wide as its longest line, then the widest wrapped ones narrowed, never below their
    longest word (rows wrap between words, never inside one: an op name, a shape), nor
    above a wrapped column's ``max_width`` unless a word needs it. A table whose words do
    not fit is wider than ``width``."""
    cells = [[col.name, *(x for r in t.rows for x in _cell_lines(r[k]))]
             for k, col in enumerate(t.columns)]
    natural = [max(len(x) for x in c) for c in cells]
    least = [max([len(w) for x in c for w in x.split()] or [1]) if col.wrap else n
             for c, col, n in zip(cells, t.columns, natural)]
    out = [min(n, max(col.max_width, lo)) if col.wrap and col.max_width else n
           for n, lo, col in zip(natural, least, t.columns)]
    room = width - (3 * len(out) + 1)  # rich's simple box: padding and rules
    while sum(out) > room:
        shrink = [k for k in range(len(out)) if out[k] > least[k]]
        if not shrink:
            break
        k = max(shrink, key=lambda i: out[i])
        out[k] -= max(1, min(out[k] - least[k], sum(out) - room))
    return out


def _rich(it: Item, fit: bool = True, width: int = WIDTH,
          widths: Optional[list[int]] = None):
    """A rich renderable of an item. ``fit``: tables that ask to fill the width do; else
    each is as wide as its cells, its title a line above it wrapped at ``width`` (a title
    is part of a rich table's width), its columns ``widths`` wide (``column_widths``)."""
    if isinstance(it, Line):
        return it.markup()
    from rich import box
    from rich.console import Group
    from rich.table import Table as RichTable

    t = RichTable(title=Line(it.title).markup() if fit else None, title_justify="left",
                  box=box.SIMPLE_HEAD, expand=it.expand and fit)
    if widths is not None:
        for c, w in zip(it.columns, widths):
            t.add_column(Line(c.name).markup(), justify="right" if c.right else "left",
                         no_wrap=not c.wrap, overflow="fold", width=w)
    else:
        for c in it.columns:
            t.add_column(Line(c.name).markup(), justify="right" if c.right else "left",
                         no_wrap=not c.wrap, overflow="fold" if c.wrap else "ellipsis",
                         max_width=c.max_width, ratio=c.ratio)
    for r in it.rows:
        t.add_row(*[_rich_cell(c) for c in r])
    if fit:
        return t
    from rich.constrain import Constrain

    return Group(Constrain(Line(it.title).markup(), width), t)


def render(reports: Union[Report, Sequence[Report]], width: int = WIDTH,
           color: bool = False, fit: bool = True) -> str:
    """The text report (several reports: a comparison table, then each in full).

    ``fit``: tables fill ``width`` (a terminal); else (a file, a pipe) each table is laid
    out by ``column_widths`` within ``width``, wider only where its words need it, and
    lines of text keep ``width``. Without color no line ends in spaces. Without rich (the
    `report` extra) this is ``plain``, the rendering of ``str(report)``."""
    reports = list(reports) if isinstance(reports, (list, tuple)) else [reports]
    try:
        from rich.console import Console
    except ImportError:
        return plain(reports) + "\n"

    streams = [list(items(r)) for r in reports]
    compare = [compare_table(reports)] if len(reports) > 1 else []
    widths = {} if fit else {id(it): column_widths(it, width)
                             for it in (*compare, *(x for s in streams for x in s))
                             if isinstance(it, Table)}
    wide = max([width] + [sum(w) + 3 * len(w) + 1 for w in widths.values()])
    buf = io.StringIO()
    console = Console(file=buf, width=wide, force_terminal=color, no_color=not color,
                      highlight=False, soft_wrap=False)

    def show(it: Item) -> None:
        console.print(_rich(it, fit, width, widths.get(id(it))),
                      width=width if isinstance(it, Line) else None)

    for it in compare:
        show(it)
        console.print()
    for k, (r, stream) in enumerate(zip(reports, streams)):
        if k and fit:
            console.rule(r.label or r.config or "")
        elif k:
            console.print(f"---- {r.label or r.config or ''}", markup=False)
        for it in stream:
            show(it)
    text = buf.getvalue()
    return text if color else "\n".join(x.rstrip() for x in text.split("\n"))


use_text_rendering(plain)  # str(report)
