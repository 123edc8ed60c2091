"""Config loading: valid files, shorthand, and errors that name file, key, line and fix."""
from __future__ import annotations

import textwrap

import pytest

import arbiter
from arbiter import ConfigError, load_config
from arbiter.config import Config, shipped_configs


def write(tmp_path, text: str, name: str = "cfg.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def load_error(path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value


# -- valid configs ----------------------------------------------------------------------
def test_valid_file_loads_every_field(tmp_path):
    path = write(tmp_path, """\
        backends:
          - name: onnxruntime
            options: {graph_optimization_level: basic, intra_op_num_threads: 1}
          - inductor
        fallback: [eager]
        policy: priority
        min_block_size: 2
        exclude_ops: [aten.gelu]
        pin: {aten.relu: inductor, aten.addmm.default: onnxruntime}
        decompositions: [aten.silu]
        freeze_weights: false
        """)
    cfg = load_config(path)
    assert isinstance(cfg, Config)
    assert [b.name for b in cfg.backends] == ["onnxruntime", "inductor"]
    assert cfg.backends[0].options == {"graph_optimization_level": "basic",
                                       "intra_op_num_threads": 1}
    assert cfg.backends[1].options == {}
    assert cfg.min_block_size == 2
    assert cfg.exclude_ops == ["aten.gelu"]
    assert cfg.pin == {"aten.relu": "inductor", "aten.addmm.default": "onnxruntime"}
    assert cfg.decompositions == ["aten.silu"]
    assert cfg.freeze_weights is False
    assert cfg.source == str(path)
    assert cfg.chain_names() == ["onnxruntime", "inductor", "eager"]
    assert cfg.options_for("onnxruntime")["graph_optimization_level"] == "basic"
    assert cfg.options_for("eager") == {}


def test_shorthand_backends_and_defaults():
    cfg = load_config({"backends": ["inductor", {"name": "onnxruntime"}]})
    assert [(b.name, b.options) for b in cfg.backends] == [("inductor", {}),
                                                          ("onnxruntime", {})]
    assert cfg.min_block_size == 3 and cfg.freeze_weights is True
    assert cfg.policy == "priority" and cfg.fallback == [] and cfg.pin == {}
    # eager always ends the chain, even when not listed
    assert cfg.chain_names() == ["inductor", "onnxruntime", "eager"]
    assert cfg.source == "<dict>"


def test_config_instance_passes_through():
    cfg = load_config({"backends": ["eager"]})
    assert load_config(cfg) is cfg
    assert cfg.chain_names() == ["eager"]


@pytest.mark.parametrize("name", ["default", "cpu"])
def test_shipped_config_by_name(name):
    assert name in shipped_configs()
    cfg = load_config(name)
    assert cfg.source == str(shipped_configs()[name])
    assert cfg.chain_names()[-1] == "eager"
    assert len(cfg.backends) >= 1


def test_none_is_the_default_config():
    assert load_config(None).model_dump() == load_config("default").model_dump()


def test_unknown_shipped_name_suggests():
    with pytest.raises(ConfigError) as info:
        load_config("defualt")
    msg = str(info.value)
    assert "did you mean 'default'" in msg
    assert "cpu" in msg and "default" in msg  # lists what is shipped


def test_wrong_source_type():
    with pytest.raises(arbiter.ArbiterError, match="not int"):
        load_config(3)


# -- errors with file, key path, line ---------------------------------------------------
def test_unknown_top_level_key_names_file_line_and_suggests(tmp_path):
    path = write(tmp_path, """\
        backends:
          - onnxruntime
          - inductor
        min_blok_size: 2
        """)
    err = load_error(path)
    assert err.file == str(path)
    assert err.line == 4
    assert err.key == "min_blok_size"
    msg = str(err)
    assert str(path) in msg and ":4" in msg
    assert "did you mean 'min_block_size'" in msg
    assert "valid keys" in msg and "exclude_ops" in msg
    assert isinstance(err, ValueError)  # ConfigError is also a ValueError


def test_wrong_type_names_key_and_line(tmp_path):
    path = write(tmp_path, """\
        backends: [onnxruntime, inductor]
        min_block_size: three
        """)
    err = load_error(path)
    assert (err.key, err.line) == ("min_block_size", 2)
    assert "integer" in str(err) and "three" in str(err)


def test_backends_must_be_a_list():
    with pytest.raises(ConfigError) as info:
        load_config({"backends": "onnxruntime"})
    assert info.value.key == "backends" and info.value.file == "<dict>"


def test_out_of_range_value():
    with pytest.raises(ConfigError) as info:
        load_config({"backends": ["eager"], "min_block_size": 0})
    assert info.value.key == "min_block_size"


def test_empty_backends_rejected(tmp_path):
    err = load_error(write(tmp_path, "backends: []\n"))
    assert err.key == "backends" and err.line == 1
    assert "at least one backend" in str(err)


def test_missing_backends_key(tmp_path):
    err = load_error(write(tmp_path, "min_block_size: 2\n"))
    assert err.key == "backends"
    assert "missing" in str(err)


def test_unknown_backend_suggests_and_lists_known(tmp_path):
    path = write(tmp_path, """\
        backends:
          - onnxruntime
          - inductr
        """)
    err = load_error(path)
    assert (err.key, err.line) == ("backends[1].name", 3)
    msg = str(err)
    assert "unknown backend 'inductr'" in msg
    assert "did you mean 'inductor'" in msg
    for known in ("eager", "inductor", "onnxruntime"):
        assert known in msg


def test_unknown_fallback_backend():
    with pytest.raises(ConfigError) as info:
        load_config({"backends": ["onnxruntime"], "fallback": ["eagr"]})
    assert info.value.key == "fallback[0]"
    assert "did you mean 'eager'" in str(info.value)


def test_duplicate_backend(tmp_path):
    path = write(tmp_path, """\
        backends:
          - onnxruntime
          - inductor
          - name: onnxruntime
        """)
    err = load_error(path)
    assert err.key == "backends[2].name" and err.line == 4
    assert "twice" in str(err)


def test_duplicate_yaml_key(tmp_path):
    err = load_error(write(tmp_path, "backends: [onnxruntime]\nbackends: [inductor]\n"))
    assert err.line == 2 and "duplicate key 'backends'" in str(err)


@pytest.mark.parametrize("key", ["exclude_ops", "decompositions"])
def test_unknown_op_in_op_lists(tmp_path, key):
    path = write(tmp_path, f"""\
        backends: [onnxruntime, inductor]
        {key}:
          - aten.gelu
          - aten.relux
        """)
    err = load_error(path)
    assert (err.key, err.line) == (f"{key}[1]", 4)
    assert "unknown op 'aten.relux'" in str(err)
    assert "did you mean 'aten.relu'" in str(err)


def test_unknown_overload_lists_valid_ones():
    with pytest.raises(ConfigError) as info:
        load_config({"backends": ["onnxruntime"], "exclude_ops": ["aten.gelu.foo"]})
    assert "no overload 'foo'" in str(info.value) and "default" in str(info.value)


def test_op_without_namespace():
    with pytest.raises(ConfigError, match="namespace"):
        load_config({"backends": ["onnxruntime"], "exclude_ops": ["gelu"]})


def test_unknown_op_in_pin(tmp_path):
    path = write(tmp_path, """\
        backends: [onnxruntime, inductor]
        pin:
          aten.softmaxx: inductor
        """)
    err = load_error(path)
    assert err.line == 3 and "aten.softmaxx" in err.key
    assert "unknown op" in str(err)


def test_pin_to_backend_not_in_config(tmp_path):
    path = write(tmp_path, """\
        backends: [onnxruntime, inductor]
        pin:
          aten.softmax: inductr
        """)
    err = load_error(path)
    assert err.line == 3 and "aten.softmax" in err.key
    msg = str(err)
    assert "'inductr' is not in this config" in msg
    assert "did you mean 'inductor'" in msg
    assert "onnxruntime, inductor, eager" in msg


def test_pin_to_registered_but_unconfigured_backend():
    with pytest.raises(ConfigError, match="'inductor' is not in this config"):
        load_config({"backends": ["onnxruntime"], "pin": {"aten.relu": "inductor"}})


def test_pin_to_eager_is_allowed():
    cfg = load_config({"backends": ["onnxruntime"], "pin": {"aten.relu": "eager"}})
    assert cfg.pin == {"aten.relu": "eager"}


@pytest.mark.parametrize("inline", [True, False])
def test_bad_backend_option_value(tmp_path, inline):
    if inline:
        text = """\
            backends:
              - name: onnxruntime
                options: {graph_optimization_level: fast}
            """
        line = 3
    else:
        text = """\
            backends:
              - inductor
              - name: onnxruntime
                options:
                  intra_op_num_threads: 2
                  graph_optimization_level: fast
            """
        line = 6
    path = write(tmp_path, text)
    err = load_error(path)
    idx = 0 if inline else 1
    assert err.key == f"backends[{idx}].options.graph_optimization_level"
    assert err.line == line
    assert err.file == str(path)
    msg = str(err)
    assert f"{path}:{line}" in msg
    assert "'fast'" in msg and "'all'" in msg  # what was given and what is valid


def test_unknown_backend_option_suggests(tmp_path):
    path = write(tmp_path, """\
        backends:
          - name: onnxruntime
            options:
              graph_optimisation_level: all
        """)
    err = load_error(path)
    assert err.key == "backends[0].options.graph_optimisation_level" and err.line == 4
    assert "did you mean 'graph_optimization_level'" in str(err)


def test_unknown_key_in_backend_entry(tmp_path):
    path = write(tmp_path, """\
        backends:
          - name: onnxruntime
            optons: {}
        """)
    err = load_error(path)
    assert err.key == "backends[0].optons" and err.line == 3
    assert "did you mean 'options'" in str(err)


def test_malformed_yaml_has_line(tmp_path):
    path = write(tmp_path, """\
        # a comment
        backends: [onnxruntime
        min_block_size: 3
        """)
    err = load_error(path)
    assert err.file == str(path)
    assert err.line in (2, 3)
    assert "malformed YAML" in str(err)
    assert f"{path}:{err.line}" in str(err)


def test_top_level_must_be_mapping(tmp_path):
    err = load_error(write(tmp_path, "- onnxruntime\n- inductor\n"))
    assert "mapping" in str(err) and err.file.endswith("cfg.yaml")


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    err = load_error(path)
    assert err.file == str(path)
    assert err.line is None and err.key is None
    assert "not found" in str(err)


def test_error_attributes_and_format():
    err = ConfigError("bad thing", file="x.yaml", key="backends[0].name", line=7)
    assert (err.file, err.key, err.line, err.reason) == ("x.yaml", "backends[0].name", 7,
                                                         "bad thing")
    assert str(err) == "x.yaml:7: backends[0].name: bad thing"
    assert isinstance(err, arbiter.ArbiterError)


def test_dict_config_errors_name_key():
    with pytest.raises(ConfigError) as info:
        load_config({"backends": ["onnxruntime"], "exclude": ["aten.gelu"]})
    err = info.value
    assert err.file == "<dict>" and err.key == "exclude" and err.line is None
    assert "did you mean 'exclude_ops'" in str(err)


def test_config_reference_is_current():
    """docs/config.md is generated from the field descriptions (arbiter/config/doc.py);
    rendered in a fresh process, so test-registered backends do not appear."""
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([sys.executable, "-m", "arbiter.config.doc"], capture_output=True,
                         text=True, check=True)
    doc = Path(__file__).resolve().parent.parent / "docs" / "config.md"
    assert out.stdout == doc.read_text(), \
        "docs/config.md is stale: run python -m arbiter.config.doc --write"


def test_exponents_without_a_dot_are_numbers(tmp_path):
    # YAML 1.1 (PyYAML's) reads 1e-3 as a string: `rtol: 1e-3` was refused as "Input
    # should be a valid number (got '1e-3')"
    path = tmp_path / "c.yaml"
    path.write_text("backends: [onnxruntime]\ncompile_timeout_s: 3e2\n"
                    "verify: {tolerances: {float32: {rtol: 1e-3, atol: 1E-5}}}\n")
    cfg = load_config(str(path))
    assert cfg.compile_timeout_s == 300.0
    tol = cfg.verify.tolerances["float32"]
    assert (tol.rtol, tol.atol) == (1e-3, 1e-5)
