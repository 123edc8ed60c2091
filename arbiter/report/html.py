"""The report as one self-contained HTML page that stays readable at 500 nodes.

Reads only the ``Report`` model. No CDN, no fetch: CSS, JS, the layout library (dagre,
MIT, vendored in ``vendor/``) and the report's JSON are inline, so the file works offline
and can be mailed.

Per graph, top to bottom:

* **Overview** (drawn here, in Python, sized in percent so it fits any width): a strip
  with one box per partition (width by nodes, colored by the backend that runs it, a red
  mark where it fell back), and one row per module group (``module_groups``: module
  paths from Dynamo's ``nn_module_stack``, cut at the deepest level with at most
  ``MAX_GROUPS`` groups) with a bar of the backends that run its nodes. BERT-base's 12
  layers are 19 rows.
* **Graph** (laid out in the page by dagre, top to bottom): one box per module group,
  striped by backend; a click on a box opens it into its submodules and then its ATen
  nodes (a dashed cluster, whose title click closes it); nodes outside any module are
  grouped by partition. Wheel or buttons zoom, dragging pans, "fit" fits.
* Partition and op tables (sortable, wrapping, in collapsed sections).

Several reports (configs) are columns side by side. Backend colors are the backends'
own (``Backend.color``), the same in every file.

For tests and tools: each partition is ``<g class="partition" data-partition=ID
data-backend=B>`` with one ``<rect class="partition-box">`` in the overview strip; module
rows are ``<tr class="module" data-module=PATH>``; the graph's boxes are ``<g class="unit"
data-unit=KEY>``; the page writes script errors into ``<html data-errors>``, sets
``data-ready="1"`` when its script finished, and measures itself into ``data-overflow``
(page width beyond the window, px) and ``data-overview-bottom`` (bottom of the first
overview, px from the top of the window).
"""
from __future__ import annotations

import html
import importlib.resources
import json
import zlib
from collections.abc import Sequence
from typing import Optional

from .model import GraphReport, Report
from .text import (distributed_entries, distributed_summary, kind_fell_back, kind_where,
                   ops_text)

#: Most module groups an overview shows (rows); deeper paths are cut to fit.
MAX_GROUPS = 32
PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#ff9da7",
           "#9c755f", "#e15759", "#8cd17d"]
FALLBACK_COLOR = "#9d9d9d"
TOP = "(top level)"


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


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


def _runs_on(p) -> str:
    return p.backend if p.compiled else p.planned_backend


def module_groups(g: GraphReport, max_groups: int = MAX_GROUPS) -> tuple[int, list[tuple[str, list]]]:
    """(depth, [(module path cut at that depth, its nodes)]) in graph order: the deepest
    cut with at most ``max_groups`` groups (at least depth 1). Nodes outside any module
    are one group, ``TOP``."""
    paths = [tuple(n.module.split(".")) if n.module else () for n in g.graph]
    deepest = max((len(p) for p in paths), default=0)
    depth = 1
    for d in range(1, deepest + 1):
        if len({p[:d] for p in paths}) <= max_groups:
            depth = d
        else:
            break
    groups: dict[str, list] = {}
    for n, p in zip(g.graph, paths):
        groups.setdefault(".".join(p[:depth]) if p else TOP, []).append(n)
    return depth, list(groups.items())


