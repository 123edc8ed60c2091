"""The report as one self-contained HTML page that stays readable at 500 nodes.

Reads only the ``Report`` model. No CDN, no fetch: CSS and JS (``page.css``, ``page.js``
beside this module), the layout library (dagre, MIT, vendored in ``vendor/``) and the
report's JSON are inline, so the file works offline and can be mailed. Per graph: the
overview (overview.py: a strip of partitions, a row per module group), the graph by
module (laid out in the page by dagre; a box opens into its submodules and ATen nodes),
then the partition and op tables. Several reports (configs) are columns side by side;
backend colors are the backends' own (``Backend.color``). docs/report.md ("The HTML
page") describes the page and the attributes tests and tools read (``data-partition``,
``data-ready``, ``data-overflow``...).
"""
from __future__ import annotations

import importlib.resources
import json
import zlib
from collections.abc import Sequence
from typing import Optional

from .cells import (distributed_entries, distributed_summary, kind_fell_back,
                    kind_where, ops_text, partition_notes, plural, shapes_summary,
                    short_op, sizes_vary)
from .accuracy import module_lines
from .choice import choice_line, not_chosen_lines, step_line
from .model import GraphReport, Report
from .overview import (FALLBACK_COLOR, MAX_GROUPS, TOP, esc as _e, module_groups,  # noqa: F401
                       overview)

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#ff9da7",
           "#9c755f", "#e15759", "#8cd17d"]


def backend_colors(reports: Sequence[Report]) -> dict[str, str]:
    """Backend -> color: its own (``Backend.color``), else one picked from its name (the
    same in every file); the last of a chain without a color of its own in gray."""
    colors: dict[str, str] = {}
    for r in reports:
        for k, b in enumerate(r.backends):
            if b.name in colors:
                continue
            if b.color:
                colors[b.name] = b.color
            elif k == len(r.backends) - 1:
                colors[b.name] = FALLBACK_COLOR
            else:
                colors[b.name] = PALETTE[zlib.crc32(b.name.encode()) % len(PALETTE)]
    for r in reports:  # a lower-precision variant (`openvino:bf16`) in its backend's color
        for g in r.graphs:
            for p in g.partitions:
                for name in (p.backend, p.planned_backend):
                    if name and name not in colors and name.split(":")[0] in colors:
                        colors[name] = colors[name.split(":")[0]]
    return colors


def _cell(c: object, long: bool) -> str:
    """A table cell: a number (right-aligned), text, or (text, tooltip). A ``long`` column
    (op lists, reasons) may break its words anywhere; others break only between words."""
    if isinstance(c, (int, float)):
        return f'<td class="num" data-v="{c}">{_e(c)}</td>'
    text, tip = c if isinstance(c, tuple) else (c, "")
    attrs = (' class="long"' if long else "") + f' data-v="{_e(text)}"' + \
        (f' title="{_e(tip)}"' if tip else "")
    return f"<td{attrs}>{_e(text)}</td>"


