"""An ExportedProgram written and read as data: no pickle, no code.

``torch.export.save`` is not that in torch 2.13 (``torch.export.load`` unpickles weights
and constants). So the program's graph is written by torch's own serializer
(``torch._export.serde.serialize``: JSON) without its weights, the weights as
safetensors, and reading hands both to torch's deserializer as dicts. That deserializer
still trusts the JSON's node targets (any attribute path under ``torch``, ``operator``
or ``math``) and size expressions (``sympy.sympify`` evaluates Python), so ``check``
first refuses any target outside ATen/prims ops, the quantize/dequantize ops of PT2E
(``quantized_decomposed``: a model the user quantized) and symbolic size arithmetic,
any size expression with other than sympy's number, symbol and arithmetic constructors,
and any higher-order op or script object; node metadata and guard code are dropped unread.
Afterwards every node's target is checked again. docs/deploy.md ("no code from the
file").
"""
from __future__ import annotations

import json
import operator
import re
from typing import Any

import torch

from ..errors import ArbiterError
from ..ops import register_namespaces

#: the op namespaces a saved program may call
NAMESPACES = ("aten", "prims", "quantized_decomposed")
_TARGET = re.compile(r"^torch\.ops\.(aten|prims|quantized_decomposed)"
                     r"\.[A-Za-z0-9_]+\.[A-Za-z0-9_]+$")
