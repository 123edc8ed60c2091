"""The overview of one graph on the HTML page, and its module groups.

Drawn in Python, sized in percent so it fits any width. Several backends: a strip with
one box per partition (width by nodes, colored by the backend that runs it, a red mark
where it fell back) and one row per module group with a bar of the backends that run
its nodes. One backend for every node: those bars would all be one full bar, so the rows
show instead how the graph's nodes spread over its modules, and a section says where the
time goes per partition when the calls were timed (or that they were not, and how to
time them). Module groups (``module_groups``) are the module paths of Dynamo's
``nn_module_stack`` cut at the deepest level with at most ``MAX_GROUPS`` groups, in
model order.
"""
from __future__ import annotations

import html
import statistics
from collections import defaultdict

from .cells import plural
from .model import GraphReport, Report

#: Most module groups an overview shows (rows); deeper paths are cut to fit.
MAX_GROUPS = 32
FALLBACK_COLOR = "#9d9d9d"
TOP = "(top level)"


def esc(x: object) -> str:
    return html.escape(str(x), quote=True)


def module_groups(g: GraphReport, max_groups: int = MAX_GROUPS) -> tuple[int, list[tuple[str, list]]]:
    """(depth, [(module path cut at that depth, its nodes in graph order)]): the deepest
    cut with at most ``max_groups`` groups (at least depth 1), in model order (``TOP``,
    the nodes outside any module, last)."""
    paths = [tuple(n.module.split(".")) if n.module else () for n in g.graph]
    deepest = max((len(p) for p in paths), default=0)
    depth = 1
    for d in range(1, deepest + 1):
        if len({p[:d] for p in paths}) <= max_groups:
            depth = d
        else:
            break
    groups: dict[str, list] = {}
    index: dict[str, list[int]] = {}
    for k, (n, p) in enumerate(zip(g.graph, paths)):
        key = ".".join(p[:depth]) if p else TOP
        groups.setdefault(key, []).append(n)
        index.setdefault(key, []).append(k)
    return depth, [(key, groups[key]) for key in model_order(index)]


def model_order(index: dict[str, list[int]]) -> list[str]:
    """Module paths in model order: the module tree walked parent first (as
    ``named_modules()`` lists it), siblings by where the bulk of their subtree's nodes
    sits in the graph (the median position: a few nodes a module contributes early, a
    mask hoisted to the graph's top, do not move it), ``TOP`` last.

    ``index``: path -> the graph positions of its nodes."""
    subtree: dict[tuple, list[int]] = defaultdict(list)
    for path, positions in index.items():
        if path == TOP:
            continue
        parts = tuple(path.split("."))
        for k in range(1, len(parts) + 1):
            subtree[parts[:k]].extend(positions)
    children: dict[tuple, list[tuple]] = defaultdict(list)
    for prefix in subtree:
        children[prefix[:-1]].append(prefix)
    order: list[str] = []

    def visit(prefix: tuple) -> None:
        if ".".join(prefix) in index:
            order.append(".".join(prefix))
        for child in sorted(children[prefix],
                            key=lambda c: (statistics.median(subtree[c]), min(subtree[c]))):
            visit(child)

    visit(())
    return order + ([TOP] if TOP in index else [])