def _strip(r: Report, g: GraphReport, colors: dict[str, str], rid: int) -> str:
    """One box per partition, widths by nodes, in plan order; fallbacks marked."""
    total = sum(max(p.nodes, 1) for p in g.partitions) or 1
    unit = 1000.0 / total
    x = 0.0
    out = [f'<svg class="partitions" viewBox="0 0 1000 24" preserveAspectRatio="none" '
           f'data-report="{rid}" data-graph="{g.graph_id}" role="img" '
           f'aria-label="partitions in plan order">']
    for p in g.partitions:
        w = max(p.nodes, 1) * unit
        b = _runs_on(p)
        fell = " fell-back" if p.fallbacks else ""
        tip = (f"#{p.id} {b}{'' if p.compiled else ' (plan)'}: {p.nodes} nodes"
               + "".join(f"; fell back at {f.stage}: {f.from_backend} -> {f.to_backend}: "
                         f"{f.reason}" for f in p.fallbacks))
        out.append(f'<g class="partition{fell}" data-partition="{p.id}" data-backend="{_e(b)}" '
                   f'data-nodes="{p.nodes}"><rect class="partition-box" x="{x:.3f}" y="2" '
                   f'width="{w:.3f}" height="20" style="fill:{colors.get(b, FALLBACK_COLOR)}"/>'
                   + (f'<rect class="fell" x="{x:.3f}" y="0" width="{w:.3f}" height="4"/>'
                      if p.fallbacks else "") + f"<title>{_e(tip)}</title></g>")
        x += w
    out.append("</svg>")
    return "".join(out)


def _bar(shares: dict[str, int], colors: dict[str, str]) -> str:
    total = sum(shares.values()) or 1
    x = 0.0
    rects = []
    for b, n in shares.items():
        w = 100.0 * n / total
        rects.append(f'<rect x="{x:.3f}" y="0" width="{w:.3f}" height="10" '
                     f'style="fill:{colors.get(b, FALLBACK_COLOR)}"><title>{_e(b)}: {n} '
                     f'node(s)</title></rect>')
        x += w
    return ('<svg class="bar" viewBox="0 0 100 10" preserveAspectRatio="none">'
            + "".join(rects) + "</svg>")


def _overview(r: Report, g: GraphReport, colors: dict[str, str], rid: int) -> str:
    parts = {p.id: p for p in g.partitions}
    order = [b.name for b in r.backends]
    depth, groups = module_groups(g)
    rows = []
    for path, nodes in groups:
        by: dict[str, int] = {}
        pids: list[int] = []
        for n in nodes:
            b = _runs_on(parts[n.partition])
            by[b] = by.get(b, 0) + 1
            if n.partition not in pids:
                pids.append(n.partition)
        by = dict(sorted(by.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order
                         else len(order)))
        fell = [parts[i] for i in pids if parts[i].fallbacks]
        share = " · ".join(f"{b} {n * 100 // len(nodes)}%" for b, n in by.items())
        span = f"#{pids[0]}" if len(pids) == 1 else f"#{min(pids)}–#{max(pids)} ({len(pids)})"
        warn = (f'<span class="fellmark" title="{_e("; ".join(f"#{p.id}: {f.from_backend} -> {f.to_backend} at {f.stage}: {f.reason}" for p in fell for f in p.fallbacks))}">'
                f"⚠{len(fell)} </span>") if fell else ""
        rows.append(f'<tr class="module{" fell" if fell else ""}" data-module="{_e(path)}">'
                    f'<td class="mod" title="{_e(path)}">{warn}{_e(path)}</td>'
                    f'<td class="barcell" title="{_e(share)}">{_bar(by, colors)}</td>'
                    f'<td class="share">{_e(share)}</td><td class="pids">{span}</td></tr>')
    legend = "".join(
        f'<span><i style="background:{colors.get(b, FALLBACK_COLOR)}"></i>{_e(b)} '
        f'{n}</span>' for b, n in _node_counts(g).items())
    falls = sum(len(p.fallbacks) for p in g.partitions)
    return (f'<div class="overview" data-report="{rid}" data-graph="{g.graph_id}">'
            f'<div class="legend">{legend}<span class="muted">nodes · {len(g.partitions)} '
            f'partitions{f" · {falls} fallback(s)" if falls else ""}</span></div>'
            f"{_strip(r, g, colors, rid)}"
            f'<table class="modules"><thead><tr><th>module (depth {depth})</th><th>backends'
            f'</th><th class="share">share</th><th>partitions</th></tr></thead><tbody>'
            f"{''.join(rows)}"
            "</tbody></table></div>")


