"""The report per graph kind (forward, backward, inference: what ran where, summed over
the graphs of that kind) and its distributed section (which decisions were broadcast),
issue 17's Report item: arbiter/report/from_record.py (kind_reports, distributed_report), text.py,
html.py."""
from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

import arbiter
from arbiter.ops import is_getitem, op_name
from arbiter.report.html import render_html
from arbiter.report.schema import schema
from arbiter.report.text import kind_where, render


class Net(torch.nn.Module):
    """Two dropouts: random ops, whose placement the report must show per kind."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 8)
        self.drop1 = torch.nn.Dropout(0.1)
        self.drop2 = torch.nn.Dropout(0.2)

    def forward(self, x):
        return torch.tanh(self.drop2(self.b(self.drop1(torch.relu(self.a(x))))))


def _ran(be: arbiter.Arbiter, kind: str) -> tuple[Counter, Counter, Counter]:
    """From the live records, not the report: backend -> compute nodes and partitions it
    runs, and the ops of the nodes run in eager, over the graphs of ``kind``."""
    nodes: Counter = Counter()
    parts: Counter = Counter()
    eager_ops: Counter = Counter()
    for g in be.graphs:
        if g.kind != kind:
            continue
        for p in g.plan.partitions:
            backend = g.records[p.id].backend
            compute = [n for n in p.nodes if not is_getitem(n)]
            nodes[backend] += len(compute)
            parts[backend] += 1
            if be.backends[backend].inline_aten:
                eager_ops.update(op_name(n.target) for n in compute)
    return nodes, parts, eager_ops


def _check_kind_sums(rep: arbiter.Report) -> None:
    """Each kind's numbers are the sums over the per-graph data of that kind."""
    for k in rep.kinds:
        graphs = [g for g in rep.graphs if g.kind == k.kind]
        assert k.graphs == [g.graph_id for g in graphs]
        parts = [p for g in graphs for p in g.partitions]
        assert k.nodes == sum(g.nodes for g in graphs) == sum(b.nodes for b in k.backends)
        assert k.partitions == len(parts) == sum(b.partitions for b in k.backends)
        ran: Counter = Counter()
        for g in graphs:
            ran.update(g.placement)
        assert {b.backend: b.nodes for b in k.backends if b.compiled} == dict(ran)
        planned: Counter = Counter()
        for g in graphs:
            planned.update(g.planned)
        assert {b.backend: b.nodes for b in k.backends if not b.compiled} == dict(planned)
        for b in k.backends:
            ops: Counter = Counter()
            for o in (o for g in graphs for o in g.ops):
                ops[o.op] += (o.placed if b.compiled else o.planned).get(b.backend, 0)
            assert b.ops == {op: n for op, n in ops.items() if n}
        assert k.fallbacks == sum(len(p.fallbacks) for p in parts)
        assert k.compile_s == pytest.approx(sum(p.compile_s for p in parts), abs=1e-3)


