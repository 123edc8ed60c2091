"""Settings that must be bounded or validated (issue 14, item 2).

A typo must be a ConfigError naming the key and what is valid, never a backend quietly
"unavailable" or "failed to compile" with the model in eager; a number must not take the
machine down; a config key must not run a program unless the user says so.
"""
from __future__ import annotations

import logging

import pytest
import torch

import arbiter
from arbiter import ConfigError, load_config
from arbiter.run import resources


def error(cfg) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    return info.value


def backend(name, **options):
    return {"backends": [{"name": name, "options": options}]}


# -- thread counts are bounded by the machine ------------------------------------------
def test_resources_threads_bounded_by_the_cpus(caplog):
    """`threads: 100000` was accepted and made threads until every process on the host
    got EAGAIN; the budget is now at most the CPUs this process may run on."""
    opts = load_config({"backends": ["eager"], "resources": {"threads": 100_000}}).resources
    with caplog.at_level(logging.WARNING):
        budget = resources.resolve(opts)
    assert budget.threads == resources.cores()
    assert "100000" in caplog.text and "resources.threads" in caplog.text


def test_resources_threads_within_the_cpus_are_kept():
    opts = load_config({"backends": ["eager"], "resources": {"threads": 1}}).resources
    assert resources.resolve(opts).threads == 1


@pytest.mark.parametrize("name,key", [("onnxruntime", "intra_op_num_threads"),
                                      ("openvino", "num_threads")])
def test_backend_thread_options_bounded_by_the_cpus(name, key, caplog):
    with caplog.at_level(logging.WARNING):
        cfg = load_config(backend(name, **{key: 100_000}))
    cls = arbiter.get_backend_class(name)
    opts = cls.Options.model_validate(cfg.options_for(name))
    assert getattr(opts, key) == resources.cores()
    assert "100000" in caplog.text


def test_inductor_cpp_threads_bounded_by_the_cpus():
    cls = arbiter.get_backend_class("inductor")
    opts = cls.Options.model_validate({"options": {"cpp.threads": 100_000}})
    assert opts.options["cpp.threads"] == resources.cores()


@pytest.mark.parametrize("value", [True, "3", 2.5])
def test_min_block_size_must_be_an_int(value):
    """`min_block_size: true` was read as 1."""
    err = error({"backends": ["eager"], "min_block_size": value})
    assert err.key == "min_block_size" and "integer" in err.reason


@pytest.mark.parametrize("section,key", [("verify", "every_n"), ("measure", "repeats"),
                                         ("resources", "threads")])
def test_nested_ints_refuse_bools(section, key):
    err = error({"backends": ["eager"], section: {key: True}})
    assert err.key == f"{section}.{key}"


def test_tolerances_refuse_bools():
    err = error({"backends": ["eager"],
                 "verify": {"tolerances": {"float32": {"rtol": True, "atol": 0}}}})
    assert "rtol" in err.key


def test_misspelled_tolerance_key_is_named():
    """`{rtol: 1, atl: 1}` said "atol: required key is missing" and never named `atl`."""
    err = error({"backends": ["eager"],
                 "verify": {"tolerances": {"float32": {"rtol": 1, "atl": 1}}}})
    assert "'atl'" in str(err) and "did you mean 'atol'" in str(err)
    assert err.key.endswith("atl")


def test_missing_key_still_reported_when_nothing_is_misspelled():
    err = error({"backends": ["eager"], "verify": {"tolerances": {"float32": {"rtol": 1}}}})
    assert err.key.endswith("atol") and "missing" in err.reason


@pytest.mark.parametrize("op", ["aten.mm", "aten.softmax", "aten.mm.default"])
def test_decomposition_of_an_op_without_one_is_an_error(op):
    """`decompositions:` naming an op with no decomposition was silently ignored."""
    err = error({"backends": ["eager"], "decompositions": [op]})
    assert err.key == "decompositions[0]" and "no decomposition" in err.reason


