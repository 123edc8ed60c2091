"""Operator names, and what a node or a graph is, as facts read off FX.

An ATen overload is written ``aten.addmm.default``; a name without the overload
(``aten.addmm``) means every overload of that op. Names are checked against torch's own
operator registry, so a typo fails with a suggestion instead of matching nothing.

Node facts (``is_getitem``, ``is_random``, ``is_mutating``, ``produces_tensor``) and graph
facts (``tensors_in`` a value, ``output_values`` of a graph) are what every stage asks of
a node; they live here so that no stage borrows them from another.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import operator
from collections.abc import Iterator
from typing import Any, Optional

import torch

from .errors import UnknownOpError, did_you_mean


@functools.lru_cache(maxsize=None)
def op_name(target: Any) -> str:
    """The canonical name of an FX node target (``aten.addmm.default``)."""
    if isinstance(target, torch._ops.OpOverload):
        ns, rest = target.name().split("::", 1)
        base, _, overload = rest.partition(".")
        return f"{ns}.{base}.{overload or 'default'}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return str(target._qualified_op_name).replace("::", ".")
    if target is operator.getitem:
        return "getitem"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    return f"{module}.{name}" if module else name


def packet_name(name: str) -> str:
    """``aten.addmm.default`` -> ``aten.addmm``."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) >= 3 else name


#: Operator namespaces torch registers only when a module of its own is imported: PT2E's
#: quantize/dequantize ops (``torch.ao.quantization.fx._decomposed``, ~30 ms), which a
#: manifest may name before any quantized model was loaded.
_REGISTERED_ON_IMPORT = {"quantized_decomposed": "torch.ao.quantization.fx._decomposed"}


@functools.lru_cache(maxsize=None)
def resolve(name: str) -> str:
    """Check that ``name`` names a torch operator (or all overloads of one).

    Returns the canonical name; raises UnknownOpError naming what would be valid.
    """
    parts = name.split(".")
    if len(parts) not in (2, 3) or not all(parts):
        raise UnknownOpError(
            f"op {name!r} is not of the form 'namespace.op' or 'namespace.op.overload' "
            "(for example 'aten.addmm' or 'aten.addmm.default')")
    ns, base = parts[0], parts[1]
    if ns in _REGISTERED_ON_IMPORT:
        importlib.import_module(_REGISTERED_ON_IMPORT[ns])
    namespace = getattr(torch.ops, ns, None)
    packet = None
    if namespace is not None:
        try:
            packet = getattr(namespace, base)
        except (AttributeError, RuntimeError):
            packet = None
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        known = [f"{ns}.{n}" for n in dir(namespace)] if namespace is not None else []
        raise UnknownOpError(f"unknown op {name!r}{did_you_mean(f'{ns}.{base}', known)}")
    if len(parts) == 3:
        overloads = packet.overloads()
        if parts[2] not in overloads:
            raise UnknownOpError(
                f"op {ns}.{base} has no overload {parts[2]!r}; valid: "
                + ", ".join(sorted(overloads)))
    return name


#: The operator namespaces a backend declares ops from (``Backend.declared_ops``): ATen,
#: and PT2E's quantize/dequantize ops (a model quantized with torchao's ``convert_pt2e``).
DECLARED_NAMESPACES = ("aten", "quantized_decomposed")


def register_namespaces() -> None:
    """Register the operator namespaces torch registers on import (``_REGISTERED_ON_IMPORT``):
    before a table of ops is read whose source (an exporter's registry) lists only the
    ops torch has when it is built."""
    for module in _REGISTERED_ON_IMPORT.values():
        importlib.import_module(module)


def declared_overloads(namespace: str, base: str, overload: str = "",
                       every: bool = False) -> list:
    """The OpOverloads a backend's own table names as ``namespace``, ``base`` and
    ``overload`` (none when the namespace is not in ``DECLARED_NAMESPACES`` or torch has no
    such op); no overload: ``default``, or every overload when ``every``."""
    if namespace not in DECLARED_NAMESPACES:
        return []
    register_namespaces()
    try:
        packet = getattr(getattr(torch.ops, namespace), base)
    except (AttributeError, RuntimeError):
        return []
    names = [overload] if overload else list(packet.overloads()) if every else ["default"]
    return [getattr(packet, n) for n in names if n in packet.overloads()]