def _node_counts(g: GraphReport) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in g.partitions:
        b = _runs_on(p)
        out[b] = out.get(b, 0) + p.nodes
    return out


def _table(cls: str, head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(
        f'<td data-v="{_e(c)}">{_e(c)}</td>' if not isinstance(c, (int, float))
        else f'<td class="num" data-v="{c}">{_e(c)}</td>' for c in row) + "</tr>" for row in rows)
    return (f'<div class="tablewrap"><table class="sortable {cls}"><thead><tr>{th}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def _shapes(ts) -> str:
    return " ".join(("const " if t.source == "constant" else "") +
                    f"{t.dtype}[{'x'.join(map(str, t.shape))}]" for t in ts)


def _graph(r: Report, g: GraphReport, colors: dict[str, str], rid: int) -> str:
    total = r.timing.total_s if r.timing else sum(p.run_s for p in g.partitions)
    out = [f'<div class="graph-block" data-report="{rid}" data-graph="{g.graph_id}">',
           f"<h3>graph {g.graph_id} ({_e(g.kind)}{', ' + _e(g.model) if g.model else ''}): "
           f"{g.nodes} nodes, {len(g.partitions)} partitions, policy {_e(g.policy)}</h3>"]
    if g.chosen or g.candidates_ms or g.estimates_ms:
        out.append(f"<p>policy {_e(g.policy)}"
                   f"{', timed against eager' if g.against_eager else ''}: "
                   f"chose {_e(g.chosen or '-')}; measured: " +
                   _e(", ".join(f"{k} {v:.3f} ms" if v is not None else f"{k} -"
                                for k, v in g.candidates_ms.items()) or "-") +
                   "; estimated: " + _e(", ".join(f"{k} {v:.3f} ms" for k, v in
                                                  g.estimates_ms.items()) or "-") + "</p>")
    for label, lines in g.candidate_fallbacks.items():
        out.append(f"<p>not chosen, fell back while timed: {_e(label)}: "
                   f"{_e('; '.join(lines))}</p>")
    if g.accuracy is not None:  # config `accuracy` (docs/precision.md)
        a = g.accuracy
        lowered = [f"{p.id} {p.precision}" for p in g.partitions if p.precision != "native"]
        out.append("<p>" + _e(
            f"accuracy rtol {a.rtol:g}, atol {a.atol:g}: "
            + (f"partitions {', '.join(lowered)}" if lowered
               else "all at the graph's own precision")
            + (f" (max error {a.chosen_error:.2e} against float32 eager)"
               if a.chosen_error is not None else "")
            + "".join(f"; {k}: error {v:.2e}" for k, v in a.errors.items())
            + "".join(f"; refused {k}: {v}" for k, v in a.rejected.items())) + "</p>")
    for rule in g.rules:
        if rule.applied < rule.nodes or not rule.nodes:
            what = f"pin {rule.op} -> {rule.backend}" if rule.kind == "pin" else \
                f"exclude {rule.op}"
            out.append(f'<p class="warn">{_e(what)}: {rule.applied} of {rule.nodes} node(s)'
                       + _e("".join(f"; {n}: {w}" for w, n in rule.why_not.items())) + "</p>")
    out.append(_overview(r, g, colors, rid))
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
        "partitions", ["#", "backend", "planned", "nodes", "modules", "inputs", "outputs",
                       "bytes in",
                       "bytes out", "compile s", "run ms/call", "share of call", "copies",
                       "verify", "measured ms", "fallbacks"], [
            [p.id, _runs_on(p), p.planned_backend, p.nodes,
             ", ".join(mods.get(p.id, [])[:3]) + (" …" if len(mods.get(p.id, [])) > 3 else ""),
             _shapes(p.inputs),
             _shapes(p.outputs), p.bytes_in + p.graph_input_bytes, p.bytes_out, p.compile_s,
             round(p.run_s / p.calls * 1e3, 4) if p.calls else "-",
             f"{p.run_s / total:.0%}" if total and p.calls else "-",
             f"{p.copies} + {p.restride_copies} restride",
             "; ".join(filter(None, [
                 (f"{p.verify_checks}x, max err {p.verify_max_error:.1e}"
                  if p.verify_max_error is not None else f"{p.verify_checks}x")
                 if p.verify_checks else "",
                 (f"NaN/inf guard ({', '.join(p.nonfinite_guard)}): "
                  f"{p.nonfinite_eager_calls} calls in eager") if p.nonfinite_guard else "",
                 *(c.line() for c in p.first_use)]))
             or "-",
             ", ".join(f"{b} {ms:.3f}" for b, ms in p.measured_ms.items()) or "-",
             "; ".join(f"{f.stage}: {f.from_backend} -> {f.to_backend}: {f.reason}"
                       for f in p.fallbacks) or "-"] for p in g.partitions]) + "</details>")
    out.append("<details><summary>ops</summary>" + _table(
        "ops", ["op", "nodes", "runs on", "able", "refused"], [
            [o.op, o.nodes, ", ".join([f"{b} {n}" for b, n in o.placed.items()] +
                                      [f"{b} {n} (planned)" for b, n in o.planned.items()]),
             ", ".join(o.able), "; ".join(f"{b}: {w}" for b, w in o.refused.items()) or "-"]
            for o in g.ops]) + "</details>")
    out.append("</div>")
    return "".join(out)