def strip(g: GraphReport, colors: dict[str, str], rid: int) -> str:
    """One box per partition, widths by nodes, in plan order; fallbacks marked."""
    total = sum(max(p.nodes, 1) for p in g.partitions) or 1
    unit = 1000.0 / total
    x = 0.0
    out = [f'<svg class="partitions" viewBox="0 0 1000 24" preserveAspectRatio="none" '
           f'data-report="{rid}" data-graph="{g.graph_id}" role="img" '
           f'aria-label="partitions in plan order">']
    for p in g.partitions:
        w = max(p.nodes, 1) * unit
        b = p.runs_on
        fell = " fell-back" if p.fallbacks else ""
        tip = (f"#{p.id} {b}{'' if p.compiled else ' (plan)'}: {plural(p.nodes, 'node')}"
               + "".join(f"; fell back at {f.stage}: {f.from_backend} -> {f.to_backend}: "
                         f"{f.reason}" for f in p.fallbacks))
        out.append(f'<g class="partition{fell}" data-partition="{p.id}" data-backend="{esc(b)}" '
                   f'data-nodes="{p.nodes}"><rect class="partition-box" x="{x:.3f}" y="2" '
                   f'width="{w:.3f}" height="20" style="fill:{colors.get(b, FALLBACK_COLOR)}"/>'
                   + (f'<rect class="fell" x="{x:.3f}" y="0" width="{w:.3f}" height="4"/>'
                      if p.fallbacks else "") + f"<title>{esc(tip)}</title></g>")
        x += w
    out.append("</svg>")
    return "".join(out)


def bar(shares: dict[str, float], colors: dict[str, str], total: float = 0.0,
        unit: str = "node") -> str:
    """A bar of ``shares`` (name -> amount) out of ``total`` (their sum when 0)."""
    total = total or sum(shares.values()) or 1
    x = 0.0
    rects = []
    for b, n in shares.items():
        w = 100.0 * n / total
        amount = plural(n, unit) if isinstance(n, int) else f"{n:.3f} {unit}"
        rects.append(f'<rect x="{x:.3f}" y="0" width="{w:.3f}" height="10" '
                     f'style="fill:{colors.get(b, FALLBACK_COLOR)}"><title>{esc(b)}: '
                     f'{esc(amount)}</title></rect>')
        x += w
    return ('<svg class="bar" viewBox="0 0 100 10" preserveAspectRatio="none">'
            + "".join(rects) + "</svg>")


def node_counts(g: GraphReport) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in g.partitions:
        b = p.runs_on
        out[b] = out.get(b, 0) + p.nodes
    return out


def span(pids: list[int]) -> str:
    """The partitions a module's nodes are in: each of up to three (``#1, #7``), a range
    only where it holds every one (``#3–#9``), else how many of which range (``5 of
    #1–#30``: "#1–#7 (2)" read as seven)."""
    ids = sorted(set(pids))
    if len(ids) <= 3:
        return ", ".join(f"#{i}" for i in ids)
    whole = f"#{ids[0]}–#{ids[-1]}"
    return whole if ids[-1] - ids[0] + 1 == len(ids) else f"{len(ids)} of {whole}"


