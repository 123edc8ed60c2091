"""Hostile and broken input: broken backend packages, odd tensors, mixed devices, bad
cache directories, bad probe arguments. Config and manifest errors (malformed YAML,
unknown keys, wrong types, unknown backends and ops) are in test_config.py and
test_manifest.py. Each case ends in a clear error naming what is wrong, or in a right
answer with the degradation reported; never a wrong answer.
"""
from __future__ import annotations

import logging
import os

import pytest
import torch

import arbiter

from conftest import TWO, trace

OPS = ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"]


def f(x):
    return torch.relu(x) * 2 + x


def _parts(be):
    return [p for g in be.report().graphs for p in g.partitions]


# -- backends whose package is missing or broken --------------------------------------------
def test_backend_broken_at_import_is_unavailable_not_fatal(make_backend, fresh_dynamo):
    """available() raising something other than ImportError (a broken shared library,
    say) makes the backend unavailable with the reason; the model still runs."""
    cls = make_backend("broken", OPS)

    def available(self):
        raise OSError("libbroken.so: undefined symbol: _ZN5broken4initEv")
    cls.available = available
    be = arbiter.Arbiter({"backends": ["broken", "onnxruntime"], "min_block_size": 1})
    assert "undefined symbol" in be.unavailable["broken"]
    assert "OSError" in be.unavailable["broken"]
    x = torch.randn(4, 4)
    torch.testing.assert_close(torch.compile(f, backend=be)(x), f(x))
    assert [p.backend for p in _parts(be)] == ["onnxruntime"]
    status = {b.name: b for b in be.report().backends}
    assert status["broken"].available is False and "undefined symbol" in status["broken"].reason


def test_backend_package_missing(make_backend, fresh_dynamo):
    make_backend("missing", OPS, available=(False, "missing_pkg is not installed"))
    be = arbiter.Arbiter({"backends": ["missing"], "min_block_size": 1})
    x = torch.randn(4, 4)
    torch.testing.assert_close(torch.compile(f, backend=be)(x), f(x))
    assert [p.backend for p in _parts(be)] == ["eager"]
    assert "missing_pkg is not installed" in be.unavailable["missing"]


def test_plugin_entry_point_broken_at_import(registry, monkeypatch, caplog):
    """A third-party plugin that raises at import is skipped with a warning."""
    import importlib.metadata as md

    import arbiter.registry as reg

    class EP:
        name, value = "exploding", "exploding_pkg.backend"

        def load(self):
            raise RuntimeError("exploding_pkg: CUDA driver version is insufficient")

    monkeypatch.setattr(md, "entry_points", lambda group=None: [EP()] if group else [])
    monkeypatch.setattr(reg, "_discovered", False)
    with caplog.at_level(logging.WARNING, logger="arbiter.registry"):
        names = arbiter.backend_names()
    assert "onnxruntime" in names and "exploding" not in names
    assert "exploding" in caplog.text and "CUDA driver" in caplog.text


# -- odd tensors ------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda: torch.randn(6, 4).t(),                      # transposed
    lambda: torch.randn(4, 12)[:, ::3],                 # strided slice
    lambda: torch.randn(1, 4).expand(4, 4),             # zero stride
    lambda: torch.randn(0, 4),                          # zero-size
    lambda: torch.randn(4, 0),
], ids=["transposed", "strided", "expanded", "zero_rows", "zero_cols"])
def test_odd_tensors_match_eager(fresh_dynamo, make):
    be = arbiter.Arbiter(TWO)
    x = make()
    out = torch.compile(lambda x: (torch.relu(x) * 2 + x).sum(-1, keepdim=True) * x,
                        backend=be)(x)
    torch.testing.assert_close(out, (torch.relu(x) * 2 + x).sum(-1, keepdim=True) * x)
    # whatever ran, nothing that ran is hidden: every partition has a backend
    assert all(p.compiled and p.backend for p in _parts(be))


def test_onnxruntime_binds_zero_size_outputs():
    """IOBinding refuses a zero-size tensor's null pointer: the runner binds such an
    output without one (the probe had removed new_ones/new_zeros/new_full/linspace from
    the manifest over this, their OpInfo samples having empty outputs)."""
    be = arbiter.get_backend_class("onnxruntime")()
    x = torch.randn(3, 4)
    gm = trace(lambda x: (x.new_ones((2, 0)), x * 2), x)
    empty, twice = be.compile(gm, [x])(x)
    assert empty.shape == (2, 0) and torch.equal(twice, x * 2)


