"""An ATen partition -> ``openvino.Model``, by OpenVINO's own PyTorch frontend.

Two ways in, one set of op translations (OpenVINO's; none are written here): **direct**,
tried first, hands the partition's graph to OpenVINO's FX decoder
(``TorchFXPythonDecoder``), as OpenVINO's own torch.compile backend does; the decoder
must stay referenced until ``FrontEnd.convert`` returns (a collected one fails with "pure
virtual function TorchDecoder::decoder_type_name"). **export**, where the decoder fails
(an op it has no rule for, such as the ``*_backward`` ops), runs ``torch.export`` of the
partition (non-strict, its real inputs) and ``openvino.convert_model``, which decomposes
first (BERT-base: 3.3 s against the direct way's 0.25 s, to the same model). Views
become reshapes for the export way only. The probe goes through ``convert`` like any
partition, so its verdicts are this function's. docs/design.md ("OpenVINO backend").
"""
from __future__ import annotations

import logging
import operator

import torch

from arbiter.decompose.masked_rows import guard_masked_rows
from arbiter.decompose.tracing import traced_call
from arbiter.ops import is_dequantize, is_quantize
from arbiter.shapes import bounds, expr, input_values, shape_env_of

from ._export import export_program, quiet

log = logging.getLogger(__name__)


def convert(gm: torch.fx.GraphModule, args: tuple, dtypes: dict, dynamic: bool = False):
    """An ATen FX graph -> openvino.Model, with the inputs' dtypes (``dtypes``: torch
    dtype -> OpenVINO type name) and shapes fixed: static, or (``dynamic``) bounded by
    the symbols' ranges."""
    import openvino as ov

    with quiet():
        try:
            model = _convert_direct(_for_openvino(gm, reshape=False), dynamic)
        except Exception as exc:  # noqa: BLE001 - the export way, as before
            log.debug("openvino: the direct conversion failed (%s); by torch.export",
                      _conversion_summary(str(exc)))
            model = None
        if model is None:
            exported = export_program(_for_openvino(gm), args, dynamic=dynamic)
            try:
                model = ov.convert_model(exported)
            except Exception as exc:
                raise RuntimeError(f"OpenVINO could not convert the partition: "
                                   f"{_conversion_summary(str(exc))}") from exc
    if len(model.inputs) != len(args):
        raise RuntimeError(f"converted model has {len(model.inputs)} inputs, partition has "
                           f"{len(args)}")
    # Both paths give dynamic dimensions, even for static sizes; static shapes let the
    # plugin plan memory and kernels, and bounds let it refuse a size out of range.
    values = input_values(gm)
    for i, a in enumerate(args):
        node = model.inputs[i].get_node()
        if not isinstance(a, torch.Tensor):  # a size no tensor input carries: int64 scalar
            node.set_element_type(ov.Type.i64)
            node.set_partial_shape(ov.PartialShape([]))
            continue
        node.set_element_type(getattr(ov.Type, dtypes[a.dtype]))
        node.set_partial_shape(_partial_shape(values[i], a) if dynamic
                               else ov.PartialShape(list(a.shape)))
    model.validate_nodes_and_infer_types()
    return model


def _convert_direct(gm: torch.fx.GraphModule, dynamic: bool):
    from openvino.frontend import FrontEndManager
    from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder

    decoder = TorchFXPythonDecoder(gm, dynamic_shapes=dynamic)  # referenced to the end
    frontend = FrontEndManager().load_by_framework("pytorch")
    model = frontend.convert(frontend.load(decoder))
    del decoder
    return model


