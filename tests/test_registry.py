"""The backend registry: decorator, lookup errors, runtime-registered backends."""
from __future__ import annotations

import pytest
import torch

import arbiter
from arbiter import Backend, UnknownBackendError, register_backend

from conftest import check_plan_invariants, trace


def test_builtins_are_discovered():
    assert {"eager", "inductor", "onnxruntime"} <= set(arbiter.backend_names())
    assert arbiter.get_backend_class("eager").inline_aten is True
    assert arbiter.registry.aten_fallback() is arbiter.get_backend_class("eager")


def test_decorator_without_args(registry):
    @register_backend
    class Plain(Backend):
        name = "plain_test"

    assert registry["plain_test"] is Plain
    assert arbiter.get_backend_class("plain_test") is Plain
    assert "plain_test" in arbiter.backend_names()


def test_decorator_with_name(registry):
    @register_backend(name="named_test")
    class Named(Backend):
        pass

    assert Named.name == "named_test"
    assert arbiter.get_backend_class("named_test") is Named


def test_registration_is_undone_by_fixture():
    assert "plain_test" not in arbiter.backend_names()
    assert "named_test" not in arbiter.backend_names()


def test_decorator_rejects_non_backends(registry):
    with pytest.raises(TypeError):
        register_backend(object)
    with pytest.raises(arbiter.ArbiterError, match="no `name`"):
        @register_backend
        class Nameless(Backend):
            pass


def test_name_clash_with_another_class(registry):
    class A(Backend):
        name = "clash_test"

    class B(Backend):
        name = "clash_test"

    register_backend(A)
    register_backend(A)  # the same class again is fine
    with pytest.raises(arbiter.ArbiterError, match="registered twice"):
        register_backend(B)
    assert registry["clash_test"] is A


def test_unknown_backend_lists_known():
    with pytest.raises(UnknownBackendError) as info:
        arbiter.get_backend_class("onnxrt")
    err = info.value
    assert err.name == "onnxrt"
    assert {"eager", "inductor", "onnxruntime"} <= set(err.known)
    assert "did you mean 'onnxruntime'" in str(err)
    assert "eager, inductor" in str(err)
    assert isinstance(err, LookupError)


def test_runtime_backend_with_own_manifest_in_config(make_backend):
    cls = make_backend("relu_only", ["aten.relu.default", "aten.add.Tensor"])
    assert cls.manifest().backend == "relu_only"
    cfg = arbiter.load_config({"backends": ["relu_only", "onnxruntime"],
                               "min_block_size": 1})
    assert cfg.chain_names() == ["relu_only", "onnxruntime", "eager"]

    def f(x):
        return torch.sigmoid(torch.relu(x) + x)

    gm = trace(f, torch.randn(4, 4))
    plan = arbiter.partition(gm, cfg)
    assert plan.as_lists() == [("relu_only", ["relu", "add"]),
                               ("onnxruntime", ["sigmoid"])]
    check_plan_invariants(plan, gm)


def test_runtime_backend_options_are_validated(registry, tmp_path):
    from pydantic import BaseModel, ConfigDict

    from conftest import write_manifest

    path = write_manifest(tmp_path, "opts_test", ["aten.relu.default"])

    class Opts(BaseModel):
        model_config = ConfigDict(extra="forbid")
        level: int = 1

    @register_backend
    class WithOptions(Backend):
        name = "opts_test"
        Options = Opts

        @classmethod
        def manifest_path(cls):
            return path

    with pytest.raises(arbiter.ConfigError) as info:
        arbiter.load_config({"backends": [{"name": "opts_test", "options": {"levl": 2}}]})
    assert info.value.key == "backends[0].options.levl"
    assert "did you mean 'level'" in str(info.value)
    be = arbiter.Arbiter({"backends": [{"name": "opts_test", "options": {"level": 2}}]})
    assert be.backends["opts_test"].options.level == 2


def test_unavailable_backend_gets_nothing_and_is_reported(make_backend):
    make_backend("offline", ["aten.relu.default", "aten.add.Tensor", "aten.sigmoid.default"],
                 available=(False, "no device here"))
    cfg = {"backends": ["offline", "onnxruntime"], "min_block_size": 1}

    def f(x):
        return torch.sigmoid(torch.relu(x) + x)

    gm = trace(f, torch.randn(4, 4))
    plan = arbiter.partition(gm, cfg)
    assert all(p.backend != "offline" for p in plan.partitions)
    assert plan.as_lists() == [("onnxruntime", ["relu", "add", "sigmoid"])]
    for node, sup in plan.support.items():
        assert "unavailable" in sup.refusals["offline"]
        assert "no device here" in sup.refusals["offline"]

    be = arbiter.Arbiter(cfg)
    status = {b.name: b for b in be.report().backends}
    assert status["offline"].available is False
    assert "no device here" in status["offline"].reason
    assert status["onnxruntime"].available is True
    assert "offline" in be.unavailable
    assert "unavailable" in str(be.report())