def test_noncontiguous_output_layout_is_kept(fresh_dynamo):
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "min_block_size": 1})
    x = torch.randn(4, 6)
    fn = torch.compile(lambda x: (x * 2 + 1).t(), backend=be)
    out = fn(x)
    torch.testing.assert_close(out, (x * 2 + 1).t())
    assert out.stride() == (x * 2 + 1).t().stride()


def test_mixed_cpu_and_meta_devices(fresh_dynamo):
    """The meta-device half is refused by the manifests (devices: cpu) and runs in
    eager; the CPU half runs on a backend."""
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "min_block_size": 1})

    def g(x, y):
        return torch.relu(x) * 2 + x, torch.relu(y) * 2 + y

    x, y = torch.randn(4, 4), torch.randn(4, 4, device="meta")
    a, b = torch.compile(g, backend=be)(x, y)
    torch.testing.assert_close(a, f(x))
    assert b.device.type == "meta" and b.shape == (4, 4)
    backends = {p.backend for p in _parts(be)}
    assert backends == {"onnxruntime", "eager"}
    refusals = [r for g_ in be.report().graphs for r in g_.refusals] \
        if hasattr(be.report().graphs[0], "refusals") else []
    text = str(be.report())
    assert "device meta not supported" in text or any(
        "device meta" in str(r) for r in refusals)


def test_eager_error_is_the_models_own(fresh_dynamo):
    """A shape error in the user's model surfaces as torch's own error, as without us."""
    be = arbiter.Arbiter(TWO)
    with pytest.raises(Exception, match="size|shape|match"):
        torch.compile(lambda a, b: a @ b, backend=be)(torch.randn(2, 3), torch.randn(4, 5))


# -- cache directories ------------------------------------------------------------------------
def test_unwritable_cache_dir_degrades_with_warning(tmp_path, fresh_dynamo, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    cfg = dict(TWO, cache={"dir": str(blocker / "cache")})
    with caplog.at_level(logging.WARNING):
        be = arbiter.Arbiter(cfg)
        x = torch.randn(4, 4)
        torch.testing.assert_close(torch.compile(f, backend=be)(x), f(x))
    assert "cache" in caplog.text and str(blocker) in caplog.text
    assert not any(p.fallbacks for p in _parts(be))


def test_corrupt_cache_entries_are_ignored_and_rebuilt(tmp_path, fresh_dynamo, caplog):
    cfg = {"backends": ["onnxruntime"], "min_block_size": 1,
           "cache": {"dir": str(tmp_path / "cache")}}
    x = torch.randn(4, 4)
    torch.testing.assert_close(torch.compile(f, backend=arbiter.Arbiter(cfg))(x), f(x))
    files = [os.path.join(d, n) for d, _, ns in os.walk(tmp_path / "cache") for n in ns
             if not n.startswith(".")]
    if not files:
        pytest.skip("the onnxruntime backend wrote no cache entry for this graph")
    for path in files:
        with open(path, "wb") as fh:
            fh.write(b"\x00garbage, not a cache entry\xff" * 3)
    torch._dynamo.reset()
    with caplog.at_level(logging.WARNING):
        be = arbiter.Arbiter(cfg)
        torch.testing.assert_close(torch.compile(f, backend=be)(x), f(x))
    assert "ignoring" in caplog.text or "cannot read" in caplog.text, caplog.text
    assert [p.backend for p in _parts(be)] == ["onnxruntime"]


# -- probe arguments --------------------------------------------------------------------------
def test_probe_cli_errors(capsys):
    from arbiter.cli import main

    assert main(["probe", "onnxruntim"]) == 2
    assert "did you mean 'onnxruntime'" in capsys.readouterr().err
    assert main(["probe", "eager"]) == 2
    assert "nothing to probe" in capsys.readouterr().err
    assert main(["probe", "onnxruntime", "--dtypes", "float33"]) == 2
    assert "unknown dtype 'float33'" in capsys.readouterr().err


def test_expanded_output_layout(fresh_dynamo):
    """An output traced as an expanded view (stride 0) cannot be restrided by a copy;
    the backend's dense result is handed on (found by the OpInfo sweep: `expand`)."""
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "min_block_size": 1})
    x = torch.randn(1, 4)
    out = torch.compile(lambda x: (x * 2 + 1).expand(3, 4), backend=be)(x)
    torch.testing.assert_close(out, (x * 2 + 1).expand(3, 4))
    assert [p.backend for p in _parts(be)] == ["onnxruntime"]