def _for_openvino(gm: torch.fx.GraphModule, reshape: bool = True) -> torch.fx.GraphModule:
    """``gm`` rewritten for OpenVINO's frontend (a copy of the graph; constants shared):

    * (``reshape``: the export way) every ``aten.view`` a ``aten.reshape``. The frontend runs decompositions again on
      the ExportedProgram, and there the strides of some values differ from those traced
      (the output of SDPA's CPU kernel in BERT and GPT-2): ``view`` then failed ("Cannot
      view a tensor with shape [4, 32, 256] and strides (256, 1024, 1)"), and the whole
      partition fell back to the next backend. A reshape is a view where one is possible;
      the partition is functional and its outputs are copied into torch's buffers anyway;
    * ``_scaled_dot_product_flash_attention_for_cpu`` (what AOTAutograd makes of SDPA on
      CPU) whose log-sum-exp no node reads, ``aten.scaled_dot_product_attention``: the
      frontend translates that into OpenVINO's fused attention, the other into MatMul,
      Softmax and Transposes (on the BERT-style encoder of bench/dynamic_shapes.py: 4
      Transposes instead of 16, no Broadcast or Reorder nodes in the symbolic model).
      Grouped heads (``enable_gqa``: key and value with fewer heads) are repeated to the
      query's first (``_repeat_heads``): OpenVINO's attention takes equal heads only
      ("key_input_correctness"), and its translation of the kernel failed on them too.
      A row of a float mask at -inf everywhere (a query that sees no key) gets eager's 0,
      not OpenVINO's NaN (``arbiter.decompose.masked_rows``, before the fusion). Random
      ones (``dropout_p`` > 0) never reach a backend;
    * a PT2E dequantize of integer codes no quantize in the partition made (a constant
      int8 weight, codes read from an input), its arithmetic (``_dequantize_codes``).
      The frontend makes a quantize and the dequantize of it one FakeQuantize, and skips
      any other dequantize: the codes went on undequantized ("MatMul ... i8").
      OpenVINO's low-precision transformations take the weight's convert, subtract and
      multiply for a dequantization, and run the layer in int8 (FullyConnected ``i8``)."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    view = torch.ops.aten.view.default if reshape else None
    if not any(n.target in (view, flash) or of_codes(n) for n in gm.graph.nodes):
        return gm
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    guard_masked_rows(graph, gm)  # before the fusion below: eager's 0 where no key
    for n in list(graph.nodes):
        if n.op != "call_function":
            continue
        if view is not None and n.target is view:
            n.target = torch.ops.aten.reshape.default
        elif n.target is flash:
            _fuse_attention(graph, n)
        elif of_codes(n):
            _dequantize_codes(graph, n)
    graph.lint()
    return torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)


def _fuse_attention(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """Replace one ``_scaled_dot_product_flash_attention_for_cpu`` by SDPA (see above)."""
    users = list(node.users)
    if any(u.target is not operator.getitem or (u.args[1] != 0 and u.users) for u in users):
        return  # the log-sum-exp is read (a backward graph): keep the op as it is
    names = [a.name for a in node.target._schema.arguments]
    bound = dict(zip(names, node.args), **node.kwargs)
    if bound.get("dropout_p", 0.0) != 0.0:
        return
    groups = _groups(bound["query"], bound["key"], bound["value"])
    if groups is None:
        return
    with graph.inserting_before(node):
        key, value = (_repeat_heads(graph, bound[k], groups) for k in ("key", "value"))
        sdpa = graph.call_function(
            torch.ops.aten.scaled_dot_product_attention.default,
            (bound["query"], key, value, bound.get("attn_mask"), 0.0,
             bool(bound.get("is_causal", False))), {"scale": bound.get("scale")})
    sdpa.meta = dict(node.meta)
    if isinstance(node.meta.get("val"), (tuple, list)):
        sdpa.meta["val"] = node.meta["val"][0]
    for u in users:
        if u.args[1] == 0:
            u.replace_all_uses_with(sdpa)
        graph.erase_node(u)
    graph.erase_node(node)


def of_codes(node: torch.fx.Node) -> bool:
    """Whether ``node`` dequantizes codes that no quantize before it made: what
    ``_dequantize_codes`` rewrites, and what the validators (backends/_openvino_checks.py)
    take only in float32."""
    codes = node.args[0] if node.args else None
    return is_dequantize(node) and not (isinstance(codes, torch.fx.Node) and is_quantize(codes))


def _dequantize_codes(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """Replace one PT2E dequantize of codes by eager's arithmetic on them, float32:
    ``(codes - zero_point) * scale``, per channel with the scales and zero points along
    ``axis`` (the codes and zero points are integers below 2**24, exact in float32, so
    the difference is eager's integer one). Other output dtypes and scales are refused
    before (backends/_openvino_checks.py)."""
    aten = torch.ops.aten
    names = [a.name for a in node.target._schema.arguments]
    bound = dict(zip(names, node.args), **node.kwargs)
    codes = bound["input"]
    if not all(isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)
               for a in node.all_input_nodes):
        # left as it is, the frontend would hand the codes on undequantized
        raise RuntimeError(f"{node.name}: a dequantize whose inputs have no traced values "
                           "(its arithmetic cannot be written out for OpenVINO)")
    rank = codes.meta["val"].dim()

    def call(op, *args, **kwargs):
        return traced_call(graph, op, *args, **kwargs)

    def along_axis(t: torch.fx.Node) -> torch.fx.Node:  # (C,) -> broadcast on axis
        shape = [1] * rank
        shape[bound["axis"] % rank] = -1
        # a view: the FX decoder has no rule for aten.reshape (a reshape sent BERT-base's
        # int8 partition the export way, 18 s against 1)
        return call(aten.view.default, call(aten._to_copy.default, t,
                                            dtype=torch.float32), shape)

    with graph.inserting_before(node):
        out = call(aten._to_copy.default, codes, dtype=torch.float32)
        if "scales" in bound:  # per channel
            if bound.get("zero_points") is not None:
                out = call(aten.sub.Tensor, out, along_axis(bound["zero_points"]))
            out = call(aten.mul.Tensor, out, along_axis(bound["scales"]))
        else:
            out = call(aten.sub.Tensor, out, bound["zero_point"])
            out = call(aten.mul.Tensor, out, bound["scale"])
    node.replace_all_uses_with(out)
    graph.erase_node(node)


def _groups(*nodes: torch.fx.Node):
    """Query heads per key/value head of an attention (grouped-query attention: the CPU
    flash kernel takes key and value with fewer heads; OpenVINO's attention does not),
    or None where the heads are not static or do not divide. Without traced values (or
    other than 4-d) 1: fused as it was before grouped heads were looked at."""
    from arbiter.decompose.own import head_groups

    vals = [n.meta.get("val") if isinstance(n, torch.fx.Node) else None for n in nodes]
    if any(not isinstance(v, torch.Tensor) or v.dim() != 4 for v in vals):
        return 1
    return head_groups(*vals)


def _repeat_heads(graph: torch.fx.Graph, node: torch.fx.Node, groups: int) -> torch.fx.Node:
    """``node`` (batch, heads, length, dim) with each head repeated ``groups`` times in
    place (``repeat_interleave`` on the heads, SDPA's ``enable_gqa``), as nodes OpenVINO
    converts; sizes left to the runtime (-1, flatten), so a symbolic length stays so."""
    if groups == 1:
        return node
    aten = torch.ops.aten
    out = node
    steps = ((aten.unsqueeze.default, (2,)),
             (aten.expand.default, ([-1, -1, groups, -1, -1],)),
             (aten.flatten.using_ints, (1, 2)))
    for op, args in steps:
        out = traced_call(graph, op, out, *args)
    return out


def _partial_shape(value, arg: torch.Tensor):
    """A placeholder's shape for OpenVINO: static sizes as they are, symbolic ones as
    ``Dimension(min, max)`` from the ShapeEnv (-1: no upper bound)."""
    import openvino as ov

    if not isinstance(value, torch.Tensor):
        return ov.PartialShape(list(arg.shape))
    env = shape_env_of([value])
    dims = []
    for s in value.shape:
        e = expr(s)
        if e.is_number or env is None:
            dims.append(ov.Dimension(int(e)))
            continue
        lo, hi = bounds(e, env)
        dims.append(ov.Dimension(lo, -1 if hi is None else hi))
    return ov.PartialShape(dims)


def _conversion_summary(message: str) -> str:
    """The ops OpenVINO's frontend names as failed, and the first reason it gives; its
    full message (tens of lines, starting with a C++ source location) stays on the cause."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    failed = next((ln for ln in lines if ln.startswith("-- Conversion is failed for:")), None)
    reason = next((ln for ln in lines if ln.startswith("Check '") and "unconverted_ops" not in ln
                   or "out of" in ln or ln.startswith("Exception happened")), None)
    parts = [p for p in (failed and failed[3:], reason) if p]
    return "; ".join(parts) if parts else (lines[0] if lines else message)


