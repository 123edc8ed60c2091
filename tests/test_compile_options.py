"""torch.compile's own conventions (issue 15, item 5): ``mode`` mapped or refused,
flat ``options`` validated like the YAML config, warnings once at the user's line."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import arbiter
from arbiter.config.torch_compile import resolve
from arbiter.sessions import backend_of


def f(x):
    return torch.relu(x) * 2 + 1


def _config_error(info) -> arbiter.ConfigError:
    """Dynamo wraps a backend's error (BackendCompilerFailed); ours is inside, whole."""
    err = info.value
    while not isinstance(err, arbiter.ConfigError) and err is not None:
        err = getattr(err, "inner_exception", None) or err.__cause__
    assert err is not None, info.value
    assert str(err) in str(info.value)   # the user sees our message
    return err


def test_flat_options_override_the_config_and_run_right(fresh_dynamo):
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    # against_eager off: policy `calibrated` (cpu's) may otherwise run this tiny graph in
    # eager whole, and no partition would be verified
    opts = {"config": "cpu", "min_block_size": 1, "backends": ["onnxruntime", "inductor"],
            "exclude_ops": ["aten.relu"], "verify": {"mode": "first"}, "against_eager": "off"}
    compiled = torch.compile(m, backend="arbiter", options=opts)
    x = torch.randn(3, 8)
    with torch.no_grad():
        compiled(x)
        x2 = torch.randn(5, 8)                       # not the inputs it compiled on
        torch.testing.assert_close(compiled(x2), m(x2), rtol=1e-4, atol=1e-5)
    cfg = backend_of(compiled).config
    assert cfg.min_block_size == 1 and cfg.exclude_ops == ["aten.relu"]
    assert cfg.verify.mode == "first" and cfg.verify.every_n == 100   # merged one level
    assert cfg.source.endswith("cpu.yaml + torch.compile(options=...)")
    rep = arbiter.report_for(compiled)
    assert rep.config_dump["min_block_size"] == 1
    relu = [o for g in rep.graphs for o in g.ops if o.op == "aten.relu.default"]
    assert relu and all(set(o.placed) == {"eager"} for o in relu)
    assert any(p.verify_checks for g in rep.graphs for p in g.partitions)


def test_dryrun_option_plans_without_compiling(fresh_dynamo):
    with pytest.warns(UserWarning, match="dryrun: nothing is compiled") as caught:
        compiled = torch.compile(f, backend="arbiter", options={"dryrun": True})
        x = torch.randn(4)
        torch.testing.assert_close(compiled(x), f(x))
    assert Path(caught[0].filename).name == "test_compile_options.py"  # the user's line
    rep = arbiter.report_for(compiled)
    assert rep.dry_run and not any(p.compiled for g in rep.graphs for p in g.partitions)


@pytest.mark.parametrize("options, key, words", [
    ({"min_block_size": 0}, "min_block_size", "greater than or equal to 1"),
    ({"polcy": "cost"}, "polcy", "did you mean 'policy'"),
    ({"policy": "fastest"}, "policy", "valid: "),
    ({"backends": ["onnxruntim"]}, "backends[0].name", "did you mean 'onnxruntime'"),
    ({"verify": {"mode": "always"}}, "verify.mode", "'off', 'unverified', 'first' or 'every'"),
    ({"dryrun": "yes"}, "dryrun", "true or false"),
    ({"pin": {"aten.softmax": "tensorrt"}}, "pin['aten.softmax']", "not in this config"),
])
def test_bad_options_name_the_key_and_what_is_valid(options, key, words, fresh_dynamo):
    with pytest.raises(Exception) as info:
        torch.compile(f, backend="arbiter", options=options)(torch.randn(3))
    err = _config_error(info)
    assert err.file == "torch.compile(options=...)" and err.key == key, str(err)
    assert words in str(err)


def test_torch_tensorrt_names_are_read_with_a_warning(fresh_dynamo):
    with pytest.warns(UserWarning, match="'torch_executed_ops'.*read as 'exclude_ops'"):
        config, dry = resolve({"torch_executed_ops": ["aten.relu"], "dry_run": True})
    assert config.exclude_ops == ["aten.relu"] and dry is True
    with pytest.raises(arbiter.ConfigError, match="say the same thing"):
        resolve({"torch_executed_ops": ["aten.relu"], "exclude_ops": []})


def test_mode_max_autotune_measures_and_autotunes_inductor():
    config, _ = resolve(mode="max-autotune")
    assert config.policy == "measure"
    modes = {b.name: b.options.get("mode") for b in config.backends}
    assert modes["inductor"] == "max-autotune"
    assert "mode" not in (modes.get("onnxruntime") or {})  # only backends that have one
    assert "torch.compile(mode='max-autotune')" in config.source
    # a policy the options name wins over the mode's
    config, _ = resolve({"policy": "cost"}, mode="max-autotune-no-cudagraphs")
    assert config.policy == "cost"
    assert {b.name: b.options.get("mode") for b in config.backends}["inductor"] == \
        "max-autotune-no-cudagraphs"
    assert resolve(mode="default")[0].policy == "calibrated"  # the embedded default's


def test_mode_reaches_the_backends_and_runs_right(fresh_dynamo):
    compiled = torch.compile(f, backend="arbiter", mode="max-autotune")
    x = torch.randn(16)
    torch.testing.assert_close(compiled(x), f(x))
    be = backend_of(compiled)
    assert be.policy.name == "measure"
    assert be.backends["inductor"].options.mode == "max-autotune"
    assert arbiter.report_for(compiled).graphs[0].policy == "measure"


@pytest.mark.parametrize("mode, words", [
    ("reduce-overhead", "not supported"), ("max_autotune", "did you mean 'max-autotune'")])
def test_modes_refused_say_what_to_do(mode, words, fresh_dynamo):
    with pytest.raises(Exception) as info:
        torch.compile(f, backend="arbiter", mode=mode)(torch.randn(3))
    err = _config_error(info)
    assert err.key == "mode" and words in str(err)


def test_equal_settings_share_an_arbiter_others_do_not(fresh_dynamo):
    x = torch.randn(3)
    a = torch.compile(f, backend="arbiter", options={"min_block_size": 2})
    b = torch.compile(lambda y: f(y) - 1, backend="arbiter", options={"min_block_size": 2})
    c = torch.compile(lambda y: f(y) + 1, backend="arbiter", options={"min_block_size": 1})
    a(x), b(x), c(x)
    assert backend_of(a) is backend_of(b) is not backend_of(c)


def test_resources_warning_prints_once(fresh_dynamo):
    """Before: each extra config's conflicting resources printed twice (a warning and a
    log line), at every new Arbiter."""
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("arbiter").addHandler(handler)
    arbiter.Arbiter({"backends": ["onnxruntime"]}).apply_resources()  # the budget is set
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                arbiter.Arbiter({"backends": ["onnxruntime"],
                                 "resources": {"spin": "none", "threads": 1}}
                                ).apply_resources()
    finally:
        logging.getLogger("arbiter").removeHandler(handler)
    ours = [w for w in caught if "resources:" in str(w.message)]
    assert len(ours) == 1 and not [r for r in records if "resources:" in r.getMessage()]