def _table(cls: str, head: Sequence[str], rows: Sequence[Sequence[object]],
           long: Sequence[str] = ()) -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    wide = [h in long for h in head]
    body = "".join("<tr>" + "".join(_cell(c, w) for c, w in zip(row, wide)) + "</tr>"
                   for row in rows)
    return (f'<div class="tablewrap"><table class="sortable {cls}"><thead><tr>{th}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def _tensors(ins, outs) -> tuple[str, str]:
    """``1x3x224x224 +102 -> 1x10`` (the first data tensor, how many more: as the text
    report), and every tensor for the tooltip."""
    def every(ts):
        return " ".join(("const " if t.source == "constant" else "") +
                        f"{t.dtype}[{'x'.join(map(str, t.shape))}]" for t in ts)

    return (f"{shapes_summary(ins)} -> {shapes_summary(outs)}",
            f"in: {every(ins)}\nout: {every(outs)}")


def _backend(p) -> str:
    """What runs a partition; the plan's backend when another took over, or ``(plan)``."""
    if not p.compiled:
        return f"{p.planned_backend} (plan)"
    return p.backend if p.backend == p.planned_backend else \
        f"{p.backend} (planned {p.planned_backend})"


def _notes(g: GraphReport) -> str:
    """Under the partitions table, what its rows have no room for (as the text report's
    ``partition N:`` lines): checks, copies, measured times, each fallback and its reason."""
    items = [f"partition {p.id}: " + "; ".join(notes)
             for p in g.partitions if (notes := partition_notes(p))]
    items += [f"partition {p.id}: fallback at {f.stage}: {f.from_backend} -> {f.to_backend}: "
              f"{f.reason}" for p in g.partitions for f in p.fallbacks]
    return _list(items)


def _list(items: Sequence[str]) -> str:
    """Notes under a table: what its rows have no room for."""
    return ('<ul class="notes">' + "".join(f"<li>{_e(x)}</li>" for x in items) + "</ul>"
            if items else "")


def _graph(r: Report, g: GraphReport, colors: dict[str, str], rid: int) -> str:
    total = r.timing.total_s if r.timing else sum(p.run_s for p in g.partitions)
    out = [f'<div class="graph-block" data-report="{rid}" data-graph="{g.graph_id}">',
           f"<h3>graph {g.graph_id} ({_e(g.kind)}{', ' + _e(g.model) if g.model else ''}): "
           f"{plural(g.nodes, 'node')}, {plural(len(g.partitions), 'partition')}, "
           f"policy {_e(g.policy)}</h3>"]
    choice = choice_line(g)
    if choice:
        out.append(f'<p class="choice">{_e(choice)}</p>')
    out += [f"<p>{_e(line)}</p>" for line in not_chosen_lines(g)]
    step = step_line(g)
    if step:
        out.append(f'<p class="choice">{_e(step)}</p>')
    if g.accuracy is not None:  # config `accuracy` (docs/precision.md)
        a = g.accuracy
        lowered = [f"{p.id} {p.precision}" for p in g.partitions if p.precision != "native"]
        out.append("<p>" + _e(
            f"accuracy {a.bound or f'rtol {a.rtol:g}, atol {a.atol:g}'}: "
            + (f"partitions {', '.join(lowered)}" if lowered
               else "all at the graph's own precision")
            + (f" (max error {a.chosen_error:.2e} against float32 eager)"
               if a.chosen_error is not None else "")
            + "".join(f"; {k}: error {v:.2e}" for k, v in a.errors.items())
            + "".join(f"; refused {k}: {v}" for k, v in a.rejected.items())) + "</p>")
        out += [f"<p>{_e(line.strip())}</p>" for line in module_lines(a)]
        if a.modules:
            out.append("<table><tr><th>#</th><th>module</th><th>class</th><th>precision</th>"
                       "<th>backend</th><th>float32 ms</th><th>lowered ms</th>"
                       "<th>lowered alone: rel norm</th><th>why float32</th></tr>" + "".join(
                           f"<tr><td>{m.index}</td><td>{_e(m.module)}</td><td>{_e(m.cls)}</td>"
                           f"<td>{_e(m.precision)}</td><td>{_e(m.backend)}</td>"
                           f"<td>{m.f32_ms if m.f32_ms is not None else '-'}</td>"
                           f"<td>{m.low_ms if m.low_ms is not None else '-'}</td>"
                           f"<td>{_e(str(m.alone.rel_norm)) if m.alone else '-'}</td>"
                           f"<td>{_e(m.why)}</td></tr>" for m in a.modules) + "</table>")
    for rule in g.rules:
        if rule.applied < rule.nodes or not rule.nodes:
            what = f"pin {rule.op} -> {rule.backend}" if rule.kind == "pin" else \
                f"exclude {rule.op}"
            out.append(f'<p class="warn">{_e(what)}: {rule.applied} of '
                       f'{plural(rule.nodes, "node")}'
                       + _e("".join(f"; {n}: {w}" for w, n in rule.why_not.items())) + "</p>")
    out.append(overview(r, g, colors, rid))
    out.append(f'<details class="graphview" open><summary>graph by module (click a box to '
               f'open it)</summary><div class="tools"><button data-act="fit">fit</button> '
               f'<button data-act="in">+</button> <button data-act="out">−</button> '
               f'<button data-act="open">open all</button> <button data-act="close">close '
               f'all</button> <span class="muted">wheel: zoom · drag: pan</span></div>'
               f'<div class="viewport"><svg class="graph" data-report="{rid}" '
               f'data-graph="{g.graph_id}"></svg></div></details>')
    depth, _ = module_groups(g)
    mods: dict[int, list[str]] = {}
    for n in g.graph:
        path = ".".join(n.module.split(".")[:depth]) if n.module else TOP
        if path not in mods.setdefault(n.partition, []):
            mods[n.partition].append(path)
    out.append("<details><summary>partitions</summary>" + _table(
        "partitions", ["#", "backend", "nodes", "modules", "in -> out", "bytes in",
                       "bytes out", "compile s", "run ms/call (share)"], [
            [p.id, _backend(p), p.nodes,
             (", ".join(mods.get(p.id, [])[:3]) + (" …" if len(mods.get(p.id, [])) > 3 else ""),
              "\n".join(mods.get(p.id, []))),
             _tensors(p.inputs, p.outputs),
             "varies" if sizes_vary(p) else p.bytes_in + p.graph_input_bytes,
             "varies" if sizes_vary(p) else p.bytes_out, p.compile_s,
             f"{p.run_s / p.calls * 1e3:.4g} ({p.run_s / total:.0%})" if total and p.calls
             else round(p.run_s / p.calls * 1e3, 4) if p.calls else "-"]
            for p in g.partitions],
        long=("modules",)) + _notes(g) + "</details>")
    refusals = [f"{short_op(o.op)} refused by {b}: {w}" for o in g.ops
                for b, w in o.refused.items()]
    out.append("<details><summary>ops</summary>" + _table(
        "ops", ["op", "nodes", "runs on", "able", "refused by"], [
            [(short_op(o.op), o.op), o.nodes,
             ", ".join([f"{b} {n}" for b, n in o.placed.items()] +
                       [f"{b} {n} (planned)" for b, n in o.planned.items()]),
             ", ".join(o.able), ", ".join(o.refused) or "-"]
            for o in g.ops]) + _list(refusals) + "</details>")
    out.append("</div>")
    return "".join(out)


def _kinds(r: Report) -> str:
    """Per graph kind (forward, backward, inference): what ran where, one row each."""
    if not r.kinds:
        return ""
    timed = any(k.calls for k in r.kinds)
    # the text report's columns (text.kind_table): one row a kind, short enough side by side
    head = ["kind", "nodes", "runs on: nodes in partitions", "eager: its ops", "fell back",
            "compile s"] + (["run ms/call"] if timed else [])
    rows = []
    for k in r.kinds:
        kind = (k.kind, plural(len(k.graphs), "graph")) if len(k.graphs) == 1 else \
            f"{k.kind} ({len(k.graphs)} graphs)"
        row = [kind, k.nodes, kind_where(k), ops_text(k.eager_ops, 4) if k.eager_nodes else "-",
               kind_fell_back(k), round(k.compile_s, 2)]
        if timed:
            row.append(round(k.run_s / k.calls * 1e3, 3) if k.calls else "-")
        rows.append(row)
    return '<div class="kinds"><p><b>what ran where, per graph kind</b></p>' + \
        _table("kinds", head, rows, long=("eager: its ops",)) + "</div>"


def _distributed(r: Report) -> str:
    """Which decisions were broadcast under torch.distributed; nothing when none was."""
    if r.distributed is None:
        return ""
    items = "".join(f"<li>{_e(x)}</li>" for x in distributed_entries(r.distributed))
    return (f'<div class="distributed"><p><b>distributed</b>: '
            f'{_e(distributed_summary(r.distributed))}</p><ul>{items}</ul></div>')


def _section(r: Report, rid: int, colors: dict[str, str]) -> str:
    out = [f'<section class="report" data-report="{rid}">',
           f"<h2>{_e(r.label or r.config or 'default')}</h2>",
           f'<p class="summary">{_e(("[dry run] " if r.dry_run else "") + r.summary())}</p>']
    for b in r.backends:
        if not b.available:
            out.append(f'<p class="warn">backend {_e(b.name)} unavailable: {_e(b.reason)}</p>')
    out += [f'<p class="warn">warning: {_e(w)}</p>' for w in r.warnings]
    if r.graph_breaks is not None and r.graph_breaks.breaks:
        out += [f'<p class="warn">graph break: {_e(x)}</p>' for x in r.graph_breaks.reasons]
    out.append(_kinds(r))
    out.append(_distributed(r))
    more = [f"<p>model {_e(r.model or '-')} · config {_e(r.config or 'default')} · "
            f"{_e(r.created)}</p>",
            "<p>versions: " + _e("; ".join(f"{k}: {v}" for k, v in r.versions.items())) + "</p>"]
    if r.resources:
        more.append("<p>resources: " + _e(", ".join(f"{k} {v}" for k, v in
                                                     r.resources.items())) + "</p>")
    if r.graph_breaks is not None:
        more.append(f"<p>Dynamo: {plural(r.graph_breaks.graphs, 'graph')}, "
                    f"{plural(r.graph_breaks.breaks, 'graph break')}</p>")
    if r.advice:
        more.append("<ul>" + "".join(f"<li>{_e(a.message)}</li>" for a in r.advice) + "</ul>")
    out.append(f"<details class=\"about\"><summary>model, versions, advice ({len(r.advice)})"
               f"</summary>{''.join(more)}</details>")
    for g in r.graphs:
        out.append(_graph(r, g, colors, rid))
    out.append("</section>")
    return "".join(out)



# Errors are recorded in an attribute of <html>, so a headless browser's --dump-dom shows
# them (tests assert it stays empty).
_ERRS = """<script>
(function(){var d=document.documentElement;d.setAttribute('data-errors','');
function rec(m){d.setAttribute('data-errors',d.getAttribute('data-errors')+String(m)+'\\n');}
window.onerror=function(m,s,l){rec(m+' @'+l);};
var ce=console.error;console.error=function(){rec(Array.prototype.join.call(arguments,' '));ce.apply(console,arguments);};
})();</script>"""




def _asset(*path: str) -> str:
    """A file shipped beside this module (the page's CSS and JS, the vendored dagre)."""
    return importlib.resources.files("arbiter.report").joinpath(*path).read_text()


def render_html(reports: Report | Sequence[Report], title: Optional[str] = None) -> str:
    """One page for one report, or several side by side (one column each)."""
    reports = [reports] if isinstance(reports, Report) else list(reports)
    colors = backend_colors(reports)
    payload = json.dumps([r.model_dump(mode="json") for r in reports])
    payload = payload.replace("</", "<\\/")  # keep </script> inside the JSON inert
    model = reports[0].model if reports else None
    title = title or "torch-arbiter report" + (f": {model}" if model else "")
    body = "".join(_section(r, k, colors) for k, r in enumerate(reports))
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title>{_ERRS}<style>{_asset('page.css')}</style></head><body>"
            f'<div id="bar"><h1>{_e(title)}</h1><input id="search" '
            'placeholder="search ops (e.g. addmm)"> <span id="hits"></span></div>'
            f'<div id="details"></div><div class="reports" style="--cols:{max(len(reports), 1)}">'
            f"{body}</div>"
            f'<script type="application/json" id="report-data">{payload}</script>'
            f'<script type="application/json" id="report-colors">{json.dumps(colors)}</script>'
            f"<script>/* dagre {_DAGRE_VERSION}, MIT license (arbiter/report/vendor/"
            f"dagre.LICENSE) */\n{_asset('vendor', 'dagre.min.js')}</script>"
            f"<script>\n{_asset('page.js')}</script></body></html>")


_DAGRE_VERSION = "1.1.4"
