"""Capability manifests: parsing errors, lookup order, and the shipped manifests."""
from __future__ import annotations

import textwrap

import pytest
import torch

import arbiter
from arbiter import ManifestError
from arbiter.plan.capability import CapabilityTable
from arbiter.manifest import load_manifest, parse_manifest

from conftest import trace


def parse(text: str, backend: str | None = "x"):
    return parse_manifest(textwrap.dedent(text), file="m.yaml", backend=backend)


def manifest_error(text: str, backend: str | None = "x") -> ManifestError:
    with pytest.raises(ManifestError) as info:
        parse(text, backend)
    return info.value


def test_minimal_manifest_defaults():
    m = parse("""\
        backend: x
        ops:
          aten.relu.default:
        """)
    e = m.entry("aten.relu.default")
    assert e is not None
    assert e.dtypes == frozenset({torch.float32})
    assert e.devices == frozenset({"cpu"})
    assert e.dynamic is False and e.max_rank is None and e.verified == "declared"
    assert m.entry("aten.relu.out") is None  # only the default overload was declared
    assert m.entry("aten.mul.Tensor") is None


def test_unknown_top_level_key():
    err = manifest_error("""\
        backend: x
        ops: {}
        opz: {}
        """)
    assert (err.key, err.line) == ("opz", 3)
    assert "did you mean 'ops'" in str(err)
    assert isinstance(err, arbiter.ConfigError)


def test_unknown_entry_key():
    err = manifest_error("""\
        backend: x
        ops:
          aten.relu.default: {dtype: [float32]}
        """)
    assert err.key == "ops['aten.relu.default'].dtype" and err.line == 3
    assert "did you mean 'dtypes'" in str(err)


@pytest.mark.parametrize("where,line", [("defaults", 3), ("entry", 5)])
def test_bad_dtype(where, line):
    if where == "defaults":
        text = """\
            backend: x
            defaults:
              dtypes: [float32, flaot16]
            ops: {}
            """
    else:
        text = """\
            backend: x
            ops:
              aten.relu.default: {}
              aten.add.Tensor:
                dtypes: [flaot16]
            """
    err = manifest_error(text)
    assert err.line == line
    assert err.key.endswith("dtypes")
    assert "unknown dtype 'flaot16'" in str(err) and "did you mean 'float16'" in str(err)


def test_bad_device():
    err = manifest_error("""\
        backend: x
        defaults: {devices: [cpu, gpu]}
        """)
    assert err.key == "defaults.devices" and "unknown device 'gpu'" in str(err)


@pytest.mark.parametrize("op,expect", [
    ("aten.reluu.default", "did you mean 'aten.relu'"),
    ("aten.relu.fancy", "no overload 'fancy'"),
    ("relu", "namespace"),
])
def test_unknown_op(op, expect):
    err = manifest_error(f"""\
        backend: x
        ops:
          aten.add.Tensor: {{}}
          {op}: {{}}
        """)
    assert err.line == 4 and op in err.key
    assert expect in str(err)


def test_unknown_op_in_decompositions():
    err = manifest_error("""\
        backend: x
        decompositions: [aten.gelu, aten.geluu]
        """)
    assert err.key == "decompositions[1]"


def test_manifest_for_another_backend():
    err = manifest_error("backend: y\nops: {}\n", backend="x")
    assert err.key == "backend" and "'y'" in str(err) and "'x'" in str(err)


def test_unsupported_format():
    err = manifest_error("backend: x\nformat: 2\n")
    assert err.key == "format"


def test_lookup_order_exact_then_packet_then_wildcard():
    m = parse("""\
        backend: x
        defaults: {dtypes: [float32]}
        ops:
          aten.add.Tensor: {dtypes: [int64]}
          aten.add: {dtypes: [float16]}
          "*": {dtypes: [bool], dynamic: true}
        """)
    assert m.entry("aten.add.Tensor").dtypes == frozenset({torch.int64})  # exact
    assert m.entry("aten.add.Scalar").dtypes == frozenset({torch.float16})  # packet
    wild = m.entry("aten.mul.Tensor")  # wildcard
    assert wild.dtypes == frozenset({torch.bool}) and wild.dynamic is True
    # entries fall back to defaults for what they leave unset
    assert m.entry("aten.add.Tensor").dynamic is False


def test_packet_entry_without_wildcard():
    m = parse("backend: x\nops:\n  aten.add: {max_rank: 2}\n")
    assert m.entry("aten.add.Tensor").max_rank == 2
    assert m.entry("aten.add.Scalar").max_rank == 2
    assert m.entry("aten.sub.Tensor") is None