def test_decomposition_suggests_a_near_op():
    err = error({"backends": ["eager"], "decompositions": ["aten.softmax"]})
    assert "aten._softmax" in err.reason


def test_decompositions_that_exist_still_load():
    cfg = load_config({"backends": ["eager"], "decompositions": ["aten.gelu", "aten.addmm.default"]})
    assert cfg.decompositions == ["aten.gelu", "aten.addmm.default"]


# -- Inductor's options ------------------------------------------------------------------
def test_inductor_option_typo_is_a_config_error():
    """A typo was passed to torch._inductor.config.patch and only showed as "inductor
    failed to compile", the model running in eager."""
    err = error(backend("inductor", options={"max_autotun": True}))
    assert err.key == "backends[0].options.options"
    assert "'max_autotun'" in err.reason and "did you mean 'max_autotune'" in err.reason


def test_inductor_option_wrong_type_is_a_config_error():
    err = error(backend("inductor", options={"max_autotune": "yes please"}))
    assert "max_autotune" in err.reason and "bool" in err.reason


@pytest.mark.parametrize("key,value", [
    ("cpp.cxx", [None, "/bin/sh"]),                     # the C++ compiler: any program
    ("cuda.cuda_cxx", "/tmp/evil"),
    ("aot_inductor.custom_op_libs", ["/tmp/evil.so"]),   # libraries loaded
    ("global_cache_dir", "/tmp/shared"),                # compiled code loaded from there
    ("cpp.march", "native; touch /tmp/pwned"),          # free text on a compiler line
    ("cpp.inject_relu_bug_TESTING_ONLY", "compile_error"),  # wrong answers on purpose
    ("post_grad_custom_pre_pass", None),                # code hooks
])
def test_inductor_options_that_run_programs_are_refused(key, value):
    """`cpp.cxx` made a YAML config run any program."""
    err = error(backend("inductor", options={key: value}))
    assert key in err.reason and "trusted_options" in err.reason


def test_inductor_unsafe_option_accepted_when_trusted_by_name():
    cfg = load_config(backend("inductor", options={"cpp.cxx": [None, "g++"]},
                              trusted_options=["cpp.cxx"]))
    assert cfg.options_for("inductor")["options"]["cpp.cxx"] == [None, "g++"]
    # trusting one key trusts only that key
    err = error(backend("inductor", options={"cpp.cxx": [None, "g++"],
                                             "cuda.cuda_cxx": "nvcc"},
                        trusted_options=["cpp.cxx"]))
    assert "cuda.cuda_cxx" in err.reason


def test_inductor_trusted_option_must_be_a_real_key():
    err = error(backend("inductor", trusted_options=["cpp.cx"]))
    assert "did you mean 'cpp.cxx'" in err.reason


def test_inductor_safe_options_still_accepted():
    cfg = load_config(backend("inductor", options={"max_autotune": False, "cpp.threads": 1,
                                                   "cpp.simdlen": None}))
    assert cfg.options_for("inductor")["options"]["max_autotune"] is False


@pytest.mark.parametrize("mode", ["fastest", "max_autotune", ""])
def test_inductor_mode_is_validated(mode):
    err = error(backend("inductor", mode=mode))
    assert err.key == "backends[0].options.mode" and "max-autotune" in err.reason


def test_inductor_valid_modes_load():
    for mode in ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
        load_config(backend("inductor", mode=mode))


# -- providers and devices: a typo is an error, a missing one is unavailable ------------------
def test_onnxruntime_provider_typo_is_a_config_error():
    pytest.importorskip("onnxruntime")
    err = error(backend("onnxruntime", providers=["CPUExecutionProvidr"]))
    assert err.key == "backends[0].options.providers"
    assert "did you mean 'CPUExecutionProvider'" in err.reason
    assert "CUDAExecutionProvider" in err.reason  # the valid names are listed


