"""The persistent cache (arbiter/cache/) and the ONNX Runtime artifact it keeps."""
from __future__ import annotations

import logging
import shutil

import pytest
import torch

import arbiter
from arbiter.cache import Cache, fingerprint

from conftest import trace

PARTS = {"backend": "x", "version": "1", "options": {}}


def test_round_trip_and_json(tmp_path):
    c = Cache(tmp_path)
    assert c.get("k", "ab12") is None
    c.put("k", "ab12", b"payload")
    assert c.get("k", "ab12") == b"payload"
    c.put_json("d", "cd34", {"label": "priority"})
    assert c.get_json("d", "cd34") == {"label": "priority"}
    assert c.hits == 2 and c.misses == 1


@pytest.mark.parametrize("damage", ["flip", "truncate", "header", "foreign"])
def test_corrupt_or_foreign_entries_are_ignored_with_a_warning(tmp_path, caplog, damage):
    c = Cache(tmp_path)
    c.put("k", "ab12", b"payload-bytes")
    path = c.path("k", "ab12")
    raw = path.read_bytes()
    if damage == "flip":
        path.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    elif damage == "truncate":
        path.write_bytes(raw[:-3])
    elif damage == "header":
        path.write_bytes(b"garbage\n" + raw)
    else:  # an entry copied in from another key
        c.put("k", "ff99", b"other")
        shutil.copy(c.path("k", "ff99"), path)
    with caplog.at_level(logging.WARNING, logger="arbiter.cache"):
        assert c.get("k", "ab12") is None
    assert "ignoring k entry" in caplog.text and "rebuilding" in caplog.text
    assert c.rejected == 1 and not path.exists()
    c.put("k", "ab12", b"rebuilt")
    assert c.get("k", "ab12") == b"rebuilt"


def test_unwritable_dir_disables_the_cache_with_one_warning(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="arbiter.cache"):
        c = Cache(blocker / "cache")
        c.put("k", "ab12", b"x")
        assert c.get("k", "ab12") is None
    assert not c.enabled
    assert len([r for r in caplog.records if "cache disabled" in r.message]) == 1
    assert arbiter.Arbiter({"backends": ["onnxruntime"],
                            "cache": {"dir": str(blocker / "c")}}).cache is None


def test_default_dir_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ARBITER_CACHE_DIR", str(tmp_path / "env"))
    assert Cache().dir == tmp_path / "env"
    assert arbiter.Arbiter({"backends": ["onnxruntime"], "cache": {"enabled": False}}).cache is None


def _f(x, y):
    return torch.relu(x @ y) + 1


def test_key_ignores_node_names_but_not_shapes_or_parts():
    x, y = torch.randn(4, 8), torch.randn(8, 3)
    g1, g2 = trace(_f, x, y), trace(_f, x, y)
    for n in g2.graph.nodes:
        n._rename(f"renamed_{n.name}")
    g2.recompile()
    assert [n.name for n in g1.graph.nodes] != [n.name for n in g2.graph.nodes]
    k = fingerprint(g1, [x, y], PARTS)
    assert fingerprint(g2, [x, y], PARTS) == k
    x2 = torch.randn(5, 8)
    assert fingerprint(trace(_f, x2, y), [x2, y], PARTS) != k
    assert fingerprint(g1, [x, y], {**PARTS, "version": "2"}) != k
    assert fingerprint(g1, [x, y], {**PARTS, "options": {"a": 1}}) != k


class _Lin(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        self.register_buffer("w", w)

    def forward(self, x):
        return x @ self.w


def test_key_hashes_baked_constants():
    x = torch.randn(2, 4)
    w = torch.randn(4, 4)

    def key(weight):
        gm = torch.fx.symbolic_trace(_Lin(weight))
        return fingerprint(gm, [x], PARTS)

    assert key(w) == key(w.clone())  # same bytes, other tensor: same key
    assert key(w) != key(w + 1e-3)  # same architecture, other weights: never shared
    # weights bound to placeholders (frozen inputs) count as well
    gm = trace(_f, x, w)
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert fingerprint(gm, [x, w], PARTS, {ph[1]: w}) != \
        fingerprint(gm, [x, w], PARTS, {ph[1]: w * 2})


def test_in_place_weight_change_changes_the_key():
    w = torch.randn(4, 4)
    gm = torch.fx.symbolic_trace(_Lin(w))
    k = fingerprint(gm, [torch.randn(2, 4)], PARTS)
    gm.w.add_(1)  # bumps the tensor's version: the memoized digest is not reused
    assert fingerprint(gm, [torch.randn(2, 4)], PARTS) != k


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.fixture
def count_exports(monkeypatch):
    pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install "
                        "'torch-arbiter[onnxruntime]')")
    import arbiter.backends.onnxruntime as ortmod

    calls = []
    real = ortmod.export_onnx

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(ortmod, "export_onnx", counting)
    return calls


def _run(model, x, cfg):
    torch._dynamo.reset()
    be = arbiter.Arbiter(cfg)
    with torch.no_grad():
        out = torch.compile(model, backend=be)(x)
    torch.testing.assert_close(out, model(x))
    return be


def test_onnx_export_is_reused_by_a_new_arbiter_and_never_across_weights(
        tmp_path, count_exports, caplog, fresh_dynamo):
    cfg = {"backends": ["onnxruntime"], "cache": {"dir": str(tmp_path)}}
    torch.manual_seed(0)
    model, x = _MLP().eval(), torch.randn(2, 8)
    _run(model, x, cfg)
    assert len(count_exports) == 1
    be = _run(model, x, cfg)
    assert len(count_exports) == 1  # loaded from the cache
    assert be.report().graphs[0].partitions[0].backend == "onnxruntime"
    other = _MLP().eval()  # same architecture, other random weights
    _run(other, x, cfg)
    assert len(count_exports) == 2
    # a corrupt artifact is rebuilt, with a warning, and the answer is still right
    for p in tmp_path.glob("onnx/*/*.bin"):
        p.write_bytes(p.read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="arbiter.cache"):
        _run(model, x, cfg)
    assert len(count_exports) == 3 and "rebuilding" in caplog.text


class _Wide(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(256, 512)
        self.b = torch.nn.Linear(512, 256)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_the_cached_onnx_model_refers_to_the_weights_rather_than_holding_them(
        tmp_path, count_exports, fresh_dynamo):
    """The entry is the graph, not the weights (backends/_onnx_constants.py): a second
    arbiter builds its session from it and the model's own weights, right."""
    cfg = {"backends": ["onnxruntime"], "cache": {"dir": str(tmp_path)}}
    torch.manual_seed(0)
    model, x = _Wide().eval(), torch.randn(2, 256)
    _run(model, x, cfg)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    entries = list(tmp_path.glob("onnx/*/*.bin"))
    assert len(entries) == 1 and entries[0].stat().st_size < weights / 50
    _run(model, x, cfg)  # asserts the answer
    assert len(count_exports) == 1
