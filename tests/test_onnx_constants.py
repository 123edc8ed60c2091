"""ONNX models that refer to their partition's constants (backends/_onnx_constants.py)."""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install "
                    "'torch-arbiter[onnxruntime]')")
onnx = pytest.importorskip("onnx", reason="needs onnx (pip install 'torch-arbiter[onnxruntime]')")

from arbiter.backends._onnx_constants import (  # noqa: E402
    LOCATION, META_KEY, TRANSPOSED, constants, inline_constants, resolve)
from arbiter.backends._onnx_export import export_onnx  # noqa: E402
from arbiter.backends.onnxruntime import OnnxRuntime  # noqa: E402

from conftest import trace  # noqa: E402


def _graph():
    """An ATen graph whose weights are constants (``get_attr``), as a frozen partition's."""
    torch.manual_seed(0)
    weights = {"w1": torch.randn(128, 64), "b1": torch.randn(128), "w2": torch.randn(64, 128),
               "small": torch.randn(4, 4)}  # the bias and ``small``: under MIN_BYTES

    def fn(x, w1, b1, w2, small):
        h = torch.relu(torch.nn.functional.linear(x, w1, b1))
        return (torch.nn.functional.linear(h, w2) @ small.repeat(16, 1),)

    x = torch.randn(3, 64)
    gm = trace(fn, x, *weights.values())
    names = iter(weights)
    for node in [n for n in gm.graph.nodes if n.op == "placeholder"][1:]:
        name = next(names)
        setattr(gm, name, weights[name])
        with gm.graph.inserting_before(node):
            attr = gm.graph.get_attr(name)
        attr.meta = dict(node.meta)
        node.replace_all_uses_with(attr)
        gm.graph.erase_node(node)
    gm.recompile()
    return gm, x, lambda x: fn(x, *weights.values())


def _model(gm, x, optimize=True):
    return export_onnx(gm, (x,), optimize=optimize, by_reference=True)


@pytest.mark.parametrize("optimize", [True, False])
def test_weights_are_referred_to_by_position_not_copied(optimize):
    gm, x, _ = _graph()
    model = _model(gm, x, optimize)
    external = {i.name: i for i in model.graph.initializer
                if i.data_location == onnx.TensorProto.EXTERNAL}
    refs = json.loads({p.key: p.value for p in model.metadata_props}[META_KEY])
    assert set(refs) == set(external) and len(refs) == 2  # both matrices; the bias is 512 B
    values = constants(gm)
    for name, ref in refs.items():
        init = external[name]
        assert not init.raw_data and {e.key: e.value for e in init.external_data}["location"] \
            == LOCATION
        t = values[int(ref.removeprefix(TRANSPOSED))]
        shape = tuple(t.t().shape) if ref.startswith(TRANSPOSED) else tuple(t.shape)
        assert tuple(init.dims) == shape
    # the model is the weights' size no more
    assert len(model.SerializeToString()) < 4 * (128 * 64 + 64 * 128) / 4


@pytest.mark.parametrize("optimize", [True, False])
def test_inlined_and_referring_sessions_agree_with_eager(optimize):
    import onnxruntime as ort

    gm, x, fn = _graph()
    model_bytes = _model(gm, x, optimize).SerializeToString()
    found = resolve(model_bytes, gm)
    assert len(found) == 2
    whole = inline_constants(model_bytes, found)
    assert len(whole) > 4 * (128 * 64 * 2)
    parsed = onnx.ModelProto.FromString(whole)
    assert all(i.data_location != onnx.TensorProto.EXTERNAL for i in parsed.graph.initializer)
    assert META_KEY not in {p.key for p in parsed.metadata_props}
    sess = ort.InferenceSession(whole, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    torch.testing.assert_close(torch.from_numpy(sess.run(None, {name: x.numpy()})[0]),
                               fn(x)[0], rtol=1e-4, atol=1e-4)
    out = OnnxRuntime().compile(gm, [x])(x)
    torch.testing.assert_close(out[0], fn(x)[0], rtol=1e-4, atol=1e-4)


def test_a_reference_to_a_constant_the_graph_lacks_is_an_error_naming_it():
    gm, x, _ = _graph()
    model = _model(gm, x)
    refs = json.loads({p.key: p.value for p in model.metadata_props}[META_KEY])
    name = sorted(refs)[0]
    for p in model.metadata_props:
        if p.key == META_KEY:
            p.value = json.dumps({**refs, name: "99"})
    with pytest.raises(ValueError, match=f"initializer '{name}' refers to constant '99'"):
        resolve(model.SerializeToString(), gm)


def test_a_graph_without_constants_exports_whole():
    gm = trace(lambda a, b: (a @ b,), torch.randn(64, 64), torch.randn(64, 64))
    model = export_onnx(gm, (torch.randn(64, 64), torch.randn(64, 64)), by_reference=True)
    assert META_KEY not in {p.key for p in model.metadata_props}
    assert resolve(model.SerializeToString(), gm) == {}
