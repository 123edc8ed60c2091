"""The report as one self-contained HTML page: the graph drawn as SVG, sortable tables.

Reads only the ``Report`` model. No CDN, no fetch: CSS and JS are inline and the report's
JSON is embedded, so the file works offline and can be mailed.

Layout (computed here, in Python, so the page needs no layout library): partitions are
placed left to right in plan order, which is topological; inside a partition, nodes go in
columns by their depth within it (longest path from the partition's inputs) and rows by
order. Boxes never overlap and every edge points right. A graph of N nodes costs O(N + E).
In the page, each partition is an SVG ``<g class="partition" data-partition=ID>`` with one
``<rect class="partition-box">`` (tests count these); a click on a box's title collapses
it; the search box highlights nodes by op; clicking a node shows its details.
"""
from __future__ import annotations

import html
import json
from collections.abc import Sequence

from .model import GraphReport, Report

NODE_W, NODE_H, COL_W, ROW_H, PAD, HEAD = 118, 22, 140, 30, 12, 22
#: Graphs with more nodes than this start with their partitions collapsed.
COLLAPSE_OVER = 1500
PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#ff9da7",
           "#9c755f"]
FALLBACK_COLOR = "#9d9d9d"


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _short(op: str) -> str:
    op = op.removeprefix("aten.")
    return op if len(op) <= 17 else op[:16] + "…"


def backend_colors(reports: Sequence[Report]) -> dict[str, str]:
    """Backend -> color: config order, the fallback (last of the chain) in gray."""
    colors: dict[str, str] = {}
    for r in reports:
        names = [b.name for b in r.backends]
        for k, name in enumerate(names):
            if name in colors:
                continue
            colors[name] = FALLBACK_COLOR if k == len(names) - 1 else \
                PALETTE[len([c for c in colors.values() if c != FALLBACK_COLOR]) % len(PALETTE)]
    return colors


def _runs_on(r: Report, p) -> str:
    return p.backend if p.compiled else p.planned_backend


def layout(g: GraphReport) -> tuple[dict[str, tuple[float, float]], list[tuple[int, float, float, float, float]], float, float]:
    """Node name -> (x, y); partition boxes (id, x, y, w, h); total width and height."""
    by_part: dict[int, list] = {}
    for n in g.graph:
        by_part.setdefault(n.partition, []).append(n)
    pos: dict[str, tuple[float, float]] = {}
    boxes = []
    x0 = PAD
    height = 0.0
    for p in g.partitions:
        nodes = by_part.get(p.id, [])
        inside = {n.name for n in nodes}
        depth: dict[str, int] = {}
        rows: dict[int, int] = {}
        for n in nodes:  # plan order is topological
            d = 1 + max((depth[i] for i in n.inputs if i in inside), default=-1)
            depth[n.name] = d
            row = rows.get(d, 0)
            rows[d] = row + 1
            pos[n.name] = (x0 + PAD + d * COL_W, PAD + HEAD + PAD + row * ROW_H)
        cols = (max(depth.values()) + 1) if depth else 1
        w = 2 * PAD + (cols - 1) * COL_W + NODE_W
        h = HEAD + 2 * PAD + max(rows.values(), default=1) * ROW_H
        boxes.append((p.id, x0, PAD, w, h))
        height = max(height, PAD + h)
        x0 += w + 3 * PAD
    return pos, boxes, x0, height + PAD