def _kinds(r: Report) -> str:
    """Per graph kind (forward, backward, inference): what ran where, one row each."""
    if not r.kinds:
        return ""
    timed = any(k.calls for k in r.kinds)
    head = ["kind", "graphs", "nodes", "partitions", "runs on: nodes in partitions",
            "eager: its ops", "fell back", "compile s"] + (["run ms/call"] if timed else [])
    rows = []
    for k in r.kinds:
        row = [k.kind, len(k.graphs), k.nodes, k.partitions, kind_where(k),
               ops_text(k.eager_ops, 6) if k.eager_nodes else "-", kind_fell_back(k),
               round(k.compile_s, 2)]
        if timed:
            row.append(round(k.run_s / k.calls * 1e3, 3) if k.calls else "-")
        rows.append(row)
    return '<div class="kinds"><p><b>what ran where, per graph kind</b></p>' + \
        _table("kinds", head, rows) + "</div>"


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
        more.append(f"<p>Dynamo: {r.graph_breaks.graphs} graph(s), {r.graph_breaks.breaks} "
                    "graph break(s)</p>")
    if r.advice:
        more.append("<ul>" + "".join(f"<li>{_e(a.message)}</li>" for a in r.advice) + "</ul>")
    out.append(f"<details class=\"about\"><summary>model, versions, advice ({len(r.advice)})"
               f"</summary>{''.join(more)}</details>")
    for g in r.graphs:
        out.append(_graph(r, g, colors, rid))
    out.append("</section>")
    return "".join(out)


