"""The ``exact_nonfinite`` option, for backends whose ops compute unlike eager on NaN or inf.

A backend whose probe found such ops mixes in ``ExactNonfinite`` and sets
``own_validators`` (always applied) and ``nonfinite_checks``
(``arbiter.ops.nonfinite_validators``). Per the option: ``true`` refuses those ops on
floating inputs (they join ``validators``); ``"guard"`` takes them, and
``nonfinite_guard`` names them so that the partition checks its inputs on every call
(arbiter/run/piece.py); ``false`` takes them unchecked. Under ``guard`` a backend
compiles through ``with_taps``: where a guarded op reads a value an op of ``SOURCES``
(division, log, sqrt, pow, exp...) computed inside the partition, the partition also
returns those values (the "taps"), and a call where one holds NaN or inf runs in eager
ATen. Not caught: an overflow of ordinary arithmetic, a constant ``-inf`` fill, NaN in
frozen weights. docs/robustness.md ("Non-finite values").
"""
from __future__ import annotations

import functools
import logging
import math
import threading
from typing import Any, Callable, ClassVar, Optional

import torch
import torch.fx

from arbiter.ops import all_finite, nonfinite_nodes, op_name, packet_name

from ._edge_values import MEANS, VARIANCES, argument, may_be_zero, reduced_sizes

log = logging.getLogger(__name__)


class ExactNonfinite:
    own_validators: ClassVar[dict] = {}
    nonfinite_checks: ClassVar[dict] = {}

    def _mode(self):
        return getattr(getattr(self, "options", None), "exact_nonfinite", True)

    @property
    def validators(self) -> dict:
        """Its own validators, plus the non-finite ones while ``exact_nonfinite`` is true."""
        return self._exact() if self._mode() is True else self.own_validators

    @classmethod
    @functools.cache
    def _exact(cls) -> dict:
        return {**cls.nonfinite_checks, **cls.own_validators}

    def nonfinite_guard(self, gm) -> list[str]:
        return nonfinite_nodes(gm, self.nonfinite_checks) if self._mode() == "guard" else []

    def with_taps(self, gm: torch.fx.GraphModule, build: Callable[[torch.fx.GraphModule], Any]):
        """``build(gm)``, the backend's compile of a partition; under ``guard``, when the
        partition makes a value its guarded ops read (``taps``), ``build`` compiles it
        with those values returned too and the result checks them on every call
        (``Tapped``)."""
        found = taps(gm, self.nonfinite_checks) if self._mode() == "guard" else []
        if not found:
            return build(gm)
        log.debug("%s: NaN/inf made by %s checked on every call", getattr(self, "name", ""),
                  ", ".join(n.name for n in found))
        return Tapped(build(with_outputs(gm, found)), len(found), gm)


# -- ops that make NaN or inf from finite inputs -------------------------------------------
#: ATen ops (packet names) that can make NaN or inf out of finite inputs at ordinary
#: values: a division by zero, a log of zero or less, a root or power of a negative
#: number, an inverse function out of its domain, an exponential past 88 (float32).
SOURCES = frozenset({
    "aten.div", "aten.true_divide", "aten.floor_divide", "aten.reciprocal", "aten.rsqrt",
    "aten.sqrt", "aten.pow", "aten.float_power", "aten.remainder", "aten.fmod",
    "aten.log", "aten.log2", "aten.log10", "aten.log1p", "aten.logit", "aten.xlogy",
    "aten.acos", "aten.asin", "aten.acosh", "aten.atanh", "aten.erfinv", "aten.lgamma",
    "aten.digamma", "aten.polygamma", "aten.mvlgamma", "aten.exp", "aten.exp2",
    "aten.expm1", "aten.sinh", "aten.cosh", "aten.nll_loss_forward",
    "aten.nll_loss2d_forward",
})
#: Packet-name prefixes of op families that are all sources (poles, singular matrices).
_SOURCE_PREFIXES = ("aten.special_", "aten.linalg_", "aten._linalg_")
_DIVISIONS = ("aten.div", "aten.true_divide", "aten.floor_divide", "aten.remainder",
              "aten.fmod")


