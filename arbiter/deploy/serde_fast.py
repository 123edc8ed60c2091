"""torch's serialized ExportedProgram (JSON) into its schema dataclasses, faster than torch.

As ``torch._export.serde.serialize._dict_to_dataclass`` does, but torch's helper calls
``typing.get_type_hints`` for every node, argument and tensor meta (13 of the 20 s that
reading BERT-base's program took here, bench/README.md) and inspects each type again for
every value. Here each schema type is inspected once and becomes a converter (a closure,
cached per type); a value only runs its type's converter. Same rules, same result
(tests/test_export.py compares them); a structure they do not fit raises ValueError.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any

Converter = Callable[[Any], Any]


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict:
    from torch._export.serde import schema

    return typing.get_type_hints(cls, globalns=vars(schema))


def to_dataclass(cls: Any, data: Any) -> Any:
    return _converter(cls)(data)


@functools.lru_cache(maxsize=None)
def _converter(cls: Any) -> Converter:
    """The converter of values of type ``cls`` (see the module). Converters of a type's
    parts are looked up at its first value, so recursive schema types are fine."""
    from torch._export.serde.serialize import _resolve_schema_cls
    from torch._export.serde.union import _Union

    cls = _resolve_schema_cls(cls)
    if isinstance(cls, str):
        raise ValueError(f"unresolved schema type {cls!r}")
    origin = typing.get_origin(cls)
    if origin is Annotated:
        return _converter(cls.__origin__)
    if origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(cls):
        return _optional(cls)
    if isinstance(cls, type) and issubclass(cls, _Union):
        return _union(cls)
    if dataclasses.is_dataclass(cls):
        return _dataclass(cls)
    return _plain(cls)


def _optional(cls: Any) -> Converter:
    args = typing.get_args(cls)

    def convert(data: Any) -> Any:
        if data is None:
            return None
        if len(args) != 2:
            raise ValueError(f"expected an optional of one type, got {cls}")
        return _converter(args[0])(data)
    return convert


def _union(cls: Any) -> Converter:
    members: dict[str, Converter] = {}
    make = _union_maker(cls)

    def convert(data: Any) -> Any:
        if not isinstance(data, dict) or len(data) != 1:
            raise ValueError(f"{cls.__name__}: expected one key, got {data!r:.100}")
        (tag, value), = data.items()
        conv = members.get(tag)
        if conv is None:
            hints = _hints(cls)
            if tag not in hints:
                raise ValueError(f"{cls.__name__} has no member {tag!r}")
            conv = members[tag] = _converter(hints[tag])
        return make(tag, conv(value))
    return convert


def _union_maker(cls: Any) -> Callable[[str, Any], Any]:
    """What ``cls.create(**{tag: value})`` makes (every member None but ``tag``, the tag
    set), without its per-object ``dataclasses.fields`` calls (two per union value, 0.2 s
    of BERT-base's load): the members are read once here, where ``create``'s reserved-name
    check runs once for the class too."""
    from torch._export.serde.union import _UnionTag

    names = [f.name for f in dataclasses.fields(cls)]
    if any(n in ("type", "_type", "create", "value") for n in names):
        return lambda tag, value: cls.create(**{tag: value})  # torch's own error
    blank = dict.fromkeys(names)

    def make(tag: str, value: Any) -> Any:
        obj = cls.__new__(cls)
        state = obj.__dict__
        state.update(blank)
        state[tag] = value
        obj._type = _UnionTag.create(tag, cls)
        return obj
    return make


def _dataclass(cls: Any) -> Converter:
    fields: list[tuple[str, Converter]] = []

    def convert(data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
        if not fields:
            hints = _hints(cls)
            fields.extend((f.name, _converter(hints[f.name])) for f in dataclasses.fields(cls))
        return cls(**{name: conv(data[name]) for name, conv in fields if name in data})
    return convert


def _plain(cls: Any) -> Converter:
    """Lists, dicts and scalars: which one is the value's, as in torch's helper."""
    args = typing.get_args(cls)
    is_float = cls is float

    def convert(data: Any) -> Any:
        if isinstance(data, list):
            if not data:
                return data
            item = _converter((args[:1] or (Any,))[0])
            return [item(d) for d in data]
        if isinstance(data, dict):
            value = _converter(args[1] if len(args) > 1 else Any)
            return {k: value(v) for k, v in data.items()}
        if is_float:
            return float(data)
        return data
    return convert