_CSS = """
*{box-sizing:border-box}
body{font:13px system-ui,sans-serif;margin:12px;color:#222}
h1{font-size:18px;margin:0 0 6px}h2{font-size:16px;margin:4px 0}h3{font-size:14px;margin:10px 0 4px}
p{margin:3px 0}.summary{font-weight:bold}.warn{color:#b00;overflow-wrap:anywhere}.muted{color:#777}
#bar{position:sticky;top:0;background:#fff;padding:4px 0;z-index:2;display:flex;gap:8px;align-items:center;flex-wrap:wrap}
.reports{display:grid;gap:16px;grid-template-columns:repeat(var(--cols),minmax(0,1fr))}
.report{min-width:0}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;margin:4px 0}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}
svg.partitions{display:block;width:100%;height:24px}
.partition .fell,.fellmark{fill:#d00;color:#d00}
table{border-collapse:collapse;margin:4px 0;width:100%}
td,th{border:1px solid #ddd;padding:1px 5px;text-align:left;vertical-align:top;overflow-wrap:anywhere}
th{background:#f0f0f0}table.sortable th{cursor:pointer}td.num{text-align:right}
table.modules{table-layout:fixed}table.modules td{padding:0 5px;height:18px;line-height:17px}
table.modules th:nth-child(1){width:30%}table.modules th:nth-child(2){width:32%}
table.modules th:nth-child(4){width:16%}.fellmark{font-weight:bold}
.report{container-type:inline-size}
@container (max-width:640px){table.modules .share{display:none}table.modules th:nth-child(1){width:45%}table.modules th:nth-child(4){width:20%}}
td.mod,td.share,td.pids{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
svg.bar{display:block;width:100%;height:12px;margin-top:3px}
.tablewrap{overflow-x:auto;max-width:100%}
details{margin:4px 0}summary{cursor:pointer;font-weight:600}
.viewport{height:60vh;min-height:260px;border:1px solid #ddd;overflow:hidden;position:relative;cursor:grab;touch-action:none}
svg.graph{width:100%;height:100%;display:block}
.unit rect.box{fill:#fff;stroke-width:2}.unit text{font-size:12px;fill:#222;pointer-events:none}
.unit{cursor:pointer}.unit.node rect.box{stroke:#333;stroke-width:.5}.unit.node text{fill:#fff}
.unit.hit rect.box{stroke:#e00;stroke-width:4}.unit.sel rect.box{stroke:#000;stroke-width:3}
.unit.fell rect.box{stroke-dasharray:6 3}
.cluster rect{fill:#f7f7f7;stroke:#aaa;stroke-dasharray:4 3}.cluster text{font-size:11px;fill:#555;cursor:pointer}
.edge{fill:none;stroke:#999;stroke-width:1}
#details{position:fixed;right:12px;top:12px;max-width:380px;background:#fff;border:1px solid #888;padding:8px;white-space:pre-wrap;display:none;z-index:3}
@media (max-width:700px){.reports{grid-template-columns:minmax(0,1fr)}}
"""

# Errors are recorded in an attribute of <html>, so a headless browser's --dump-dom shows
# them (tests assert it stays empty).
_ERRS = """<script>
(function(){var d=document.documentElement;d.setAttribute('data-errors','');
function rec(m){d.setAttribute('data-errors',d.getAttribute('data-errors')+String(m)+'\\n');}
window.onerror=function(m,s,l){rec(m+' @'+l);};
var ce=console.error;console.error=function(){rec(Array.prototype.join.call(arguments,' '));ce.apply(console,arguments);};
})();</script>"""

