"""torch's serialized ExportedProgram (JSON) into its schema dataclasses, as
``torch._export.serde.serialize._dict_to_dataclass`` does, with each class's type hints
computed once instead of once per object: torch's helper calls ``typing.get_type_hints``
for every node, argument and tensor meta, 13 of the 20 s that reading BERT-base's
program took here (bench/README.md). Same rules, same result (tests/test_export.py
compares them); a structure they do not fit raises ValueError."""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Annotated, Any


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict:
    from torch._export.serde import schema

    return typing.get_type_hints(cls, globalns=vars(schema))


@functools.lru_cache(maxsize=None)
def _fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def to_dataclass(cls: Any, data: Any) -> Any:
    from torch._export.serde.serialize import _resolve_schema_cls
    from torch._export.serde.union import _Union

    cls = _resolve_schema_cls(cls)
    if isinstance(cls, str):
        raise ValueError(f"unresolved schema type {cls!r}")
    origin = typing.get_origin(cls)
    if origin is Annotated:
        return to_dataclass(cls.__origin__, data)
    if origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(cls):
        if data is None:
            return None
        args = typing.get_args(cls)
        if len(args) != 2:
            raise ValueError(f"expected an optional of one type, got {cls}")
        return to_dataclass(args[0], data)
    if isinstance(cls, type) and issubclass(cls, _Union):
        if not isinstance(data, dict) or len(data) != 1:
            raise ValueError(f"{cls.__name__}: expected one key, got {data!r:.100}")
        (tag, value), = data.items()
        hints = _hints(cls)
        if tag not in hints:
            raise ValueError(f"{cls.__name__} has no member {tag!r}")
        return cls.create(**{tag: to_dataclass(hints[tag], value)})
    if dataclasses.is_dataclass(cls):
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
        hints = _hints(cls)
        return cls(**{name: to_dataclass(hints[name], data[name])
                      for name in _fields(cls) if name in data})
    if isinstance(data, list):
        if not data:
            return data
        (item,) = typing.get_args(cls)[:1] or (Any,)
        return [to_dataclass(item, d) for d in data]
    if isinstance(data, dict):
        args = typing.get_args(cls)
        value = args[1] if len(args) > 1 else Any
        return {k: to_dataclass(value, v) for k, v in data.items()}
    if cls is float:
        return float(data)
    return data