def _svg(r: Report, g: GraphReport, colors: dict[str, str], rid: int) -> str:
    pos, boxes, width, height = layout(g)
    parts = {p.id: p for p in g.partitions}
    collapsed = len(g.graph) > COLLAPSE_OVER
    out = [f'<svg class="graph" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
           f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
           f'data-report="{rid}" data-graph="{g.graph_id}">',
           '<defs><marker id="arrow" viewBox="0 0 6 6" refX="6" refY="3" markerWidth="5" '
           'markerHeight="5" orient="auto"><path d="M0,0L6,3L0,6z" fill="#777"/></marker></defs>']
    # edges first, under the nodes; an edge belongs to the partition of its target
    edges: dict[int, list[str]] = {}
    cross = []
    part_of = {n.name: n.partition for n in g.graph}
    for n in g.graph:
        x2, y2 = pos[n.name]
        for i in n.inputs:
            if i not in pos:
                continue
            x1, y1 = pos[i]
            d = (f'<path class="edge" d="M{x1 + NODE_W:.0f},{y1 + NODE_H / 2:.0f} '
                 f'C{x1 + NODE_W + 30:.0f},{y1 + NODE_H / 2:.0f} {x2 - 30:.0f},{y2 + NODE_H / 2:.0f} '
                 f'{x2:.0f},{y2 + NODE_H / 2:.0f}" marker-end="url(#arrow)"/>')
            if part_of[i] == n.partition:
                edges.setdefault(n.partition, []).append(d)
            else:
                cross.append(d.replace('class="edge"', 'class="edge cross"'))
    out.append('<g class="cross-edges">' + "".join(cross) + "</g>")
    nodes_of: dict[int, list] = {}
    for n in g.graph:
        nodes_of.setdefault(n.partition, []).append(n)
    for pid, x, y, w, h in boxes:
        p = parts[pid]
        b = _runs_on(r, p)
        color = colors.get(b, FALLBACK_COLOR)
        fell = " fell-back" if p.fallbacks else ""
        out.append(f'<g class="partition{" collapsed" if collapsed else ""}{fell}" '
                   f'data-partition="{pid}" data-backend="{_e(b)}" data-nodes="{p.nodes}">')
        out.append(f'<rect class="partition-box" x="{x:.0f}" y="{y:.0f}" width="{w:.0f}" '
                   f'height="{h:.0f}" rx="6" style="stroke:{color}"/>')
        label = f"#{pid} {b} · {p.nodes} nodes" + (" · fell back" if p.fallbacks else "")
        out.append(f'<text class="partition-title" x="{x + 6:.0f}" y="{y + 15:.0f}" '
                   f'style="fill:{color}">{_e(label)}<title>click: collapse/expand</title></text>')
        out.append('<g class="inner">' + "".join(edges.get(pid, [])))
        for n in nodes_of.get(pid, []):
            nx, ny = pos[n.name]
            shape = "x".join(map(str, n.shape))
            tip = f"{n.name}: {n.op} -> {n.dtype}[{shape}] on {b}"
            out.append(f'<g class="node" data-name="{_e(n.name)}" data-op="{_e(n.op)}" '
                       f'data-partition="{pid}"><rect x="{nx:.0f}" y="{ny:.0f}" width="{NODE_W}" '
                       f'height="{NODE_H}" rx="3" style="fill:{color}"/><text x="{nx + 5:.0f}" '
                       f'y="{ny + 15:.0f}">{_e(_short(n.op))}</text><title>{_e(tip)}</title></g>')
        out.append("</g></g>")
    out.append("</svg>")
    return "".join(out)


