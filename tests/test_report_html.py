"""The HTML report in a real headless browser (Debian's chromium), offline.

Checks: the page's JS (with the vendored dagre) runs without errors (the page records
window.onerror and console.error into <html data-errors>), the overview has one box per
partition, search counts nodes, and, for a BERT-base-sized report (503 nodes, 74
partitions, 12 layers) and a tiny one at 1400 and 800 px wide: the page does not overflow
sideways and the first overview is on screen without scrolling; side by side, no table
row is taller than 80 px nor any table wider than its column; a model's functional ops
between its modules draw as a chain, not a star. Screenshots are kept
where $ARBITER_SCREENSHOTS points (to look at them). Skipped, with the reason, where
chromium is not installed (.ci/run installs it when apt is available).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch

import arbiter
from arbiter.cli import examples
from arbiter.report import (BackendStatus, FallbackReport, GraphReport,
                            NodeReport, PartitionReport, Report)
from arbiter.report.html import MAX_GROUPS, backend_colors, module_groups, render_html
from arbiter.report.model import FirstUseReport, OpReport
from arbiter.report.overview import span

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed "
                                    "(apt-get install -y chromium; .ci/run does this)")

# Headless, and no network: nothing to fetch (the page is self-contained) and any DNS
# lookup fails, so a page that tried to reach a CDN would break visibly.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-extensions",
         "--no-first-run", "--no-default-browser-check", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--hide-scrollbars", "--virtual-time-budget=5000"]
OPS = ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor", "aten.t.default",
       "aten.addmm.default"]
COLORS = {"onnxruntime": "#4e79a7", "inductor": "#f28e2b", "eager": "#9d9d9d"}


def chromium(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, *args], capture_output=True, text=True,
                          timeout=180, cwd=cwd)


def _html_attrs(dom: str) -> dict[str, str]:
    tag = re.search(r"<html[^>]*>", dom).group(0)
    return dict(re.findall(r'([\w-]+)="([^"]*)"', tag))


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


def bert_base_sized(label: str = "bert-base-sized", order=("onnxruntime", "inductor")) -> Report:
    """A report shaped like BERT-base's (503 nodes, 74 partitions, 12 layers, a fallback),
    built directly: the browser test needs the shape, not a 30 s trace."""
    layer_ops = [("attention.self.query", "aten.addmm.default"), ("attention.self.key",
                 "aten.addmm.default"), ("attention.self.value", "aten.addmm.default"),
                 ("attention.self", "aten.bmm.default"), ("attention.self", "aten._softmax.default"),
                 ("attention.self", "aten.bmm.default"), ("attention.output.dense", "aten.addmm.default"),
                 ("attention.output.LayerNorm", "aten.native_layer_norm.default"),
                 ("intermediate.dense", "aten.addmm.default"),
                 ("intermediate.intermediate_act_fn", "aten.gelu.default"),
                 ("output.dense", "aten.addmm.default"),
                 ("output.LayerNorm", "aten.native_layer_norm.default")]
    nodes: list[NodeReport] = []
    prev = "input:x"
    for i in range(5):
        nodes.append(NodeReport(name=f"emb{i}", op="aten.embedding.default", partition=-1,
                                inputs=[prev], module="embeddings.word_embeddings"))
        prev = f"emb{i}"
    for layer in range(12):
        for k in range(41):
            mod, op = layer_ops[k % len(layer_ops)]
            name = f"l{layer}_{k}"
            nodes.append(NodeReport(name=name, op=op, partition=-1, inputs=[prev],
                                    module=f"encoder.layer.{layer}.{mod}", shape=[1, 128, 768],
                                    dtype="float32"))
            prev = name
    for i in range(6):
        nodes.append(NodeReport(name=f"pool{i}", op="aten.tanh.default", partition=-1,
                                inputs=[prev], module="pooler.dense" if i < 4 else ""))
        prev = f"pool{i}"
    assert len(nodes) == 503
    # 74 partitions alternating backends, eager every third
    cuts = [round(k * len(nodes) / 74) for k in range(75)]
    parts = []
    for pid in range(74):
        backend = "eager" if pid % 3 == 2 else order[pid % 3]
        members = nodes[cuts[pid]:cuts[pid + 1]]
        for n in members:
            n.partition = pid
        fell = [FallbackReport(from_backend="onnxruntime", to_backend="eager", stage="compile",
                               reason="RuntimeError: boom")] if pid == 37 else []
        parts.append(PartitionReport(
            id=pid, planned_backend="onnxruntime" if pid == 37 else backend, compiled=True,
            backend=backend, nodes=len(members), ops={"aten.addmm.default": len(members)},
            node_names=[n.name for n in members], chain=[backend, "eager"], fallbacks=fell))
    g = GraphReport(graph_id=0, kind="inference", model="BertModel", nodes=503,
                    partitions=parts, graph=nodes)
    return Report(label=label, model="bert_base", backends=[
        BackendStatus(name=b, available=True, color=COLORS[b]) for b in (*order, "eager")],
        graphs=[g])


def test_module_groups_fit_one_screen():
    depth, groups = module_groups(bert_base_sized().graphs[0])
    assert depth == 3 and len(groups) <= MAX_GROUPS
    assert [p for p, _ in groups][:3] == ["embeddings.word_embeddings", "encoder.layer.0",
                                          "encoder.layer.1"]
    assert groups[-1][0] == "(top level)"


def test_backend_colors_are_fixed_across_files():
    """Before: colors followed config order (ONNX Runtime orange in one file, blue in the
    other)."""
    a = bert_base_sized(order=("onnxruntime", "inductor"))
    b = bert_base_sized(order=("inductor", "onnxruntime"))
    assert backend_colors([a])["onnxruntime"] == backend_colors([b])["onnxruntime"] == "#4e79a7"
    # a backend without a color of its own gets one from its name, the same everywhere
    x = Report(backends=[BackendStatus(name="mine", available=True),
                         BackendStatus(name="eager", available=True)])
    y = Report(backends=[BackendStatus(name="other", available=True),
                         BackendStatus(name="mine", available=True),
                         BackendStatus(name="eager", available=True)])
    assert backend_colors([x])["mine"] == backend_colors([y])["mine"]


@needs_chromium
def test_page_renders_without_errors_one_box_per_partition(reports, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(reports), encoding="utf-8")
    text = page.read_text()
    # nothing to load: no external script, style, image or font (URLs in the vendored
    # library's comments are text); the browser runs with every host unresolvable
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|@import|url\(\s*["']?https?:""",
                         text, re.I)
    run = chromium("--dump-dom", page.as_uri(), cwd=tmp_path)
    dom = run.stdout
    assert dom, run.stderr[-2000:]
    attrs = _html_attrs(dom)
    assert attrs.get("data-ready") == "1", "the page's script did not finish"
    assert attrs["data-errors"] == ""
    parts = sum(len(g.partitions) for r in reports for g in r.graphs)
    assert parts == 1 + 7
    assert dom.count('class="partition-box"') == parts
    # the failed backend is named as the fallback's source, never as what ran
    assert re.findall(r'class="partition fell-back" data-partition="0" data-backend="(\w+)"',
                      dom) == ["onnxruntime"]
    assert 'data-backend="failing"' not in dom
    # the op table says who ran the ops: onnxruntime
    assert 'data-v="failing 2"' not in dom and 'data-v="onnxruntime 2"' in dom
    assert "compile: failing -&gt; onnxruntime: RuntimeError: boom at compile" in dom
    # the graphs were laid out (dagre) into boxes, one per module group or node
    assert dom.count('class="unit') >= 2


