"""backend="arbiter" through the torch_dynamo_backends entry point."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    assert "arbiter" not in sys.modules, "torch imported arbiter by itself"
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    x = torch.randn(3, 8)
    with torch.no_grad():
        want = m(x)
        # the embedded default config
        got_default = torch.compile(m, backend="arbiter")(x)
    default_ok = torch.allclose(got_default, want, atol=1e-5)
    imported_by_compile = "arbiter" in sys.modules
    import arbiter
    rep_default = arbiter.last_report()
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(m, backend="arbiter",
                            options={"config": {"backends": ["eager"]}})(x)
    rep = arbiter.last_report()
    print(json.dumps({
        "default_ok": default_ok,
        "imported_by_compile": imported_by_compile,
        "default_backends": [b.name for b in rep_default.backends],
        "default_config": rep_default.config,
        "default_used": sorted({p.backend for g in rep_default.graphs for p in g.partitions}),
        "default_policy": [(g.policy, g.chosen) for g in rep_default.graphs],
        "ok": torch.allclose(got, want, atol=1e-5),
        "backends": [b.name for b in rep.backends],
        "config": rep.config,
        "used": sorted({p.backend for g in rep.graphs for p in g.partitions}),
    }))
""")


@pytest.fixture(scope="module")
def subprocess_result():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_backend_name_works_without_import(subprocess_result):
    r = subprocess_result
    assert r["imported_by_compile"] is True  # torch loaded it through the entry point
    assert r["default_ok"] is True
    assert r["default_backends"] == ["onnxruntime", "openvino", "inductor", "eager"]
    assert r["default_config"].endswith("default.yaml")
    # policy `calibrated` chose among the candidates (this tiny MLP may run where its
    # prediction, or the first call's timing of the two best, says: eager included)
    [(policy, chosen)] = r["default_policy"]
    assert policy == "calibrated" and chosen
    assert r["default_used"] and set(r["default_used"]) <= {"onnxruntime", "openvino",
                                                            "inductor", "eager"}


def test_options_config_is_honoured(subprocess_result):
    r = subprocess_result
    assert r["ok"] is True
    assert r["backends"] == ["eager"]
    assert r["config"] == "<dict>"
    assert r["used"] == ["eager"]


def test_entry_point_is_registered():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="torch_dynamo_backends")}
    assert eps.get("arbiter") == "arbiter.dynamo:arbiter_backend"


def test_misspelled_option_names_valid_one(fresh_dynamo):
    m = torch.nn.Linear(4, 4)
    with pytest.raises(Exception) as info:
        torch.compile(m, backend="arbiter", options={"conifg": {"backends": ["eager"]}})(
            torch.randn(2, 4))
    msg = str(info.value)
    assert "unknown option 'conifg'" in msg
    assert "did you mean 'config'" in msg
    assert "valid options: config" in msg


def test_misspelled_option_direct_call_raises_config_error():
    import arbiter
    from arbiter.dynamo import arbiter_backend

    with pytest.raises(arbiter.ConfigError) as info:
        arbiter_backend(None, [], options={"conifg": {}})
    assert info.value.key == "conifg"
    assert "did you mean 'config'" in str(info.value)


def test_bad_config_in_options_is_reported(fresh_dynamo):
    m = torch.nn.Linear(4, 4)
    with pytest.raises(Exception) as info:
        torch.compile(m, backend="arbiter",
                      options={"config": {"backends": ["onnxruntim"]}})(torch.randn(2, 4))
    assert "did you mean 'onnxruntime'" in str(info.value)


def test_same_config_shares_one_arbiter(fresh_dynamo):
    import arbiter
    from arbiter.sessions import last_arbiter

    cfg = {"backends": ["eager"], "min_block_size": 2}

    def f(x):
        return torch.relu(x) + 1

    def g(x):
        return torch.sigmoid(x) * 2

    x = torch.randn(3)
    torch.testing.assert_close(torch.compile(f, backend="arbiter", options={"config": cfg})(x),
                               f(x))
    first = last_arbiter()
    torch.testing.assert_close(
        torch.compile(g, backend="arbiter", options={"config": dict(cfg)})(x), g(x))
    assert last_arbiter() is first
    # one Arbiter, two compiled functions: one report each; the Arbiter sees both
    assert len(arbiter.last_report().graphs) == 1
    assert "aten.sigmoid.default" in {o.op for o in arbiter.last_report().graphs[0].ops}
    assert len(first.report().graphs) == 2