def overview(r: Report, g: GraphReport, colors: dict[str, str], rid: int) -> str:
    parts = {p.id: p for p in g.partitions}
    order = [b.name for b in r.backends]
    counts = node_counts(g)
    one = next(iter(counts)) if len(counts) == 1 else None
    depth, groups = module_groups(g)
    largest = max((len(nodes) for _, nodes in groups), default=1)
    rows = []
    for path, nodes in groups:
        by: dict[str, int] = {}
        pids: list[int] = []
        for n in nodes:
            b = parts[n.partition].runs_on
            by[b] = by.get(b, 0) + 1
            if n.partition not in pids:
                pids.append(n.partition)
        by = dict(sorted(by.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order
                         else len(order)))
        fell = [parts[i] for i in pids if parts[i].fallbacks]
        if one:  # every bar would be one full bar: how the nodes spread instead
            share = f"{plural(len(nodes), 'node')}, {len(nodes) * 100 // (g.nodes or 1)}%"
            drawn = bar(by, colors, total=largest)
        else:
            share = " · ".join(f"{b} {n * 100 // len(nodes)}%" for b, n in by.items())
            drawn = bar(by, colors)
        warn = (f'<span class="fellmark" title="{esc("; ".join(f"#{p.id}: {f.from_backend} -> {f.to_backend} at {f.stage}: {f.reason}" for p in fell for f in p.fallbacks))}">'
                f"⚠{len(fell)} </span>") if fell else ""
        rows.append(f'<tr class="module{" fell" if fell else ""}" data-module="{esc(path)}">'
                    f'<td class="mod" title="{esc(path)}">{warn}{esc(path)}</td>'
                    f'<td class="barcell" title="{esc(share)}">{drawn}</td>'
                    f'<td class="share">{esc(share)}</td><td class="pids" title="'
                    f'{esc(", ".join(f"#{i}" for i in sorted(pids)))}">{span(pids)}</td></tr>')
    falls = sum(len(p.fallbacks) for p in g.partitions)
    tail = plural(len(g.partitions), "partition") + \
        (f" · {plural(falls, 'fallback')}" if falls else "")
    if one:
        legend = (f'<span><i style="background:{colors.get(one, FALLBACK_COLOR)}"></i>every '
                  f'node on {esc(one)}{"" if all(p.compiled for p in g.partitions) else " (plan)"}'
                  f'</span><span class="muted">{plural(g.nodes, "node")} · {tail}</span>')
        head = ("nodes", "share of the graph")
    else:
        legend = "".join(
            f'<span><i style="background:{colors.get(b, FALLBACK_COLOR)}"></i>{esc(b)} '
            f'{n}</span>' for b, n in counts.items()) + f'<span class="muted">nodes · {tail}</span>'
        head = ("backends", "share")
    return (f'<div class="overview{" one-backend" if one else ""}" data-report="{rid}" '
            f'data-graph="{g.graph_id}"><div class="legend">{legend}</div>'
            + strip(g, colors, rid)
            + (time_section(r, g, colors) if one or any(p.calls for p in g.partitions) else "")
            + f'<table class="modules"><thead><tr><th>module (depth {depth})</th><th>{head[0]}'
            f'</th><th class="share">{head[1]}</th><th>partitions</th></tr></thead><tbody>'
            f"{''.join(rows)}"
            "</tbody></table></div>")


def time_section(r: Report, g: GraphReport, colors: dict[str, str]) -> str:
    """Where the time of a call goes, per partition, when the calls were timed; else a
    line saying they were not, and how to time them."""
    timed = [p for p in g.partitions if p.calls]
    if not timed:
        how = ("`arbiter report MODEL --time 50` (or Arbiter.set_timing) times each "
               "partition's calls")
        why = (f"a dry run, nothing ran; {how}" if r.dry_run else
               "its partitions run inline (ATen nodes in the stitched graph), not timed "
               "apart" if all(p.inline for p in g.partitions) else f"calls not timed; {how}")
        return f'<p class="time muted" data-timed="0">where the time goes: not measured; {why}</p>'
    per_call = {p.id: p.run_s / p.calls * 1e3 for p in timed}
    call_ms = (r.timing.total_s / r.timing.calls * 1e3 if r.timing and r.timing.calls
               else sum(per_call.values()))
    rows = []
    for p in sorted(timed, key=lambda p: -per_call[p.id]):
        ms = per_call[p.id]
        rows.append(f'<tr data-partition="{p.id}"><td>#{p.id} {esc(p.runs_on)}</td>'
                    f'<td class="barcell">{bar({p.runs_on: ms}, colors, call_ms, "ms")}</td>'
                    f'<td class="num">{ms:.3f} ms</td><td class="num">'
                    f'{ms / (call_ms or 1):.0%}</td></tr>')
    rest = (f"; the rest of a call ({max(call_ms - sum(per_call.values()), 0):.3f} ms): inline "
            "eager partitions, stitching, Dynamo's guards") if r.timing else ""
    return (f'<div class="time" data-timed="1"><p><b>where the time goes</b>: '
            f'{call_ms:.3f} ms per call{esc(rest)}</p><table class="time"><thead><tr>'
            f'<th>partition</th><th>time per call</th><th>ms</th><th>share</th></tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></div>")