def test_load_manifest_file_errors_name_the_file(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("backend: x\nops:\n  aten.nope.default: {}\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(path, backend="x")
    assert info.value.file == str(path) and info.value.line == 3


def test_every_shipped_manifest_loads():
    names = arbiter.backend_names()
    assert {"eager", "inductor", "onnxruntime"} <= set(names)
    for name in names:
        cls = arbiter.get_backend_class(name)
        m = cls.manifest()
        assert m.backend == name
        assert cls.manifest_path().is_file()
    eager = arbiter.get_backend_class("eager").manifest()
    assert eager.entry("aten.anything_at_all.default") is not None  # wildcard
    assert eager.entry("aten.add.Tensor").dynamic is True
    ort = arbiter.get_backend_class("onnxruntime").manifest()
    assert ort.entry("aten.addmm.default") is not None
    # probed with symbols (`arbiter probe --dynamic`); ops never probed stay static
    assert ort.entry("aten.addmm.default").dynamic is True
    assert ort.defaults.dynamic is False
    ind = arbiter.get_backend_class("inductor").manifest()
    assert ind.entry("aten.gelu_backward.default") is not None


# -- manifests checked against node metadata --------------------------------------------
def _table(make_backend, ops, **kw):
    cls = make_backend("probe", ops, **kw)
    eager = arbiter.get_backend_class("eager")
    return CapabilityTable([cls(), eager()])


def test_dtype_refusal_names_dtype(make_backend):
    gm = trace(lambda x: torch.relu(x), torch.randn(3, dtype=torch.float64))
    table = _table(make_backend, ["aten.relu.default"])
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    sup = table.support(node)
    assert sup.candidates == ("eager",)
    assert "float64" in sup.refusals["probe"]


def test_max_rank_refusal(make_backend, tmp_path):
    cls = make_backend("ranked", [])
    (tmp_path / "ranked.yaml").write_text(
        "backend: ranked\nops:\n  aten.relu.default: {max_rank: 2}\n")
    eager = arbiter.get_backend_class("eager")
    table = CapabilityTable([cls(), eager()])
    small = trace(lambda x: torch.relu(x), torch.randn(2, 2))
    big = trace(lambda x: torch.relu(x), torch.randn(2, 2, 2))
    n_small = next(n for n in small.graph.nodes if n.op == "call_function")
    n_big = next(n for n in big.graph.nodes if n.op == "call_function")
    assert table.support(n_small).candidates == ("ranked", "eager")
    sup = table.support(n_big)
    assert sup.candidates == ("eager",) and "max_rank 2" in sup.refusals["ranked"]


def test_missing_op_refusal(make_backend):
    gm = trace(lambda x: torch.sigmoid(x), torch.randn(3))
    table = _table(make_backend, ["aten.relu.default"])
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    sup = table.support(node)
    assert "not in the probe manifest" in sup.refusals["probe"]


@pytest.mark.parametrize("text", ["backend: x\nops: {aten.relu.default: {}\n",
                                  "backend: x\nbackend: x\n"])
def test_yaml_level_manifest_errors_are_manifest_errors(text):
    with pytest.raises(ManifestError) as info:
        parse_manifest(text, file="m.yaml")
    assert info.value.line is not None


def test_an_op_unknown_to_this_torch_is_left_out_of_a_manifest_probed_with_another(caplog):
    probe = "probe: {date: '2026-11-26', torch: %s, backend_version: x}\n"
    text = ("backend: x\nops:\n  aten.relu.default: {}\n"
            "  aten.not_an_op_here.default: {}\n"
            "decompositions: [aten.not_an_op_here, aten.gelu]\n")
    with caplog.at_level("WARNING", logger="arbiter.manifest"):
        m = parse_manifest(text + probe % "'2.1.0'", "old.yaml")
    assert set(m.ops) == {"aten.relu.default"} and m.decompositions == ["aten.gelu"]
    assert "old.yaml: 2 op(s) unknown to torch" in caplog.text
    assert "probed with torch 2.1.0): aten.not_an_op_here.default, aten.not_an_op_here" \
        in caplog.text
    # probed with this torch (or not probed): a name it does not know is an error
    for tail in (probe % f"'{torch.__version__}'", ""):
        with pytest.raises(ManifestError, match="unknown op 'aten.not_an_op_here.default'"):
            parse_manifest(text + tail, "new.yaml")