_JS = r"""<script>
(function(){
var data=JSON.parse(document.getElementById('report-data').textContent);
var COLORS=JSON.parse(document.getElementById('report-colors').textContent);
var NS='http://www.w3.org/2000/svg',TOP='(top level)';
function el(tag,attrs,parent){var e=document.createElementNS(NS,tag);for(var k in attrs)e.setAttribute(k,attrs[k]);if(parent)parent.appendChild(e);return e;}
function color(b){return COLORS[b]||'#9d9d9d';}
function runsOn(p){return p.compiled?p.backend:p.planned_backend;}
var box=document.getElementById('details');box.onclick=function(){box.style.display='none';};

function View(svg){
  var rep=data[+svg.dataset.report],g=null;
  rep.graphs.forEach(function(x){if(x.graph_id==+svg.dataset.graph)g=x;});
  var parts={};g.partitions.forEach(function(p){parts[p.id]=p;});
  var depth=+(svg.closest('.graph-block').querySelector('table.modules th').textContent.match(/depth (\d+)/)||[0,1])[1];
  var open={},st={x:0,y:0,k:1},root=el('g',{},svg),self=this;
  g.graph.forEach(function(n){n._path=n.module?n.module.split('.'):[];});
  function chain(n){  // the open groups around a node, outermost first (dagre clusters)
    var p=n._path,out=[];
    if(!p.length)return open['p:'+n.partition]?['c:p:'+n.partition]:[];
    for(var k=Math.min(depth,p.length);k<=p.length;k++){var m='m:'+p.slice(0,k).join('.');if(!open[m])break;out.push('c:'+m);}
    return out;}
  function unitOf(n,c){  // the box a node is drawn in: a module group, a partition group or itself
    var p=n._path;
    if(!p.length)return c.length?'n:'+n.name:'p:'+n.partition;
    var k=Math.min(depth,p.length)+c.length;
    return k>p.length?'n:'+n.name:'m:'+p.slice(0,k).join('.');}
  this.layout=function(){
    var G=new dagre.graphlib.Graph({compound:true,multigraph:false});
    G.setGraph({rankdir:'TB',nodesep:14,ranksep:26,marginx:10,marginy:10});G.setDefaultEdgeLabel(function(){return{};});
    var units={},of={},q=(document.getElementById('search').value||'').trim().toLowerCase();
    g.graph.forEach(function(n){var c=chain(n),u=unitOf(n,c);of[n.name]=u;var x=units[u]||(units[u]={key:u,nodes:[],by:{},fell:false,hit:0});
      x.nodes.push(n);var b=runsOn(parts[n.partition]);x.by[b]=(x.by[b]||0)+1;if(parts[n.partition].fallbacks.length)x.fell=true;
      if(q&&n.op.toLowerCase().indexOf(q)>=0)x.hit++;
      c.forEach(function(ck,i){if(!G.hasNode(ck)){G.setNode(ck,{label:ck.slice(4),cluster:true});if(i)G.setParent(ck,c[i-1]);}});
      if(c.length)x.parent=c[c.length-1];});
    Object.keys(units).forEach(function(k){var u=units[k],n=u.nodes[0];
      u.label=k.charAt(0)=='n'?n.op.replace(/^aten\./,'').replace(/\.default$/,''):k.charAt(0)=='p'?'#'+n.partition+' '+runsOn(parts[n.partition]):k.slice(2).split('.').slice(-2).join('.');
      u.sub=k.charAt(0)=='n'?'':u.nodes.length+' nodes';
      G.setNode(k,{width:Math.max(90,Math.min(300,14+7.4*Math.max(u.label.length,u.sub.length+10))),height:u.sub?38:24});if(u.parent)G.setParent(k,u.parent);});
    var seen={};g.graph.forEach(function(n){n.inputs.forEach(function(i){var a=of[i],b=of[n.name];if(!a||a==b||seen[a+'>'+b])return;seen[a+'>'+b]=1;G.setEdge(a,b);});});
    dagre.layout(G);
    while(root.firstChild)root.removeChild(root.firstChild);
    G.nodes().forEach(function(k){var v=G.node(k);if(!v||!v.cluster)return;
      var c=el('g',{'class':'cluster','data-cluster':k.slice(2)},root);el('rect',{x:v.x-v.width/2,y:v.y-v.height/2,width:v.width,height:v.height,rx:6},c);
      var t=el('text',{x:v.x-v.width/2+6,y:v.y-v.height/2+12},c);t.textContent='▾ '+v.label+' (close)';t.onclick=function(ev){ev.stopPropagation();delete open[k.slice(2)];self.layout();};});
    G.edges().forEach(function(e){var pts=G.edge(e).points,d='M'+pts.map(function(p){return p.x.toFixed(1)+','+p.y.toFixed(1);}).join('L');el('path',{'class':'edge',d:d},root);});
    var hits=0;
    Object.keys(units).forEach(function(k){var u=units[k],v=G.node(k),x=v.x-v.width/2,y=v.y-v.height/2;hits+=u.hit;
      var isNode=k.charAt(0)=='n',grp=el('g',{'class':'unit'+(isNode?' node':'')+(u.hit?' hit':'')+(u.fell?' fell':''),'data-unit':k},root);
      var main=Object.keys(u.by).sort(function(a,b){return u.by[b]-u.by[a];})[0];
      el('rect',{'class':'box',x:x,y:y,width:v.width,height:v.height,rx:4,style:isNode?'fill:'+color(main):'stroke:'+color(main)},grp);
      if(!isNode){var off=0;Object.keys(u.by).forEach(function(b){var w=(v.width-4)*u.by[b]/u.nodes.length;el('rect',{x:x+2+off,y:y+v.height-8,width:w,height:6,style:'fill:'+color(b)},grp);off+=w;});}
      var t=el('text',{x:x+6,y:y+15},grp);t.textContent=u.label;if(u.sub){var s=el('text',{x:x+6,y:y+28},grp);s.textContent=u.sub+(u.fell?' · fell back':'');}
      var tip=el('title',{},grp);tip.textContent=(k.charAt(0)=='m'?k.slice(2):u.label)+': '+Object.keys(u.by).map(function(b){return b+' '+u.by[b];}).join(', ');
      grp.onclick=function(ev){ev.stopPropagation();if(isNode){show(u.nodes[0]);return;}open[k]=1;self.layout();};});
    self.bounds={w:G.graph().width||1,h:G.graph().height||1};self.hits=hits;apply();
    var counter=document.getElementById('hits');if(counter){var tot=0;views.forEach(function(w){tot+=w.hits||0;});counter.textContent=q?tot+' node(s)':'';counter.dataset.hits=q?tot:'';}
  };
  function show(n){var p=parts[n.partition],o=(g.ops.filter(function(x){return x.op==n.op;})[0])||{};
    var t=n.name+'\nop '+n.op+'\nmodule '+(n.module||TOP)+'\nout '+n.dtype+'['+n.shape.join('x')+']\ninputs '+n.inputs.join(', ')+
      '\npartition #'+p.id+(p.compiled?' on '+p.backend+' (planned '+p.planned_backend+')':' planned for '+p.planned_backend+' (not compiled)')+'\nable: '+(o.able||[]).join(', ');
    for(var b in (o.refused||{}))t+='\nrefused by '+b+': '+o.refused[b];
    p.fallbacks.forEach(function(f){t+='\nfallback at '+f.stage+': '+f.from_backend+' -> '+f.to_backend+': '+f.reason;});
    box.textContent=t;box.style.display='block';}
  function apply(){root.setAttribute('transform','translate('+st.x+','+st.y+') scale('+st.k+')');}
  this.fit=function(){var r=svg.getBoundingClientRect(),W=r.width||800,H=r.height||400;
    st.k=Math.max(0.35,Math.min(1.2,W/self.bounds.w,Math.max(H/self.bounds.h,0.6*W/self.bounds.w)));
    st.x=Math.max(0,(W-self.bounds.w*st.k)/2);st.y=Math.max(0,(H-self.bounds.h*st.k)/2);apply();};
  this.zoom=function(f,cx,cy){var r=svg.getBoundingClientRect();cx=cx===undefined?r.width/2:cx;cy=cy===undefined?r.height/2:cy;
    var k=Math.max(0.05,Math.min(6,st.k*f));st.x=cx-(cx-st.x)*k/st.k;st.y=cy-(cy-st.y)*k/st.k;st.k=k;apply();};
  this.openAll=function(){g.graph.forEach(function(n){for(var k=depth;k<=n._path.length;k++)open['m:'+n._path.slice(0,k).join('.')]=1;open['p:'+n.partition]=1;});self.layout();self.fit();};
  this.closeAll=function(){open={};self.layout();self.fit();};
  svg.addEventListener('wheel',function(ev){ev.preventDefault();var r=svg.getBoundingClientRect();self.zoom(ev.deltaY<0?1.15:1/1.15,ev.clientX-r.left,ev.clientY-r.top);},{passive:false});
  var drag=null;svg.addEventListener('pointerdown',function(ev){drag={x:ev.clientX-st.x,y:ev.clientY-st.y};});
  window.addEventListener('pointermove',function(ev){if(!drag)return;st.x=ev.clientX-drag.x;st.y=ev.clientY-drag.y;apply();});
  window.addEventListener('pointerup',function(){drag=null;});
}
var views=[];
document.querySelectorAll('svg.graph').forEach(function(svg){var v=new View(svg);views.push(v);svg._view=v;v.layout();v.fit();
  var tools=svg.closest('details').querySelector('.tools');
  tools.addEventListener('click',function(ev){var a=ev.target.dataset.act;if(a=='fit')v.fit();if(a=='in')v.zoom(1.25);if(a=='out')v.zoom(0.8);if(a=='open')v.openAll();if(a=='close')v.closeAll();});});
document.querySelectorAll('details.graphview').forEach(function(d){d.addEventListener('toggle',function(){if(d.open){var v=d.querySelector('svg.graph')._view;v.fit();}});});
var q=document.getElementById('search');
q.addEventListener('input',function(){views.forEach(function(v){v.layout();});});
document.querySelectorAll('table.sortable th').forEach(function(th){th.addEventListener('click',function(){
  var tb=th.closest('table').tBodies[0],rows=Array.prototype.slice.call(tb.rows),col=th.cellIndex,asc=th.dataset.asc!='1';
  th.dataset.asc=asc?'1':'0';rows.sort(function(a,b){var x=a.cells[col].dataset.v,y=b.cells[col].dataset.v,nx=parseFloat(x),ny=parseFloat(y);
    var c=(!isNaN(nx)&&!isNaN(ny))?nx-ny:String(x).localeCompare(String(y));return asc?c:-c;});
  rows.forEach(function(r){tb.appendChild(r);});});});
var h=location.hash.match(/search=([^&]*)/);  // a link (or a test) can open a search
if(h){q.value=decodeURIComponent(h[1]);q.dispatchEvent(new Event('input'));}
if(/[#&]open\b/.test(location.hash))views.forEach(function(v){v.openAll();});  // every box opened
function measure(){var d=document.documentElement,ov=document.querySelector('.overview');
  d.setAttribute('data-overflow',Math.max(0,d.scrollWidth-window.innerWidth));
  if(ov){var r=ov.getBoundingClientRect();d.setAttribute('data-overview-bottom',Math.round(r.bottom));d.setAttribute('data-overview-right',Math.round(r.right));}
  var lefts={};document.querySelectorAll('section.report').forEach(function(x){lefts[Math.round(x.getBoundingClientRect().left)]=1;});
  d.setAttribute('data-columns',Object.keys(lefts).length);
  d.setAttribute('data-window',window.innerWidth+'x'+window.innerHeight);}
measure();window.addEventListener('resize',measure);
document.documentElement.setAttribute('data-ready','1');
})();</script>"""


def _dagre() -> str:
    return (importlib.resources.files("arbiter.report") / "vendor" / "dagre.min.js").read_text()


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
            f"<title>{_e(title)}</title>{_ERRS}<style>{_CSS}</style></head><body>"
            f'<div id="bar"><h1>{_e(title)}</h1><input id="search" '
            'placeholder="search ops (e.g. addmm)"> <span id="hits"></span></div>'
            f'<div id="details"></div><div class="reports" style="--cols:{max(len(reports), 1)}">'
            f"{body}</div>"
            f'<script type="application/json" id="report-data">{payload}</script>'
            f'<script type="application/json" id="report-colors">{json.dumps(colors)}</script>'
            f"<script>/* dagre {_DAGRE_VERSION}, MIT license (arbiter/report/vendor/"
            f"dagre.LICENSE) */\n{_dagre()}</script>{_JS}</body></html>")


_DAGRE_VERSION = "1.1.4"