@pytest.fixture(scope="module")
def training():
    """One training step of a small model with dropout under the default config."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net().train()
    be = arbiter.Arbiter()
    compiled = torch.compile(model, backend=be)
    x = torch.randn(4, 16)
    compiled(x).pow(2).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    rep = be.report(advice=False)
    yield be, rep
    torch._dynamo.reset()


def test_training_run_per_kind_equals_the_graphs_and_what_ran(training):
    be, rep = training
    assert [k.kind for k in rep.kinds] == ["forward", "backward"]
    _check_kind_sums(rep)
    for k in rep.kinds:
        nodes, parts, eager_ops = _ran(be, k.kind)
        assert all(b.compiled for b in k.backends)  # it ran: nothing only planned
        assert {b.backend: b.nodes for b in k.backends} == dict(nodes)
        assert {b.backend: b.partitions for b in k.backends} == dict(parts)
        assert k.compiled_partitions == k.partitions == sum(parts.values())
        assert k.eager_nodes == sum(eager_ops.values())
        assert k.eager_ops == dict(eager_ops)
        assert [b.nodes for b in k.backends] == sorted((b.nodes for b in k.backends),
                                                       reverse=True)
        assert k.fell_back_partitions == k.fell_back_nodes == k.fallbacks == 0
    forward = rep.kinds[0]
    # every random node of the forward graph is counted once, wherever it runs
    drawn = Counter(op_name(n.target) for g in be.graphs if g.kind == "forward"
                    for n in g.plan.support if not is_getitem(n)
                    and "dropout" in op_name(n.target))
    for op, n in drawn.items():
        assert sum(b.ops.get(op, 0) for b in forward.backends) == n
    assert rep.distributed is None  # not under a process group


def test_training_run_in_text_html_and_json(training):
    _, rep = training
    text = render(rep)
    assert "what ran where, per graph kind" in text
    # the table comes before the first graph's tables
    assert text.index("what ran where") < text.index("graph 0 (")
    plain = str(rep)
    for k in rep.kinds:  # plain: one line per kind, never wrapped
        line = next(ln for ln in plain.splitlines() if ln.startswith(f"  {k.kind} "))
        assert kind_where(k) in line and f" {k.nodes} " in line
    assert not any(ln.startswith("distributed") for ln in plain.splitlines())
    assert max(len(ln) for ln in text.splitlines()) <= 100
    page = render_html(rep)
    assert 'class="sortable kinds"' in page and 'class="distributed"' not in page
    for k in rep.kinds:
        assert f'data-v="{k.kind}"' in page and kind_where(k) in page
    back = json.loads(rep.model_dump_json())
    assert [k["kind"] for k in back["kinds"]] == ["forward", "backward"]
    assert back["distributed"] is None
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (test extra) missing")
    jsonschema.validate(back, schema())


def test_inference_run_has_one_kind(fresh_dynamo):
    model = Net().eval()
    be = arbiter.Arbiter()
    with torch.no_grad():
        x = torch.randn(4, 16)
        torch.testing.assert_close(torch.compile(model, backend=be)(x), model(x))
    rep = be.report(advice=False)
    assert [k.kind for k in rep.kinds] == ["inference"]
    _check_kind_sums(rep)
    (k,) = rep.kinds
    nodes, parts, eager_ops = _ran(be, "inference")
    assert {b.backend: b.nodes for b in k.backends} == dict(nodes)
    assert k.eager_ops == dict(eager_ops)
    assert "inference" in render(rep) and rep.distributed is None


def test_dry_run_kinds_are_the_plan():
    torch._dynamo.reset()
    with torch.no_grad():
        rep = arbiter.explain(Net().eval(), torch.randn(4, 16), breaks=False)
    torch._dynamo.reset()
    (k,) = rep.kinds
    assert k.compiled_partitions == 0 and not any(b.compiled for b in k.backends)
    _check_kind_sums(rep)
    assert "(plan)" in kind_where(k)
    assert f"{k.partitions} of {k.partitions} partitions not compiled" in str(rep)


def _boom_compile(self, gm, example_inputs):
    raise RuntimeError("boom at compile")


def test_a_fallback_counts_as_fell_back(make_backend, fresh_dynamo):
    make_backend("failing", ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"],
                 compile=_boom_compile)
    be = arbiter.Arbiter({"backends": ["failing", "onnxruntime"], "min_block_size": 1})
    x = torch.randn(4, 4)
    f = lambda x: torch.relu(x) * 2 + x  # noqa: E731
    torch.testing.assert_close(torch.compile(f, backend=be)(x), f(x))
    rep = be.report(advice=False)
    (k,) = rep.kinds
    (p,) = rep.graphs[0].partitions
    assert (k.fell_back_partitions, k.fell_back_nodes, k.fallbacks) == (1, p.nodes, 1)
    assert [(b.backend, b.fell_back_nodes) for b in k.backends] == [("onnxruntime", p.nodes)]
    assert f"{p.nodes} nodes in 1 (1 fallback)" in str(rep)


def test_timed_run_per_kind(fresh_dynamo):
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "min_block_size": 1})
    compiled = torch.compile(lambda x: torch.relu(x) * 2 + x, backend=be)
    x = torch.randn(4, 4)
    compiled(x)
    be.set_timing(True)
    for _ in range(3):
        compiled(x)
    be.set_timing(False)
    rep = be.report(advice=False)
    (k,) = rep.kinds
    parts = rep.graphs[0].partitions
    assert k.calls == 3 and k.run_s == pytest.approx(sum(p.run_s for p in parts), abs=1e-5)
    assert "run/call" in render(rep)


# -- distributed ---------------------------------------------------------------------
class FakeDist:
    """What MeasuredGraph uses of torch.distributed, for one rank of a group of two:
    rank 0 keeps what it broadcasts; another rank receives it."""

    def __init__(self, rank: int, sent: list):
        self.rank, self.sent = rank, sent

    def get_rank(self):
        return self.rank

    def get_world_size(self):
        return 2

    def broadcast_object_list(self, box, src=0):
        if self.rank == src:
            self.sent.append(list(box))
        else:
            box[:] = self.sent.pop(0)


MEASURE = {"backends": ["onnxruntime", "inductor"], "min_block_size": 1, "policy": "measure",
           "measure": {"repeats": 1, "max_repeats": 1, "warmup": 1, "refine": False,
                       "progress": False},
           "cache": {"enabled": False}}


def _g(x):
    return torch.tanh(torch.relu(x) * 2 + x)


def _as_rank(rank: int, sent: list, monkeypatch) -> arbiter.Report:
    from arbiter.measure import decision

    torch._dynamo.reset()
    monkeypatch.setattr(decision, "process_group", lambda: FakeDist(rank, sent))
    be = arbiter.Arbiter(MEASURE)
    x = torch.randn(8, 8)
    torch.testing.assert_close(torch.compile(_g, backend=be)(x), _g(x))
    monkeypatch.undo()
    torch._dynamo.reset()
    return be.report(advice=False)


def test_distributed_section_says_which_decisions_were_broadcast(monkeypatch):
    sent: list = []
    zero = _as_rank(0, sent, monkeypatch)
    assert len(sent) == 1  # rank 0 broadcast one decision: this graph's
    one = _as_rank(1, sent, monkeypatch)
    (g0,), (g1,) = zero.graphs, one.graphs
    assert (g0.measure_broadcast, g0.measure_rank, g0.measure_world_size) == \
        ("rank 0: broadcast", 0, 2)
    assert (g1.measure_broadcast, g1.measure_rank, g1.measure_world_size) == \
        ("from rank 0", 1, 2)
    assert g1.chosen == g0.chosen  # the same placement on both ranks
    d0, d1 = zero.distributed, one.distributed
    assert (d0.rank, d0.world_size, d0.sent, d0.received) == (0, 2, 1, 0)
    assert (d1.rank, d1.world_size, d1.sent, d1.received) == (1, 2, 0, 1)
    assert [(b.graph_id, b.kind, b.chosen, b.role) for b in d1.broadcast] == \
        [(g1.graph_id, "inference", g0.chosen, "from rank 0")]
    assert d0.not_broadcast == d1.not_broadcast == []
    text = str(zero)
    assert "distributed: rank 0 of 2: 1 graph decided here (policy measure) and broadcast" \
        in text
    assert f"graph {g0.graph_id} (inference" in text and "(rank 0: broadcast)" in text
    assert "distributed: rank 1 of 2: 1 graph took rank 0's decision, untimed" \
        in render(one)
    page = render_html(one)
    assert 'class="distributed"' in page and "rank 1 of 2" in page


def test_distributed_section_from_constructed_graphs():
    """A report read back from JSON, or built by hand: graphs with the broadcast field
    set make the section; graphs without it are listed as not broadcast."""
    from arbiter.report import GraphReport
    from arbiter.report.from_record import distributed_report

    graphs = [GraphReport(graph_id=0, kind="forward", nodes=3, partitions=[],
                          chosen="only onnxruntime", measure_broadcast="rank 0: broadcast"),
              GraphReport(graph_id=1, kind="backward", nodes=5, partitions=[],
                          chosen="priority", measure_broadcast="rank 0: broadcast"),
              GraphReport(graph_id=2, kind="forward", nodes=2, partitions=[])]
    d = distributed_report(graphs)
    # an older record without the rank: only rank 0 broadcasts; the world size unknown
    assert (d.rank, d.world_size, d.sent, d.received, d.not_broadcast) == (0, None, 2, 0, [2])
    assert [b.graph_id for b in d.broadcast] == [0, 1]
    assert distributed_report(graphs[2:]) is None
    assert distributed_report([]) is None


def test_str_and_render_draw_the_same_items(training):
    """One source (text.items): every line of it is in both renderings; the plain one
    (str) needs no rich, and render without rich is the plain one."""
    import subprocess
    import sys

    from arbiter.report.text import Line, Table, items

    _, rep = training
    plain, rich_text = str(rep), render(rep, width=160)
    flat = " ".join(rich_text.split())
    stream = list(items(rep))
    assert any(isinstance(it, Table) and it.title.startswith("what ran where")
               for it in stream)
    for it in stream:
        if isinstance(it, Line) and it.plain().strip():
            assert it.plain() in plain.splitlines()
            assert " ".join(it.plain().split()) in flat
    code = ("import sys; sys.modules['rich'] = None\n"
            "from arbiter.report import Report\n"
            "from arbiter.report.text import render\n"
            "r = Report.model_validate_json(sys.stdin.read())\n"
            "print(str(r) + '\\n' == render(r), 'what ran where, per graph kind' in str(r))")
    out = subprocess.run([sys.executable, "-c", code], input=rep.model_dump_json(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]