def is_quantization_op(name: str) -> bool:
    """Whether the op ``name`` quantizes or dequantizes (PT2E's ``quantized_decomposed``
    ops, torch's own ``quantize_per_tensor``, fake quantization in a QAT graph)."""
    namespace, _, rest = name.partition(".")
    return namespace == "quantized_decomposed" or "quantize" in rest.partition(".")[0]


def is_quantization(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls a quantize or dequantize op (``is_quantization_op``)."""
    return node.op == "call_function" and is_quantization_op(op_name(node.target))


def is_dequantize(node: torch.fx.Node) -> bool:
    """Whether ``node`` dequantizes (PT2E's ``dequantize_per_tensor``/``_per_channel``):
    integer codes in, the float values the op after it computes with out."""
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and node.target.namespace == "quantized_decomposed"
            and node.target._opname.startswith("dequantize"))


def dequantizes_constants(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` dequantizes a constant it holds (``get_attr``): a PT2E model's int8
    weight, frozen into the graph."""
    return any(is_dequantize(n) and n.args and isinstance(n.args[0], torch.fx.Node)
               and n.args[0].op == "get_attr" for n in gm.graph.nodes)


def is_quantize(node: torch.fx.Node) -> bool:
    """Whether ``node`` quantizes (a quantization op that is not a dequantize): floats in,
    integer codes out."""
    return is_quantization(node) and not is_dequantize(node)


# -- node and graph facts --------------------------------------------------------------
def is_getitem(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is operator.getitem


def is_random(node: torch.fx.Node) -> bool:
    """Whether ``node`` draws random numbers. Attention ops carry the random tag for their
    ``dropout_p`` argument; with ``dropout_p == 0`` (every inference graph) they draw
    nothing and may go to any backend able to run them."""
    target = node.target
    if not (isinstance(target, torch._ops.OpOverload)
            and torch.Tag.nondeterministic_seeded in target.tags):
        return False
    index = _dropout_index(target)
    if index is None:
        return True
    arg = target._schema.arguments[index]
    p = node.args[index] if index < len(node.args) else node.kwargs.get(arg.name, arg.default_value)
    return not (isinstance(p, (int, float)) and p == 0)


_DROPOUT_INDEX: dict[Any, Optional[int]] = {}


def _dropout_index(target: torch._ops.OpOverload) -> Optional[int]:
    """Position of a ``dropout_p`` argument of a random-tagged op, or None."""
    try:
        return _DROPOUT_INDEX[target]
    except KeyError:
        names = [a.name for a in target._schema.arguments]
        index = _DROPOUT_INDEX[target] = names.index("dropout_p") if "dropout_p" in names else None
        return index


def random_depends_on_args(node: torch.fx.Node) -> bool:
    """Whether ``is_random`` of this node's op depends on its arguments (not the op alone)."""
    target = node.target
    return (isinstance(target, torch._ops.OpOverload)
            and torch.Tag.nondeterministic_seeded in target.tags
            and _dropout_index(target) is not None)


def reads_floating(node: torch.fx.Node) -> bool:
    """Whether ``node`` reads a floating-point tensor (its inputs' ``meta["val"]``)."""
    for inp in node.all_input_nodes:
        if any(t.is_floating_point() for t in tensors_in(inp.meta.get("val"))):
            return True
    return False


def nonfinite_validators(table: dict[str, str], backend: str) -> dict:
    """Validators refusing the ops of ``table`` ({op: how it differs}) on floating-point
    inputs: ops whose results differ from eager when the inputs hold NaN, inf, -0.0 or
    huge values (``arbiter probe`` feeds those). Shared by backends with an
    ``exact_nonfinite`` option."""
    def make(op: str, how: str):
        def check(node: torch.fx.Node) -> Optional[str]:
            if reads_floating(node):
                return (f"{how} on {backend} (eager differs; refused on floating inputs "
                        f"while the backend option exact_nonfinite is true)")
            return None
        check.__name__ = f"nonfinite_{op.replace('.', '_')}"
        return check

    return {op: make(op, how) for op, how in table.items()}


def nonfinite_nodes(gm: torch.fx.GraphModule, checks: dict) -> list[str]:
    """The ops of ``gm`` that ``checks`` (from ``nonfinite_validators``) would refuse:
    what a backend computes unlike eager when an input holds NaN or inf. A backend whose
    ``exact_nonfinite`` is ``guard`` names them (``Backend.nonfinite_guard``), and the
    partition then checks its inputs on every call (arbiter/run/piece.py)."""
    out = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = op_name(node.target)
        check = checks.get(name) or checks.get(packet_name(name))
        if check is not None and check(node) is not None:
            out.add(name)
    return sorted(out)


def is_mutating(node: torch.fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable


def produces_tensor(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return True
    if isinstance(val, (list, tuple)):
        return any(isinstance(v, torch.Tensor) for v in val)
    return val is None and "val" not in node.meta  # unknown: assume a tensor


def tensors_in(value: Any) -> list:
    """The tensors in a ``meta["val"]`` (a tensor, or nested lists/tuples of values), in
    order; other values are left out."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    return []


#: Tensors of at most this many elements in all are checked with one sum (``all_finite``).
_SMALL = 1 << 16
#: dtypes numpy sums (on CPU), and the dtype each is summed in: float16 in float32, so
#: that a sum of ordinary float16 values does not overflow into a needless element-wise
#: confirmation.
_NUMPY_SUM = {torch.float16: "float32", torch.float32: None, torch.float64: None}


def _as_numpy(t: torch.Tensor):
    """``t``'s memory as a numpy array (no copy), or None where numpy cannot hold it
    (another device, bfloat16, a tensor subclass, a layout other than strided)."""
    if t.dtype not in _NUMPY_SUM or t.device.type != "cpu" or t.layout != torch.strided \
            or type(t) not in (torch.Tensor, torch.nn.Parameter):
        return None
    try:
        return t.detach().numpy()
    except (RuntimeError, TypeError):
        return None


def all_finite(tensors) -> bool:
    """Whether every floating tensor among ``tensors`` is free of NaN and inf: one sum each
    (NaN and inf survive a sum; 15 us for 150k float32 values, where
    ``isfinite(t).all()`` took milliseconds), confirmed element-wise only when the sum is
    not finite (finite values can overflow it). Small tensors of one dtype are summed
    together (a norm's twelve ``rsqrt`` rows: 3 calls, not 24).

    CPU tensors of the dtypes numpy has are summed by numpy, on the calling thread: a
    torch sum of a large tensor runs on torch's OpenMP pool, whose threads then spin
    (``OMP_WAIT_POLICY`` unset) on the cores the backend called next needs. That made
    ResNet-50 on OpenVINO 18% slower through arbiter than alone (bench/README.md,
    "Going through arbiter"); torch's sum took 9.8 ms against numpy's 0.13 ms for the
    ResNet-50 input on a loaded machine. Others (bfloat16, other devices) use torch."""
    tensors = [t for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point()
               and t.numel()]
    if not tensors:
        return True
    import numpy as np

    arrays = [_as_numpy(t) for t in tensors]
    # a sum of finite values past the dtype's range, or of +inf and -inf, is what the
    # sum is for: numpy's warnings about them are not the user's
    with np.errstate(over="ignore", invalid="ignore"):
        if 1 < len(tensors) and sum(t.numel() for t in tensors) <= _SMALL and \
                len({t.dtype for t in tensors}) == 1:
            if all(a is not None for a in arrays):
                merged = np.concatenate([a.reshape(-1) for a in arrays])
                whole = (tensors[0], merged)
            elif all(a is None for a in arrays):
                whole = (torch.cat([t.reshape(-1) for t in tensors]), None)
            else:
                whole = None
            if whole is not None and _sum_finite(*whole):
                return True
        return all(_sum_finite(t, a) or _each_finite(t, a) for t, a in zip(tensors, arrays))


def _sum_finite(t: torch.Tensor, a: Any) -> bool:
    """Whether the sum of ``t``'s values is finite: by numpy over ``a`` (``t``'s memory,
    ``_as_numpy``; ``t`` gives the dtype to sum in), else by torch."""
    if a is None:
        return bool(torch.isfinite(t.sum()))
    import numpy as np

    return bool(np.isfinite(np.add.reduce(a, axis=None, dtype=_NUMPY_SUM[t.dtype])))


def _each_finite(t: torch.Tensor, a: Any) -> bool:
    """Whether every value of ``t`` is finite, element by element (``a`` as above)."""
    if a is None:
        return bool(torch.isfinite(t).all())
    import numpy as np

    return bool(np.isfinite(a).all())


@contextlib.contextmanager
def real_tensors() -> Iterator[None]:
    """Real tensors inside a compile: Dynamo's backend call runs under AOTAutograd's
    fake and functional modes and Dynamo's tracing context; work that computes real
    values or traces graphs of its own there (folding constants, tracing a pattern, a
    calibration) sets both aside on this thread for its duration."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch._guards.tracing(None):
        yield


@contextlib.contextmanager
def without_first_call_checks() -> Iterator[None]:
    """Steps out of the dispatch mode AOTAutograd puts around a compiled graph's first
    call (``_AnalyzeCustomOpInputOutputMode``: it flattens every ATen op's arguments to
    check custom ops' aliasing) for the work inside it, when it is the only mode: run
    under it, a first call's timing measured every op dispatched from Python at ~40 us
    more (a decode step on Inductor, its matmuls aten calls: 1.9 ms timed against 0.6-0.8
    ms outside it), ranking eager and Inductor behind backends that run in one C++
    call. Any other mode (a user's, a fake one while tracing) is left in place."""
    from torch.utils._python_dispatch import (_disable_current_modes,
                                              _get_current_dispatch_mode_stack)

    stack = _get_current_dispatch_mode_stack()
    if stack and all(type(m).__name__ == "_AnalyzeCustomOpInputOutputMode" for m in stack):
        with _disable_current_modes():
            yield
    else:
        yield


def attr_value(module: torch.nn.Module, target: str) -> Any:
    """What a ``get_attr`` node's dotted ``target`` names on ``module``."""
    return operator.attrgetter(target)(module)


def output_values(gm: torch.fx.GraphModule) -> Optional[list]:
    """The traced value (``meta["val"]``) of each output of a graph returning a tuple,
    in order: a tensor, another value, or None where an output has no metadata; None
    when the graph does not return a tuple or list."""
    out = next((n for n in reversed(gm.graph.nodes) if n.op == "output"), None)
    if out is None or not isinstance(out.args[0], (tuple, list)):
        return None
    return [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in out.args[0]]


#: Argument and return names under which ATen schemas pass positions into another
#: tensor (gather's ``index``, index_put's ``indices``, an embedding bag's ``offsets``,
#: a loss's class ``target``, topk's and sort's returned ``indices``...): their values are
#: bounded by the sizes of the tensors they index.
INDEX_NAMES = frozenset({"index", "indices", "offsets", "offset2bag", "bag_size",
                         "max_indices", "target", "targets", "input_lengths",
                         "target_lengths"})
#: Unnamed returns that are positions, by op (every overload).
INDEX_RETURNS = {
    "aten.max_pool2d_with_indices": (1,), "aten.max_pool3d_with_indices": (1,),
    "aten.adaptive_max_pool2d": (1,), "aten.adaptive_max_pool3d": (1,),
    "aten.argmax": (0,), "aten.argmin": (0,),
    "aten._embedding_bag": (1, 2, 3), "aten._embedding_bag_forward_only": (1, 2, 3),
}


#: Ops that move their data argument's values without computing new ones (``DATA_ARGS``
#: names that argument): when every reader of their output takes it as positions, the
#: values they move are positions too (BERT's token-type ids: an int64 buffer sliced,
#: expanded and gathered, then read as an embedding's indices).
DATA_MOVES = frozenset({
    "aten.slice", "aten.expand", "aten.view", "aten.reshape", "aten._unsafe_view",
    "aten.clone", "aten.gather", "aten.index_select", "aten.select", "aten.unsqueeze",
    "aten.squeeze", "aten.permute", "aten.t", "aten.transpose", "aten.alias",
    "aten.detach", "aten.cat", "aten.repeat", "aten.flatten", "aten.narrow",
    "aten.index"})
DATA_ARGS = frozenset({"self", "input", "tensors"})


def _schema_arguments(node: torch.fx.Node, schema: Any) -> Iterator[tuple[str, Any]]:
    """(name, value) of each argument of ``node`` by its op's schema, positional or
    keyword (None where left to its default)."""
    for i, arg in enumerate(schema.arguments):
        yield arg.name, node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)


def _arg_names_reading(user: torch.fx.Node, node: torch.fx.Node) -> Optional[set]:
    """The schema names of ``user``'s arguments that hold ``node``; None when ``user``
    has no schema or reads it otherwise (nested in a non-list argument)."""
    schema = getattr(user.target, "_schema", None)
    if schema is None:
        return None
    names = {name for name, value in _schema_arguments(user, schema)
             if value is node or (isinstance(value, (list, tuple)) and node in value)}
    return names or None


def read_as_positions(node: torch.fx.Node, depth: int = 0) -> bool:
    """Whether every reader of ``node``'s value takes it as positions (``INDEX_NAMES``),
    directly or through ops that only move it (``DATA_MOVES``); a value the graph
    returns, or any other reader, is a value. Chains are followed 8 deep."""
    if not node.users or depth > 8:
        return False
    for user in node.users:
        names = _arg_names_reading(user, node)
        if names is None:
            return False
        if names <= INDEX_NAMES:
            continue
        if not (names <= DATA_ARGS and packet_name(op_name(user.target)) in DATA_MOVES
                and read_as_positions(user, depth + 1)):
            return False
    return True


def value_dtypes(node: torch.fx.Node) -> set:
    """The dtypes of the tensors ``node`` reads or writes as values, leaving out those
    its op's schema names as positions (``INDEX_NAMES``, ``INDEX_RETURNS``), and the
    data an op of ``DATA_MOVES`` moves into positions only (``read_as_positions``): a
    backend that holds a dtype narrower than its range computes values wrong past it,
    but positions into a tensor stay far below any such range (an index past it is an
    error in eager). A node without a schema: every tensor it touches."""
    schema = getattr(node.target, "_schema", None)
    out: set = set()
    if schema is None:
        for inp in node.all_input_nodes:
            out |= {t.dtype for t in tensors_in(inp.meta.get("val"))}
        return out | {t.dtype for t in tensors_in(node.meta.get("val"))}
    packet = packet_name(op_name(node.target))
    moved = packet in DATA_MOVES and read_as_positions(node)
    for name, value in _schema_arguments(node, schema):
        if name in INDEX_NAMES or (moved and name in DATA_ARGS):
            continue
        for inp in (value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(inp, torch.fx.Node):
                out |= {t.dtype for t in tensors_in(inp.meta.get("val"))}
    if moved:
        return out
    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) and len(schema.returns) > 1 else [val]
    positions = INDEX_RETURNS.get(packet, ())
    for k, (ret, v) in enumerate(zip(schema.returns, vals)):
        if ret.name not in INDEX_NAMES and k not in positions:
            out |= {t.dtype for t in tensors_in(v)}
    return out