def _number(x: Any) -> bool:
    """An int or float argument (not a bool, not a node)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _nonzero_number(x: Any) -> bool:
    return _number(x) and x != 0 and math.isfinite(x)


def _constant_nonzero(x: Any) -> bool:
    """A divisor that cannot be 0: a non-zero number, or a ``full``/``scalar_tensor``
    of one (GPT-2's attention scale)."""
    if _nonzero_number(x):
        return True
    if isinstance(x, torch.fx.Node) and x.op == "call_function" and \
            packet_name(op_name(x.target)) in ("aten.full", "aten.scalar_tensor"):
        value = x.args[1] if packet_name(op_name(x.target)) == "aten.full" else x.args[0]
        return _nonzero_number(value)
    return False


#: Ops whose output is >= 0 (or NaN, only where an input or an upstream source is) when
#: their first argument is non-negative too: reductions of such values.
_KEEPS_SIGN = ("aten.mean.dim", "aten.mean.default", "aten.sum.dim_IntList", "aten.sum.default",
               "aten.amax.default")
#: Ops whose output is >= 0 whatever their finite input: an absolute value, relu, exp, a
#: variance (their own NaN, where one is possible, is a source of its own).
_NONNEGATIVE = ("aten.abs.default", "aten.relu.default", "aten.var.correction",
                "aten.var.dim", "aten.std.correction", "aten.exp.default")


def _positive_number(x: Any) -> bool:
    return _number(x) and x > 0 and math.isfinite(x)


def nonnegative(x: Any, depth: int = 0) -> bool:
    """Whether ``x`` (a node or a number) is >= 0 or +inf for every finite input: an even
    power, ``x * x``, an absolute value, relu, exp, a variance, and means, sums and
    additions of such values. NaN from upstream is not this function's concern: an
    upstream source is tapped itself (``taps`` follows every value it reaches)."""
    if _number(x):
        return x >= 0
    if not isinstance(x, torch.fx.Node) or x.op != "call_function" or depth > 8:
        return False
    name = op_name(x.target)
    if name in _NONNEGATIVE:
        return True
    if name == "aten.pow.Tensor_Scalar":
        e = x.args[1]
        return _number(e) and float(e).is_integer() and int(e) % 2 == 0
    if name == "aten.mul.Tensor" and len(x.args) > 1 and x.args[0] is x.args[1]:
        return True
    if name == "aten.add.Tensor":  # alpha scales the second: it must keep its sign
        alpha = x.kwargs.get("alpha", 1)
        return nonnegative(x.args[0], depth + 1) and nonnegative(x.args[1], depth + 1) \
            and nonnegative(alpha)
    if name in _KEEPS_SIGN or name == "aten.sqrt.default":
        return nonnegative(x.args[0], depth + 1)
    if name in ("aten.clamp_min.default", "aten.clamp.default"):
        low = _clamped_from(x)
        return low is not None and low >= 0
    return False


def _floor(node: torch.fx.Node) -> float:
    """The least constant that stays positive in ``node``'s dtype: a float dtype's
    smallest normal number (float16's is 6.1e-5: an ``eps`` of 1e-6 there is subnormal,
    and flushed to zero where denormals are), 1 for integers; unknown dtype: none."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return math.inf
    return torch.finfo(val.dtype).smallest_normal if val.is_floating_point() else 1.0


def _clamped_from(node: torch.fx.Node) -> Any:
    """A clamp's lower bound when it holds (no upper bound below it: ``clamp(x, 1, -1)``
    is -1 everywhere), else None."""
    if len(node.args) < 2 or not _number(node.args[1]):
        return None
    low = node.args[1]
    high = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
    if high is not None and not (_number(high) and high >= low):
        return None
    return low


def positive(x: Any, depth: int = 0) -> bool:
    """Whether the node ``x`` is > 0 (or +inf) for every finite input: a non-negative
    value plus a positive constant (a norm's ``variance + eps``), one clamped below by a
    positive constant, or the square root of such a value. A constant counts when it is
    a normal number of the node's dtype (``_floor``)."""
    if not isinstance(x, torch.fx.Node) or x.op != "call_function" or depth > 8:
        return False
    name = op_name(x.target)
    floor = _floor(x)

    def pos(v: Any) -> bool:
        if _number(v):
            return _positive_number(v) and v >= floor
        return positive(v, depth + 1)

    if name in ("aten.add.Tensor", "aten.add.Scalar") and len(x.args) > 1:
        a, b = x.args[0], x.args[1]
        if x.kwargs.get("alpha", 1) != 1:
            return False  # a + alpha * b: not judged
        return (nonnegative(a) and pos(b)) or (pos(a) and nonnegative(b))
    if name in ("aten.clamp_min.default", "aten.clamp.default"):
        low = _clamped_from(x)
        return low is not None and pos(low)
    if name == "aten.sqrt.default" and x.args:  # a norm's sqrt(var + eps) as a divisor
        return pos(x.args[0])
    return False


#: Sources that make no NaN or inf when their argument is positive (``positive``) or, for
#: the square root, non-negative: a norm's ``rsqrt(mean(x ** 2) + eps)`` (T5's, LLaMA's).
_SAFE_ON_POSITIVE = ("aten.rsqrt.default", "aten.reciprocal.default", "aten.log.default",
                     "aten.log2.default", "aten.log10.default")


def makes_nonfinite(node: torch.fx.Node) -> bool:
    """Whether ``node`` can make NaN or inf out of finite inputs (``SOURCES``), judged
    with its arguments where they settle it (a division by a non-zero number cannot; nor
    a power with a non-negative integer exponent, nor a mean over a non-empty extent, nor
    a root, reciprocal or log of a value that is positive whatever the input: a norm's
    ``rsqrt(mean(x ** 2) + eps)``)."""
    name = op_name(node.target)
    packet = packet_name(name)
    if name in _SAFE_ON_POSITIVE and node.args and positive(node.args[0]):
        return False
    if name == "aten.sqrt.default" and node.args and nonnegative(node.args[0]):
        return False
    if name in ("aten.div.Tensor", "aten.true_divide.Tensor") and len(node.args) > 1 and \
            positive(node.args[1]):
        return False
    if name in MEANS:
        sizes = reduced_sizes(node)
        return sizes is None or any(may_be_zero(s) for s in sizes)
    if name in VARIANCES:  # n <= correction: NaN or inf (the variance of one value)
        sizes = reduced_sizes(node)
        if sizes is None or any(not isinstance(s, int) for s in sizes):
            return True
        correction = argument(node, "correction")
        return math.prod(sizes) <= (1 if correction is None else correction)
    if packet not in SOURCES and not packet.startswith(_SOURCE_PREFIXES):
        return False
    if packet in _DIVISIONS:
        return not _constant_nonzero(node.args[1] if len(node.args) > 1 else None)
    if packet == "aten.pow" and name.endswith("Tensor_Scalar"):
        e = node.args[1]
        return not (_number(e) and e >= 0 and float(e).is_integer())
    return True


def _floating(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    return any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in vals)


def taps(gm: torch.fx.GraphModule, checks: dict) -> list[torch.fx.Node]:
    """The nodes of ``gm`` that make NaN or inf (``makes_nonfinite``) and whose values
    reach, through floating values, an input of a node ``checks`` refuses (an op the
    backend computes unlike eager on NaN or inf), in graph order. One pass: each
    floating value carries the set of such nodes it depends on."""
    reach: dict[torch.fx.Node, frozenset] = {}
    found: set = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        upstream = frozenset().union(*(reach.get(i, ()) for i in node.all_input_nodes))
        name = op_name(node.target)
        check = checks.get(name) or checks.get(packet_name(name))
        if upstream and check is not None and check(node) is not None:
            found |= upstream
        if makes_nonfinite(node) and _floating(node):
            upstream = upstream | {node}
        if upstream and _floating(node):
            reach[node] = upstream
    return [n for n in gm.graph.nodes if n in found]


def with_outputs(gm: torch.fx.GraphModule, extra: list[torch.fx.Node]) -> torch.fx.GraphModule:
    """A copy of ``gm`` (a partition returning a tuple) that also returns ``extra``
    (nodes of ``gm``), after its own outputs; constants shared."""
    graph = torch.fx.Graph()
    env: dict = {}
    out = graph.graph_copy(gm.graph, env)
    values = list(out) if isinstance(out, (list, tuple)) else [out]
    graph.output(tuple(values + [env[n] for n in extra]))
    return torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)