def test_onnxruntime_valid_but_absent_provider_is_unavailable():
    ort = pytest.importorskip("onnxruntime")
    absent = next((p for p in ort.get_all_providers() if p not in ort.get_available_providers()),
                  None)
    if absent is None:
        pytest.skip("every execution provider is in this onnxruntime build")
    be = arbiter.Arbiter({"backends": [{"name": "onnxruntime",
                                        "options": {"providers": [absent]}}]})
    assert absent in be.unavailable["onnxruntime"]


def test_openvino_device_typo_is_a_config_error():
    pytest.importorskip("openvino")
    err = error(backend("openvino", device="CUP"))
    assert err.key == "backends[0].options.device"
    assert "did you mean 'CPU'" in err.reason and "GPU" in err.reason


@pytest.mark.parametrize("device", ["CPU", "AUTO", "HETERO:GPU,CPU", "AUTO:CPU", "GPU.0"])
def test_openvino_device_forms_accepted(device):
    pytest.importorskip("openvino")
    load_config(backend("openvino", device=device))


def test_openvino_device_list_typo():
    pytest.importorskip("openvino")
    err = error(backend("openvino", device="HETERO:GPU,CUP"))
    assert "'CUP'" in err.reason


def test_openvino_valid_but_absent_device_is_unavailable():
    ov = pytest.importorskip("openvino")
    if "GPU" in ov.Core().available_devices:
        pytest.skip("this machine has an OpenVINO GPU")
    be = arbiter.Arbiter(backend("openvino", device="GPU"))
    assert "GPU" in be.unavailable["openvino"]


# -- ConfigError through torch.compile(backend="arbiter") -----------------------------------
def test_config_error_through_dynamo_is_catchable(fresh_dynamo):
    """It reached the user wrapped in Dynamo's BackendCompilerFailed."""
    fn = torch.compile(lambda x: x + 1, backend="arbiter",
                       options={"config": {"backends": ["onnxruntim"]}})
    with pytest.raises(arbiter.ConfigError) as info:
        fn(torch.randn(3))
    assert "did you mean 'onnxruntime'" in str(info.value)
    assert info.value.key == "backends[0].name"


def test_unknown_torch_compile_option_through_dynamo_is_catchable(fresh_dynamo):
    fn = torch.compile(lambda x: x + 1, backend="arbiter", options={"confg": "cpu"})
    with pytest.raises(arbiter.ConfigError, match="did you mean 'config'"):
        fn(torch.randn(3))


def test_config_file_error_through_dynamo_names_the_line(tmp_path, fresh_dynamo):
    path = tmp_path / "c.yaml"
    path.write_text("backends: [eager]\nmin_block_size: true\n")
    fn = torch.compile(lambda x: x + 1, backend="arbiter", options={"config": str(path)})
    with pytest.raises(arbiter.ConfigError) as info:
        fn(torch.randn(3))
    assert info.value.file == str(path) and info.value.line == 2


def test_config_error_through_dynamo_is_printed_from_where_it_was_raised(tmp_path):
    """A config typo through torch.compile(options=...) prints the user's lines, then the
    line that raised and the error, without Dynamo's internals (it was 109 lines)."""
    import subprocess
    import sys

    script = tmp_path / "typo.py"
    script.write_text(
        "import torch\n"
        "m = torch.nn.Linear(4, 4)\n"
        f"f = torch.compile(m, backend='arbiter', options={{'config': '{tmp_path}/typo.yaml'}})\n"
        "f(torch.randn(2, 4))\n")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, env={**__import__("os").environ,
                                           "TORCHDYNAMO_VERBOSE": "0"})
    assert run.returncode == 1
    err = run.stderr.strip().splitlines()
    trace = err[:next(k for k, line in enumerate(err) if line.startswith("arbiter.errors."))]
    assert f"ConfigError: {tmp_path}/typo.yaml: file not found" in run.stderr
    assert "convert_frame.py" not in run.stderr  # Dynamo's compile internals
    assert len(trace) < 25, run.stderr