def _table(cls: str, head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(
        f'<td data-v="{_e(c)}">{_e(c)}</td>' if not isinstance(c, (int, float))
        else f'<td class="num" data-v="{c}">{_e(c)}</td>' for c in row) + "</tr>" for row in rows)
    return f'<table class="sortable {cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _section(r: Report, rid: int, colors: dict[str, str]) -> str:
    out = [f'<section class="report" data-report="{rid}">',
           f"<h2>{_e(r.label or r.config or 'default')}</h2>",
           f'<p class="summary">{_e(("[dry run] " if r.dry_run else "") + r.summary())}</p>',
           f"<p>model {_e(r.model or '-')} · config {_e(r.config or 'default')} · "
           f"{_e(r.created)}</p>",
           "<p>versions: " + _e("; ".join(f"{k}: {v}" for k, v in r.versions.items())) + "</p>"]
    for b in r.backends:
        if not b.available:
            out.append(f'<p class="warn">backend {_e(b.name)} unavailable: {_e(b.reason)}</p>')
    out += [f'<p class="warn">warning: {_e(w)}</p>' for w in r.warnings]
    if r.resources:
        out.append("<p>resources: " + _e(", ".join(f"{k} {v}" for k, v in r.resources.items()))
                   + "</p>")
    if r.graph_breaks is not None:
        out.append(f"<p>Dynamo: {r.graph_breaks.graphs} graph(s), {r.graph_breaks.breaks} "
                   "graph break(s)</p>")
        out += [f'<p class="warn">break: {_e(x)}</p>' for x in r.graph_breaks.reasons]
    if r.advice:
        out.append("<h3>advice</h3><ul>" + "".join(f"<li>{_e(a.message)}</li>"
                                                    for a in r.advice) + "</ul>")
    for g in r.graphs:
        out.append(f"<h3>graph {g.graph_id} ({_e(g.kind)}): {g.nodes} nodes, "
                   f"{len(g.partitions)} partitions, policy {_e(g.policy)}</h3>")
        if g.chosen or g.candidates_ms or g.estimates_ms:
            out.append(f"<p>policy {_e(g.policy)}: chose {_e(g.chosen or '-')}; measured: " +
                       _e(", ".join(f"{k} {v:.3f} ms" if v is not None else f"{k} -"
                                    for k, v in g.candidates_ms.items()) or "-") +
                       "; estimated: " + _e(", ".join(f"{k} {v:.3f} ms" for k, v in
                                                      g.estimates_ms.items()) or "-") + "</p>")
        out.append('<div class="legend">' + "".join(
            f'<span><i style="background:{colors.get(b, FALLBACK_COLOR)}"></i>{_e(b)} '
            f'({g.coverage.get(b, 0):.0f}% could run)</span>' for b in g.coverage) + "</div>")
        out.append(f'<div class="scroll">{_svg(r, g, colors, rid)}</div>')
        # share of the whole timed calls, as in the text report
        total = r.timing.total_s if r.timing else sum(p.run_s for p in g.partitions)
        out.append(_table("partitions", ["#", "backend", "planned", "nodes", "inputs",
                                         "outputs", "bytes in", "bytes out", "compile s",
                                         "run ms/call", "share of call", "copies",
                                         "verify", "measured ms", "fallbacks"], [
            [p.id, _runs_on(r, p), p.planned_backend, p.nodes,
             " ".join(("const " if t.source == "constant" else "") +
                      f"{t.dtype}[{'x'.join(map(str, t.shape))}]" for t in p.inputs),
             " ".join(f"{t.dtype}[{'x'.join(map(str, t.shape))}]" for t in p.outputs),
             p.bytes_in + p.graph_input_bytes, p.bytes_out, p.compile_s,
             round(p.run_s / p.calls * 1e3, 4) if p.calls else "-",
             f"{p.run_s / total:.0%}" if total and p.calls else "-",
             f"{p.copies} + {p.restride_copies} restride",
             (f"{p.verify_checks}x, max err {p.verify_max_error:.1e}"
              if p.verify_max_error is not None else f"{p.verify_checks}x")
             if p.verify_checks else "-",
             ", ".join(f"{b} {ms:.3f}" for b, ms in p.measured_ms.items()) or "-",
             "; ".join(f"{f.stage}: {f.from_backend} -> {f.to_backend}: {f.reason}"
                       for f in p.fallbacks) or "-"] for p in g.partitions]))
        out.append(_table("ops", ["op", "nodes", "runs on", "able", "refused"], [
            [o.op, o.nodes, ", ".join([f"{b} {n}" for b, n in o.placed.items()] +
                                      [f"{b} {n} (planned)" for b, n in o.planned.items()]),
             ", ".join(o.able), "; ".join(f"{b}: {w}" for b, w in o.refused.items()) or "-"]
            for o in g.ops]))
    out.append("</section>")
    return "".join(out)


_CSS = """
body{font:13px system-ui,sans-serif;margin:16px;color:#222}
.summary{font-weight:bold;font-size:15px}.warn{color:#b00}
.scroll{overflow:auto;border:1px solid #ddd;max-height:70vh;margin:8px 0}
.partition-box{fill:#fafafa;stroke-width:2}.fell-back .partition-box{stroke-dasharray:6 3}
.partition-title{font-weight:bold;cursor:pointer}
.collapsed .inner{display:none}
.node rect{stroke:#333;stroke-width:.5;cursor:pointer}.node text{fill:#fff;font-size:11px;pointer-events:none}
.node.hit rect{stroke:#e00;stroke-width:3}.node.sel rect{stroke:#000;stroke-width:3}
.edge{fill:none;stroke:#999;stroke-width:1}.edge.cross{stroke:#c66;stroke-dasharray:3 2}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
th{cursor:pointer;background:#f0f0f0}td.num{text-align:right}
.legend span{margin-right:14px}.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}
#details{position:fixed;right:12px;top:12px;max-width:380px;background:#fff;border:1px solid #888;padding:8px;white-space:pre-wrap;display:none}
#bar{position:sticky;top:0;background:#fff;padding:4px 0;z-index:1}
.fit svg.graph{width:100%;height:auto}
"""

# Errors are recorded in an attribute of <html>, so a headless browser's --dump-dom shows
# them (tests assert it stays empty).
_ERRS = """<script>
(function(){var d=document.documentElement;d.setAttribute('data-errors','');
function rec(m){d.setAttribute('data-errors',d.getAttribute('data-errors')+String(m)+'\\n');}
window.onerror=function(m,s,l){rec(m+' @'+l);};
var ce=console.error;console.error=function(){rec(Array.prototype.join.call(arguments,' '));ce.apply(console,arguments);};
})();</script>"""