#: size arithmetic (symbolic graphs): python callables torch's serializer writes by name
_PY_TARGETS = {
    **{f"_operator.{n}": getattr(operator, n) for n in (
        "getitem", "add", "sub", "mul", "floordiv", "truediv", "mod", "neg", "pow", "eq",
        "ne", "lt", "le", "gt", "ge", "and_", "or_", "not_")},
    **{f"torch.{n}": getattr(torch, n) for n in (
        "sym_int", "sym_float", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sqrt")
       if hasattr(torch, n)},
    **{f"math.{n}": getattr(__import__("math"), n) for n in ("ceil", "floor", "trunc", "sqrt")},
}
_EXPR_TOKEN = re.compile(r"\s+|\*\*|[(),=*+\-/]|\d+(?:\.\d+)?(?:e[+-]?\d+)?"
                         r"|'[A-Za-z_][A-Za-z0-9_]*'|[A-Za-z_][A-Za-z0-9_]*")
#: names a size expression may use: sympy's constructors as ``srepr`` writes them, the
#: integer functions of torch.utils._sympy, assumptions, and symbol names (s0, u3...)
_EXPR_NAMES = frozenset({
    "Symbol", "Integer", "Rational", "Float", "Mul", "Add", "Pow", "Max", "Min", "Abs",
    "FloorDiv", "CleanDiv", "Mod", "PythonMod", "CeilToInt", "FloorToInt", "TruncToInt",
    "IntTrueDiv", "FloatTrueDiv", "ToFloat", "Eq", "Ne", "Lt", "Le", "Gt", "Ge",
    "StrictLessThan", "LessThan", "GreaterThan", "StrictGreaterThan", "Equality",
    "Unequality", "And", "Or", "Not", "Identity", "BooleanTrue", "BooleanFalse", "true",
    "false", "True", "False", "oo", "zoo", "nan", "Infinity", "NegativeInfinity",
    "integer", "positive", "negative", "nonnegative", "nonpositive", "real", "finite",
    "zero", "nonzero", "even", "odd", "rational", "precision"})
_SYMBOL_NAME = re.compile(r"^[a-z]+\d+$")
MAX_EXPR = 20_000


def to_bytes(ep: Any) -> tuple[bytes, dict[str, torch.Tensor]]:
    """(the program's JSON, its tensors by ``p:`` (parameters), ``s:`` (other state) or
    ``c:`` (constants) + name) for ``from_bytes``."""
    from torch._export.serde.serialize import serialize

    art = serialize(ep, serialize_state_dict=False, serialize_constants=False,
                    serialize_example_inputs=False)
    params = set(ep.graph_signature.parameters)
    tensors = {f"{'p' if k in params else 's'}:{k}": v for k, v in ep.state_dict.items()}
    tensors.update({f"c:{k}": v for k, v in ep.constants.items()})
    return art.exported_program, tensors


def from_bytes(program: bytes, tensors: dict[str, torch.Tensor], where: str) -> Any:
    """The ExportedProgram ``to_bytes`` wrote, after ``check`` (ArbiterError naming
    ``where`` when the JSON is refused)."""
    from torch._export.serde.schema import ExportedProgram
    from torch._export.serde.serialize import ExportedProgramDeserializer

    from .serde_fast import to_dataclass

    try:
        data = json.loads(program)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArbiterError(f"{where}: the program is not valid JSON ({exc})") from None
    check(data, where)
    state = {k[2:]: torch.nn.Parameter(v, requires_grad=False) if k[0] == "p" else v
             for k, v in tensors.items() if k[:2] in ("s:", "p:")}
    consts = {k[2:]: v for k, v in tensors.items() if k.startswith("c:")}
    try:
        # torch.export.serde's deserialize(), with the dataclasses made by serde_fast
        program_dc = to_dataclass(ExportedProgram, data)
        ep = ExportedProgramDeserializer(None).deserialize(program_dc, state, consts, b"")
    except Exception as exc:  # noqa: BLE001 - a malformed program, said where
        raise ArbiterError(f"{where}: torch could not read the program "
                           f"({type(exc).__name__}: {str(exc)[:300]})") from exc
    for n in ep.graph.nodes:
        if n.op == "call_function" and not _allowed(n.target):
            raise ArbiterError(f"{where}: node {n.name} calls {n.target!r}, which is "
                               f"not an op of {', '.join(NAMESPACES)}")
        if n.op in ("call_module", "call_method"):
            raise ArbiterError(f"{where}: node {n.name} is a {n.op}")
    return ep


def _allowed(target: Any) -> bool:
    if isinstance(target, torch._ops.OpOverload):
        return target.namespace in NAMESPACES
    return any(target is f for f in _PY_TARGETS.values())


def check(data: Any, where: str) -> None:
    """Refuse what torch's deserializer would run or resolve unchecked (see the module);
    strips node metadata and guard code in place."""
    if not isinstance(data, dict) or not isinstance(data.get("graph_module"), dict):
        raise ArbiterError(f"{where}: not a serialized ExportedProgram")
    data["guards_code"] = []
    gm = data["graph_module"]
    gm["metadata"] = {}
    graph = gm.get("graph")
    if not isinstance(graph, dict) or not isinstance(graph.get("nodes"), list):
        raise ArbiterError(f"{where}: the program has no graph")
    for node in graph["nodes"]:
        target = node.get("target") if isinstance(node, dict) else None
        if not isinstance(target, str) or not (_TARGET.match(target) or target in _PY_TARGETS):
            raise ArbiterError(f"{where}: a node calls {target!r}; a saved program may call "
                               "ATen, prims and quantized_decomposed ops and size "
                               "arithmetic only")
        if target.startswith("torch.ops.quantized_decomposed."):
            register_namespaces()  # torch registers those ops when their module is imported
        node["metadata"] = {}
    _walk(data, where)


def _walk(x: Any, where: str) -> None:
    if isinstance(x, dict):
        for k, v in x.items():
            if k in ("as_custom_obj", "as_graph", "as_custom_objs"):
                raise ArbiterError(f"{where}: the program holds a {k[3:]} (script objects "
                                   "and higher-order ops are not loaded)")
            if k == "expr_str":
                check_expr(v, where)
            else:
                _walk(v, where)
    elif isinstance(x, list):
        for v in x:
            _walk(v, where)


def check_expr(text: Any, where: str) -> None:
    """Refuse a size expression that is more than sympy arithmetic (see the module)."""
    if not isinstance(text, str) or len(text) > MAX_EXPR:
        raise ArbiterError(f"{where}: a size expression is not a string of at most "
                           f"{MAX_EXPR} characters")
    pos = 0
    while pos < len(text):
        m = _EXPR_TOKEN.match(text, pos)
        if m is None:
            raise ArbiterError(f"{where}: size expression {text[:80]!r}: character "
                               f"{text[pos]!r} is not allowed")
        tok = m.group()
        if tok[0].isalpha() or tok[0] == "_":
            if tok not in _EXPR_NAMES and not _SYMBOL_NAME.match(tok):
                raise ArbiterError(f"{where}: size expression {text[:80]!r}: name {tok!r} "
                                   "is not allowed")
        pos = m.end()