@needs_chromium
def test_search_by_op_counts_matching_nodes(reports, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(reports), encoding="utf-8")
    dom = chromium("--dump-dom", page.as_uri() + "#search=addmm", cwd=tmp_path).stdout
    expected = sum(o.nodes for r in reports for g in r.graphs for o in g.ops
                   if "addmm" in o.op)
    assert expected == 2 + 4
    assert re.search(r'id="hits" data-hits="(\d+)"', dom).group(1) == str(expected)
    assert 'class="unit hit' in dom or 'class="unit node hit' in dom
    assert _html_attrs(dom)["data-errors"] == ""


@needs_chromium
def test_opening_every_box_draws_every_node(reports, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(reports), encoding="utf-8")
    closed = chromium("--dump-dom", page.as_uri(), cwd=tmp_path).stdout
    dom = chromium("--dump-dom", page.as_uri() + "#open", cwd=tmp_path).stdout
    assert _html_attrs(dom)["data-errors"] == ""
    nodes = sum(len(g.graph) for r in reports for g in r.graphs)
    assert len(re.findall(r'data-unit="n:', dom)) == nodes
    assert len(re.findall(r'data-unit="n:', closed)) < nodes
    assert 'class="cluster"' in dom  # opened modules are drawn around their nodes


@needs_chromium
@pytest.mark.parametrize("width", [1400, 800])
@pytest.mark.parametrize("which", ["bert-base-sized", "tiny", "two configs"])
def test_page_fits_the_window_and_overview_is_on_screen(which, width, reports, tmp_path):
    """Before: BERT-base's graph was one strip 45,944 px wide, and at 800 px the
    partition table overflowed."""
    if which == "bert-base-sized":
        rep = [bert_base_sized()]
    elif which == "tiny":
        rep = reports[:1]
    else:
        rep = [bert_base_sized("onnxruntime first"),
               bert_base_sized("inductor first", order=("inductor", "onnxruntime"))]
    page = tmp_path / "report.html"
    page.write_text(render_html(rep), encoding="utf-8")
    run = chromium(f"--window-size={width},900", "--dump-dom", page.as_uri(), cwd=tmp_path)
    attrs = _html_attrs(run.stdout)
    assert attrs["data-errors"] == "" and attrs["data-ready"] == "1"
    assert attrs["data-window"].startswith(f"{width}x")
    assert int(attrs["data-overflow"]) == 0, "the page is wider than the window"
    assert int(attrs["data-overview-bottom"]) <= 900, "the overview needs scrolling"
    assert int(attrs["data-overview-right"]) <= width
    if which == "two configs" and width == 1400:
        assert attrs["data-columns"] == "2", "configs are not side by side"
    shot = tmp_path / f"{which.replace(' ', '-')}-{width}.png"
    chromium(f"--window-size={width},900", f"--screenshot={shot}", page.as_uri(), cwd=tmp_path)
    assert shot.is_file()
    keep = os.environ.get("ARBITER_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)
    pil = pytest.importorskip("PIL.Image", reason="Pillow (test extra) missing")
    img = pil.open(shot).convert("RGB")
    assert img.size == (width, 900)
    colors = {c for _, c in img.getcolors(maxcolors=1 << 20)}
    assert len(colors) > 50  # text, bars, boxes: a blank page has one color
    assert (0x4E, 0x79, 0xA7) in colors  # onnxruntime's own color is on screen


@needs_chromium
def test_large_graph_without_modules_is_grouped_by_partition(tmp_path):
    """2,000 nodes, no module paths: one box per partition until opened."""
    nodes, parts = [], []
    for k in range(40):
        names = [f"n{k}_{i}" for i in range(50)]
        parts.append(PartitionReport(id=k, planned_backend="onnxruntime" if k % 2 else "eager",
                                     compiled=True, backend="onnxruntime" if k % 2 else "eager",
                                     nodes=50, ops={"aten.add.Tensor": 50}, node_names=names,
                                     chain=["eager"]))
        prev = nodes[-1].name if nodes else "input:x"
        for name in names:
            nodes.append(NodeReport(name=name, op="aten.add.Tensor", partition=k, inputs=[prev]))
            prev = name
    rep = Report(backends=[BackendStatus(name="onnxruntime", available=True, color="#4e79a7"),
                           BackendStatus(name="eager", available=True)],
                 graphs=[GraphReport(graph_id=0, kind="inference", nodes=2000,
                                     partitions=parts, graph=nodes)])
    page = tmp_path / "big.html"
    text = render_html(rep)
    assert len(text) < 600_000  # the nodes are data, not 2,000 drawn SVG groups
    page.write_text(text, encoding="utf-8")
    dom = chromium("--dump-dom", page.as_uri(), cwd=tmp_path).stdout
    assert _html_attrs(dom)["data-errors"] == ""
    assert dom.count('class="partition-box"') == 40
    assert len(re.findall(r'class="unit[^"]*" data-unit="p:\d+"', dom)) == 40


# -- issue 30: tables that keep their words, model order, one-backend pages ----------------
def _resnet18_report() -> Report:
    """ResNet-18 (transformers' ResNet, basic blocks 2-2-2-2; the same network as
    torchvision's, which is not installed here) at 1x3x224x224, for inference: one
    partition whose inputs are the image and 100 frozen weights."""
    pytest.importorskip("transformers", reason="ResNet-18 is built with transformers")
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(0)
    cfg = ResNetConfig(depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                       layer_type="basic", embedding_size=64)
    model = examples._HFOutput(ResNetModel(cfg), "pixel_values", "pooler_output").eval()
    with torch.no_grad():
        rep = arbiter.explain(model, torch.randn(1, 3, 224, 224))
    rep.model = "resnet18"
    return rep


def _two_configs_training() -> list[Report]:
    """`arbiter report mlp --train --config default --config cpu_all`, planned."""
    out = []
    for config in ("default", "cpu_all"):
        m, inputs = examples.mlp()
        rep = arbiter.explain(m.train(), *inputs, config=config)
        rep.label = config
        out.append(rep)
    return out


def _measured(page: Path, width: int, tmp_path: Path) -> dict[str, str]:
    """The page's measurements of itself at ``width``, its table sections opened."""
    run = chromium(f"--window-size={width},900", "--dump-dom", page.as_uri() + "#tables",
                   cwd=tmp_path)
    return _html_attrs(run.stdout)


@needs_chromium
@pytest.mark.parametrize("which", ["resnet18", "two configs, training",
                                   "two bert-base-sized"])
def test_no_column_is_narrower_than_its_headers_longest_word(which, tmp_path, fresh_dynamo):
    """Before: at 1400 px the ResNet-18 partitions table listed every frozen weight in its
    inputs cell and squeezed the other columns to 1-2 letters ("on nx ru nti m e"), and
    side-by-side pages wrapped headers and short cells mid-word ("gra phs", "forw ard")."""
    if which == "resnet18":
        reports = [_resnet18_report()]
    elif which == "two configs, training":
        reports = _two_configs_training()
    else:
        reports = [bert_base_sized("onnxruntime first"),
                   bert_base_sized("inductor first", order=("inductor", "onnxruntime"))]
    page = tmp_path / "report.html"
    text = render_html(reports)
    page.write_text(text, encoding="utf-8")
    if which == "resnet18":  # the inputs cell says what the text report says
        (part,) = reports[0].graphs[0].partitions
        assert len(part.inputs) == 101
        assert re.search(r'<td data-v="1x3x224x224 \+100 -&gt; [\dx]+" title="in: '
                         r'float32\[1x3x224x224\] const', text)
    attrs = _measured(page, 1400, tmp_path)
    assert attrs["data-errors"] == "" and attrs["data-ready"] == "1"
    assert attrs["data-columns"] == str(len(reports))
    assert attrs["data-narrow-headers"] == "", "headers wrapped inside a word"
    assert attrs["data-narrow-cells"] == "", "short cells wrapped inside a word"
    assert int(attrs["data-overflow"]) == 0


def test_module_rows_are_in_model_order():
    """Before: the rows followed the first node of each module in the graph, so a module
    whose mask or constant was hoisted to the graph's top came first (GPT-2: model,
    model.h.0.attn, model.h.1.attn, model.wte, ...)."""
    def node(name, module):
        return NodeReport(name=name, op="aten.add.Tensor", partition=0, inputs=[],
                          module=module)

    order = ["", "m.h.0.attn", "m.h.1.attn", "m", "m.wte", "m.wpe"]  # hoisted first
    order += ["m.h.0.ln", "m.h.0.attn", "m.h.0.attn", "m.h.0", "m.h.0.mlp"]
    order += ["m.h.1.ln", "m.h.1.attn", "m.h.1.attn", "m.h.1", "m.h.1.mlp", "m.ln_f", ""]
    g = GraphReport(graph_id=0, kind="inference", nodes=len(order),
                    partitions=[PartitionReport(id=0, planned_backend="eager", compiled=True,
                                                backend="eager", nodes=len(order),
                                                ops={}, node_names=[], chain=["eager"])],
                    graph=[node(f"n{k}", mod) for k, mod in enumerate(order)])
    _, groups = module_groups(g)
    assert [p for p, _ in groups] == [
        "m", "m.wte", "m.wpe", "m.h.0", "m.h.0.ln", "m.h.0.attn", "m.h.0.mlp",
        "m.h.1", "m.h.1.ln", "m.h.1.attn", "m.h.1.mlp", "m.ln_f", "(top level)"]
    assert sum(len(nodes) for _, nodes in groups) == len(order)


def test_gpt2_module_rows_in_model_order(fresh_dynamo):
    pytest.importorskip("transformers", reason="gpt2_tiny needs transformers")
    m, inputs = examples.gpt2_tiny()
    with torch.no_grad():
        rep = arbiter.explain(m, *inputs)
    _, groups = module_groups(rep.graphs[0])
    paths = [p for p, _ in groups]
    assert paths[:3] == ["model", "model.wte", "model.wpe"], paths
    first = {p: k for k, p in enumerate(paths)}
    assert first["model.h.0.attn"] < first["model.h.0.mlp.c_fc"] < first["model.h.1.ln_1"]
    assert first["model.h.1.attn"] < first["model.ln_f"]


def _one_backend(calls: int, timing: bool) -> Report:
    nodes = [NodeReport(name=f"n{k}", op="aten.addmm.default", partition=k // 3, inputs=[],
                        module=f"layer{k // 2}") for k in range(6)]
    parts = [PartitionReport(id=k, planned_backend="onnxruntime", compiled=True,
                             backend="onnxruntime", nodes=3, ops={"aten.addmm.default": 3},
                             node_names=[], chain=["onnxruntime", "eager"], calls=calls,
                             run_s=calls * (k + 1) * 1e-3) for k in range(2)]
    from arbiter.report import TimingReport

    return Report(backends=[BackendStatus(name="onnxruntime", available=True, color="#4e79a7"),
                            BackendStatus(name="eager", available=True)],
                  graphs=[GraphReport(graph_id=0, kind="inference", nodes=6, partitions=parts,
                                      graph=nodes)],
                  timing=TimingReport(calls=calls, total_s=calls * 4e-3, pieces_s=calls * 3e-3)
                  if timing else None)


def test_one_backend_page_shows_where_the_time_goes():
    """Before: one backend for every node drew a page of identical full bars."""
    timed = render_html(_one_backend(calls=10, timing=True))
    assert "every node on onnxruntime" in timed and 'class="overview one-backend"' in timed
    assert "where the time goes</b>: 4.000 ms per call" in timed
    rows = re.findall(r'<tr data-partition="(\d)"><td>#\d onnxruntime</td>.*?'
                      r'<td class="num">([\d.]+) ms</td><td class="num">(\d+)%</td>', timed)
    assert rows == [("1", "2.000", "50"), ("0", "1.000", "25")]  # slowest first
    assert "layer1" in timed and "2 nodes, 33%" in timed  # how the nodes spread
    untimed = render_html(_one_backend(calls=0, timing=False))
    assert "where the time goes: not measured; calls not timed; `arbiter report MODEL " \
           "--time 50`" in untimed
    dry = _one_backend(calls=0, timing=False)
    dry.dry_run = True
    assert "not measured; a dry run, nothing ran" in render_html(dry)
    several = render_html(bert_base_sized())  # several backends: the bars of backends
    assert "one-backend" not in several and "where the time goes" not in several


def test_counts_are_singular_or_plural():
    rep = _one_backend(calls=0, timing=False)
    rep.graphs[0].nodes = 1
    page = render_html(rep)
    assert "1 node," in page and "1 nodes" not in page
    from arbiter.report.text import plain

    text = plain(rep)
    assert "1 node, 2 partitions, 0 constant weights" in text and "1 nodes" not in text
    assert rep.summary().startswith("1 graph, 2 partitions;")


# -- the rough edges a new user hits: row heights, boxes outside modules, spans -------------
def test_a_modules_partitions_read_as_what_they_are():
    """Before: a module in partitions #1 and #7 read "#1–#7 (2)", a range of seven."""
    assert span([7, 1, 7]) == "#1, #7"
    assert span([3, 4, 5, 6]) == "#3–#6"  # a range only where it holds every one
    assert span([1, 4, 7, 30]) == "4 of #1–#30"
    nodes = [NodeReport(name=f"n{k}", op="aten.relu.default", partition=pid, inputs=[],
                        module=mod) for k, (pid, mod) in enumerate(
                            [(0, "a"), (1, "b"), (2, "c"), (3, "a")])]
    parts = [PartitionReport(id=k, planned_backend=b, compiled=True, backend=b, nodes=1,
                             ops={"aten.relu.default": 1}, node_names=[f"n{k}"],
                             chain=[b, "eager"])
             for k, b in enumerate(["onnxruntime", "eager", "onnxruntime", "eager"])]
    rep = Report(backends=[BackendStatus(name=b, available=True, color=COLORS[b])
                           for b in ("onnxruntime", "eager")],
                 graphs=[GraphReport(graph_id=0, kind="inference", nodes=4, partitions=parts,
                                     graph=nodes)])
    row = re.search(r'<tr class="module" data-module="a">.*?</tr>', render_html(rep)).group(0)
    assert row.endswith('<td class="pids" title="#0, #3">#0, #3</td></tr>')


#: A refusal as long as a real one (small_cnn's forward under `default`, training).
REFUSAL = ("output 1 is used and openvino computes it wrongly (probe: float32: "
           "nn.functional.batch_norm, forward graph: fails when returned for the backward: "
           "compile: RuntimeError: OpenVINO could not convert the partition: Conversion is "
           "failed for: <built-in function getitem>, S)")


def _checked(rep: Report) -> Report:
    """``rep`` with what a compiled run records per partition (verify's check, a first-use
    check of its ops, the times measured per backend) and an op refused at length."""
    rep.graphs[0].ops = [OpReport(op="aten._native_batch_norm_legit_functional.default",
                                  nodes=2, able=["onnxruntime", "inductor", "eager"],
                                  placed={"onnxruntime": 2}, refused={"openvino": REFUSAL})]
    for p in rep.graphs[0].partitions:
        ops = [f"{op} float32 (verified: declared)" for op in OPS] * 3
        p.verify_checks, p.verify_max_error = 1, 2.98e-08
        p.first_use = [FirstUseReport(backend=p.backend, unverified=ops, result="passed")]
        p.measured_ms = {p.backend: 0.412, "eager": 0.873}
        p.copies, p.restride_copies = 1, 0
    return rep


@needs_chromium
def test_side_by_side_table_rows_stay_short(tmp_path):
    """Before: side by side at 1400 px the partitions table's verify column got 53 px and
    its rows were ~470 px tall (753 here), and an op's long refusal made its row 348 px:
    checks, fallbacks and refusals are now notes under their tables; and the partitions
    table scrolled inside its column (11 columns; now the text report's 9)."""
    reports = [_checked(bert_base_sized("onnxruntime first")),
               _checked(bert_base_sized("inductor first", order=("inductor", "onnxruntime")))]
    page = tmp_path / "report.html"
    text = render_html(reports)
    assert "partition 0: copies 1 at the boundary, 0 restrides; verified 1x against eager, " \
           "max error 2.98e-08; first use on onnxruntime checked against eager: passed" in text
    assert "partition 37: fallback at compile: onnxruntime -&gt; eager: RuntimeError: boom" \
           in text
    assert "<li>_native_batch_norm_legit_functional refused by openvino: output 1 is used" \
           in text
    page.write_text(text, encoding="utf-8")
    attrs = _measured(page, 1400, tmp_path)
    assert attrs["data-errors"] == "" and attrs["data-columns"] == "2"
    assert int(attrs["data-tallest-row"]) <= 80, attrs["data-tallest-row"]
    assert int(attrs["data-overflow"]) == 0
    # the text report's columns: the tables fit their column, nothing scrolls sideways
    assert attrs["data-wide-tables"] == "", attrs["data-wide-tables"]


class _TutorialCNN(torch.nn.Module):
    """PyTorch's tutorial CNN: its relus, poolings and flatten are functional, between
    its modules, so they sit outside any module."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = torch.nn.Conv2d(3, 6, 5), torch.nn.Conv2d(6, 16, 5)
        self.fc1, self.fc2 = torch.nn.Linear(400, 120), torch.nn.Linear(120, 84)
        self.fc3 = torch.nn.Linear(84, 10)

    def forward(self, x):
        F = torch.nn.functional
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = torch.flatten(F.max_pool2d(F.relu(self.conv2(x)), 2), 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


@needs_chromium
def test_nodes_outside_modules_stay_in_the_flow(tmp_path, fresh_dynamo):
    """Before: a partition's nodes outside any module were one box, "#0 onnxruntime 7
    nodes" for a 15-node partition, joined to every module: a sequential CNN drawn as a
    star. Now a box per run of them that no module's node interrupts, named by its ops,
    saying how many of its partition's nodes it holds: the CNN is a chain."""
    torch.manual_seed(0)
    with torch.no_grad():
        rep = arbiter.explain(_TutorialCNN().eval(), torch.randn(2, 3, 32, 32), config={
            "backends": ["onnxruntime"], "min_block_size": 1, "against_eager": "off"})
    (part,) = rep.graphs[0].partitions
    outside = [n for n in rep.graphs[0].graph if not n.module]
    assert part.nodes == 15 and len(outside) == 7
    page = tmp_path / "cnn.html"
    page.write_text(render_html(rep), encoding="utf-8")
    dom = chromium("--dump-dom", page.as_uri(), cwd=tmp_path).stdout
    assert _html_attrs(dom)["data-errors"] == ""
    edges = re.findall(r'data-edge="([^"]+)"', dom)
    degree = Counter(u for e in edges for u in e.split(" "))
    assert max(degree.values()) == 2, degree  # a chain: one edge in, one out
    assert re.findall(r'data-unit="(p:[\d.]+)"', dom) == ["p:0", "p:0.1", "p:0.2", "p:0.3"]
    held = [int(k) for k in re.findall(r">(\d+) of #0's 15 nodes<", dom)]
    assert sorted(held) == [1, 1, 2, 3] and sum(held) == len(outside)
    assert ">relu, max_pool2d_with_indices<" in dom  # named by their ops