_JS = """<script>
(function(){
var data=JSON.parse(document.getElementById('report-data').textContent);
document.querySelectorAll('.partition-title').forEach(function(t){
  t.addEventListener('click',function(){t.parentNode.classList.toggle('collapsed');});});
document.getElementById('collapse').onclick=function(){document.querySelectorAll('.partition').forEach(function(g){g.classList.add('collapsed');});};
document.getElementById('expand').onclick=function(){document.querySelectorAll('.partition').forEach(function(g){g.classList.remove('collapsed');});};
document.getElementById('fit').onclick=function(){document.body.classList.toggle('fit');};
var box=document.getElementById('details');
function find(rid,gid,name){var r=data[rid];for(var i=0;i<r.graphs.length;i++){var g=r.graphs[i];if(g.graph_id!=gid)continue;
  for(var j=0;j<g.graph.length;j++){if(g.graph[j].name==name)return [g,g.graph[j]];}}return null;}
document.querySelectorAll('svg.graph').forEach(function(svg){
  svg.addEventListener('click',function(ev){var n=ev.target.closest('.node');if(!n)return;
    document.querySelectorAll('.node.sel').forEach(function(x){x.classList.remove('sel');});n.classList.add('sel');
    var f=find(+svg.dataset.report,+svg.dataset.graph,n.dataset.name);if(!f)return;var g=f[0],nd=f[1];
    var p=g.partitions.filter(function(q){return q.id==nd.partition;})[0];
    var o=g.ops.filter(function(q){return q.op==nd.op;})[0]||{};
    var t=nd.name+'\\nop '+nd.op+'\\nout '+nd.dtype+'['+nd.shape.join('x')+']\\ninputs '+nd.inputs.join(', ')+
      '\\npartition #'+p.id+(p.compiled?' on '+p.backend+' (planned '+p.planned_backend+')':' planned for '+p.planned_backend+' (not compiled)')+'\\nable: '+(o.able||[]).join(', ');
    for(var b in (o.refused||{}))t+='\\nrefused by '+b+': '+o.refused[b];
    p.fallbacks.forEach(function(f){t+='\\nfallback at '+f.stage+': '+f.from_backend+' -> '+f.to_backend+': '+f.reason;});
    box.textContent=t;box.style.display='block';});});
box.onclick=function(){box.style.display='none';};
var q=document.getElementById('search');
q.addEventListener('input',function(){var s=q.value.trim().toLowerCase(),k=0,first=null;
  document.querySelectorAll('.node').forEach(function(n){var hit=s&&n.dataset.op.toLowerCase().indexOf(s)>=0;
    n.classList.toggle('hit',!!hit);if(hit){k++;if(!first)first=n;n.closest('.partition').classList.remove('collapsed');}});
  document.getElementById('hits').textContent=s?k+' node(s)':'';if(first&&first.scrollIntoView)first.scrollIntoView({block:'nearest',inline:'center'});});
document.querySelectorAll('table.sortable th').forEach(function(th,ix){th.addEventListener('click',function(){
  var tb=th.closest('table').tBodies[0],rows=Array.prototype.slice.call(tb.rows),col=th.cellIndex,asc=th.dataset.asc!='1';
  th.dataset.asc=asc?'1':'0';rows.sort(function(a,b){var x=a.cells[col].dataset.v,y=b.cells[col].dataset.v,nx=parseFloat(x),ny=parseFloat(y);
    var c=(!isNaN(nx)&&!isNaN(ny))?nx-ny:String(x).localeCompare(String(y));return asc?c:-c;});
  rows.forEach(function(r){tb.appendChild(r);});});});
var h=location.hash.match(/search=([^&]*)/);  // a link (or a test) can open a search
if(h){q.value=decodeURIComponent(h[1]);q.dispatchEvent(new Event('input'));}
document.documentElement.setAttribute('data-ready','1');
})();</script>"""


def render_html(reports: Report | Sequence[Report]) -> str:
    """One page for one report, or several side by side (one section each)."""
    reports = [reports] if isinstance(reports, Report) else list(reports)
    colors = backend_colors(reports)
    payload = json.dumps([r.model_dump(mode="json") for r in reports])
    payload = payload.replace("</", "<\\/")  # keep </script> inside the JSON inert
    model = reports[0].model if reports else None
    title = "torch-arbiter report" + (f": {model}" if model else "")
    body = "".join(_section(r, k, colors) for k, r in enumerate(reports))
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title>{_ERRS}<style>{_CSS}</style></head><body>"
            f"<h1>{_e(title)}</h1>"
            '<div id="bar"><input id="search" placeholder="search ops (e.g. addmm)"> '
            '<span id="hits"></span> <button id="collapse">collapse all</button> '
            '<button id="expand">expand all</button> '
            '<button id="fit">fit width / actual size</button></div>'
            f'<div id="details"></div>{body}'
            f'<script type="application/json" id="report-data">{payload}</script>'
            f"{_JS}</body></html>")
