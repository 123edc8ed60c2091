"""compile_model properties a converted model needs to compute as eager does on the CPU plugin.

OpenVINO 2026.4's CPU plugin computes a rotary embedding followed by attention wrongly
when the query's head count equals its length in a static model: Llama-style attention
(RoPE, then SDPA) with 16 heads over 16 tokens came out with errors of 0.3-0.5 on
activations of RMS 1 (an attention of 8 heads over 8 tokens, 12 over 12, 4 over 4 too;
16 over 17, or 16 heads of 16 dims over 32 tokens, matched eager to 1e-6). It is the
plugin's: ``torch.export`` of the module, ``openvino.convert_model`` and
``compile_model`` give the same numbers without arbiter, and with Snippets (the plugin's
code generator, which fuses the attention's MatMul-Softmax-MatMul into one kernel)
disabled they match eager. The same model converted with a dynamic length matched at
every length, heads included. So a static model holding an attention or matrix product
whose rank-4 operand has dims 1 and 2 equal is compiled with ``SNIPPETS_MODE: DISABLE``;
every other model keeps Snippets (docs/design.md, "OpenVINO backend").
"""
from __future__ import annotations

#: the ops whose rank-4 operands the plugin's attention fusion reads as (batch, heads,
#: length, dims)
_ATTENTION_OPS = ("ScaledDotProductAttention", "MatMul")


def needs_snippets_off(model) -> bool:
    """Whether ``model`` (an ``openvino.Model``) holds the pattern above: an attention or
    matrix product with a static rank-4 operand whose heads equal its length."""
    for op in model.get_ordered_ops():
        if op.get_type_name() not in _ATTENTION_OPS:
            continue
        for k in range(op.get_input_size()):
            shape = op.get_input_partial_shape(k)
            if not shape.rank.is_static or shape.rank.get_length() != 4 or \
                    not shape.is_static:
                continue
            dims = shape.to_shape()
            if dims[1] == dims[2] > 1:
                return True
    return False


def properties_for(model, properties: dict) -> dict:
    """``properties`` with what ``model`` needs added (see the module)."""
    if needs_snippets_off(model) and "SNIPPETS_MODE" not in properties:
        return {**properties, "SNIPPETS_MODE": "DISABLE"}
    return properties
