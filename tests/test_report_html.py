"""The HTML report in a real headless browser (Debian's chromium), offline.

Checks: the page's JS runs without errors (the page records window.onerror and
console.error into <html data-errors>), the SVG has one box per partition, the tables
are sortable, and a screenshot is not blank. Skipped, with the reason, where chromium
is not installed (.ci/run installs it when apt is available).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import arbiter
from arbiter.cli import examples
from arbiter.report.html import COLLAPSE_OVER, render_html

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed "
                                "(apt-get install -y chromium; .ci/run does this)")

# Headless, and no network: nothing to fetch (the page is self-contained) and any DNS
# lookup fails, so a page that tried to reach a CDN would break visibly.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-extensions",
         "--no-first-run", "--no-default-browser-check", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--hide-scrollbars", "--virtual-time-budget=3000"]
OPS = ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor", "aten.t.default",
       "aten.addmm.default"]


def chromium(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def _boom_compile(self, gm, example_inputs):
    raise RuntimeError("boom at compile")


@pytest.fixture
def reports(make_backend, fresh_dynamo):
    """A compiled report with a fallback, and a dry run split 7 ways."""
    make_backend("failing", OPS, compile=_boom_compile)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
    be = arbiter.Arbiter({"backends": ["failing", "onnxruntime"], "min_block_size": 1})
    with torch.no_grad():
        torch.compile(model, backend=be)(torch.randn(2, 8))
    failed = be.report()
    failed.label = "failing first"
    torch._dynamo.reset()
    m, inputs = examples.encoder_block()
    with torch.no_grad():
        split = arbiter.explain(m, *inputs, config={
            "backends": ["onnxruntime", "inductor"], "min_block_size": 1,
            "exclude_ops": ["aten.gelu", "aten.bmm"]})
    split.label = "split"
    return [failed, split]


def test_page_renders_without_errors_one_box_per_partition(reports, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(reports), encoding="utf-8")
    assert "http://" not in page.read_text().replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page.read_text()
    run = chromium("--dump-dom", page.as_uri(), cwd=tmp_path)
    dom = run.stdout
    assert dom, run.stderr[-2000:]
    html_tag = re.search(r"<html[^>]*>", dom).group(0)
    assert 'data-ready="1"' in html_tag, "the page's script did not finish"
    assert re.search(r'data-errors="([^"]*)"', html_tag).group(1) == ""
    parts = sum(len(g.partitions) for r in reports for g in r.graphs)
    assert parts == 1 + 7
    assert dom.count('class="partition-box"') == parts
    # the failed backend is named as the fallback's source, never as what ran
    assert re.findall(r'class="partition fell-back" data-partition="0" data-backend="(\w+)"',
                      dom) == ["onnxruntime"]
    assert 'data-backend="failing"' not in dom
    # the op table says who ran the ops: onnxruntime
    assert '<td data-v="failing 2">' not in dom and '<td data-v="onnxruntime 2">' in dom
    assert "compile: failing -&gt; onnxruntime: RuntimeError: boom at compile" in dom


def test_search_by_op_highlights_matching_nodes(reports, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(reports), encoding="utf-8")
    dom = chromium("--dump-dom", page.as_uri() + "#search=addmm", cwd=tmp_path).stdout
    expected = sum(o.nodes for r in reports for g in r.graphs for o in g.ops
                   if "addmm" in o.op)
    assert expected == 2 + 4
    assert dom.count('class="node hit"') == expected
    assert re.search(r'data-errors="([^"]*)"', dom).group(1) == ""


def test_screenshot_is_not_blank(reports, tmp_path):
    pil = pytest.importorskip("PIL.Image", reason="Pillow (test extra) missing")
    page = tmp_path / "report.html"
    page.write_text(render_html(reports), encoding="utf-8")
    shot = tmp_path / "shot.png"
    run = chromium("--window-size=1200,900", f"--screenshot={shot}", page.as_uri(), cwd=tmp_path)
    assert shot.is_file(), run.stderr[-2000:]
    img = pil.open(shot).convert("RGB")
    assert img.size == (1200, 900)
    colors = img.getcolors(maxcolors=1 << 20)
    assert len(colors) > 50  # text, boxes, colored nodes; a blank page has one color
    # the backends' node colors are on screen (the graph drew): onnxruntime is the
    # first palette color, #4e79a7
    assert any(c == (0x4E, 0x79, 0xA7) for _, c in colors)


def test_large_graph_starts_collapsed_and_stays_light():
    # a chain of 2,000 nodes over 2 backends: partitions start collapsed
    from arbiter.report import GraphReport, NodeReport, PartitionReport, Report

    nodes, parts = [], []
    for k in range(40):
        names = [f"n{k}_{i}" for i in range(50)]
        parts.append(PartitionReport(id=k, planned_backend="a" if k % 2 else "b",
                                     compiled=True, backend="a" if k % 2 else "b", nodes=50,
                                     ops={"aten.add.Tensor": 50}, node_names=names, chain=["a"]))
        prev = nodes[-1].name if nodes else "input:x"
        for name in names:
            nodes.append(NodeReport(name=name, op="aten.add.Tensor", partition=k, inputs=[prev]))
            prev = name
    rep = Report(graphs=[GraphReport(graph_id=0, kind="inference", nodes=2000,
                                     partitions=parts, graph=nodes)])
    page = render_html(rep)
    assert len(nodes) > COLLAPSE_OVER
    assert page.count('class="partition collapsed"') == 40
    assert page.count('class="partition-box"') == 40