class Tapped:
    """A compiled partition whose last ``n`` outputs are taps (``taps``): returns the
    partition's own outputs, or eager ATen's (``gm`` run on the call's inputs) when a
    tap holds NaN or inf; such calls are counted in the piece's record
    (``nonfinite_calls``, ``attach_record``)."""

    def __init__(self, fn: Callable, n: int, gm: torch.fx.GraphModule):
        self.fn, self.n, self.gm = fn, n, gm
        self._record: Optional[Any] = None
        self._lock = threading.Lock()
        self._warned = False

    def attach_record(self, record) -> None:
        self._record = record
        attach = getattr(self.fn, "attach_record", None)
        if attach is not None:
            attach(record)

    def __call__(self, *args):
        out = self.fn(*args)
        k = len(out) - self.n
        if all_finite(out[k:]):
            return out[:k]
        with self._lock:
            if self._record is not None:
                self._record.nonfinite_calls += 1
            first, self._warned = not self._warned, True
        if first:
            record = self._record
            log.warning("partition %s: a value made inside it holds NaN or inf, and its "
                        "backend computes %s unlike eager there: such calls run in eager "
                        "ATen (exact_nonfinite: guard)", getattr(record, "partition_id", "?"),
                        ", ".join(getattr(record, "nonfinite_ops", None) or ["some ops"]))
        return list(self.gm(*args))
