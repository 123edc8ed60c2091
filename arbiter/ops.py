"""Operator names: the one spelling used in configs, manifests and reports.

An ATen overload is written ``aten.addmm.default``; a name without the overload
(``aten.addmm``) means every overload of that op. Names are checked against torch's own
operator registry, so a typo fails with a suggestion instead of matching nothing.
"""
from __future__ import annotations

import functools
import operator
from typing import Any

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
