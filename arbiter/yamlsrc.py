"""YAML loading that remembers where every key came from.

pydantic reports errors by key path (``("backends", 1, "name")``); users need the line in
their file. We compose the YAML node tree once and keep a map from key path to line, so
every error can say ``my.yaml:7: backends[1].name: ...``.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError, did_you_mean

KeyPath = tuple  # of str | int


def format_path(path: Sequence[Any]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "." in str(part) or not str(part).isidentifier():
            out += f"[{str(part)!r}]"
        else:
            out += ("." if out else "") + str(part)
    return out


class Located:
    """Plain Python data parsed from YAML, plus the line of every key path."""

    def __init__(self, data: Any, lines: dict[KeyPath, int], file: str):
        self.data, self.lines, self.file = data, lines, file

    def line_of(self, path: Sequence[Any]) -> int | None:
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get(())

    def error(self, path: Sequence[Any], message: str, cls: type[ConfigError] = ConfigError):
        return cls(message, file=self.file, key=format_path(path) or None,
                   line=self.line_of(path))


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _index(node: yaml.Node, path: KeyPath, lines: dict, file: str) -> None:
    """Record the line of every key path under ``node``; reject duplicate keys."""
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key is None:
                raise ConfigError("a mapping key must be a scalar", file=file,
                                  key=format_path(path) or None,
                                  line=key_node.start_mark.line + 1)
            if key in seen:
                raise ConfigError(f"duplicate key {key!r}", file=file,
                                  key=format_path(path + (key,)),
                                  line=key_node.start_mark.line + 1)
            seen.add(key)
            _index(value_node, path + (key,), lines, file)
            lines[path + (key,)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, value_node in enumerate(node.value):
            _index(value_node, path + (i,), lines, file)


def load_text(text: str, file: str = "<string>") -> Located:
    """Parse YAML text; syntax errors become ConfigError with file and line."""
    try:
        root = yaml.compose(text, Loader=_Loader)
        data = yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError(f"malformed YAML: {exc.problem or exc}", file=file, line=line) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"malformed YAML: {exc}", file=file) from None
    lines: dict[KeyPath, int] = {}
    if root is not None:
        _index(root, (), lines, file)
    if data is None:
        data = {}
    return Located(data, lines, file)


def load_file(path: str | Path) -> Located:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", file=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read file: {exc}", file=str(path)) from None
    return load_text(text, str(path))


def validation_error(located: Located, exc, model, cls: type[ConfigError] = ConfigError,
                     prefix: tuple = ()):
    """Turn pydantic's first error into a ConfigError with file, key path, line and hint.

    ``prefix`` is where ``model`` sits in the file (a backend's options, say).
    """
    err = exc.errors()[0]
    loc = tuple(err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        valid = fields_at(model, loc[:-1])
        msg = (f"unknown key {loc[-1]!r}{did_you_mean(loc[-1], valid)}; "
               f"valid keys: {', '.join(valid)}")
    elif err["type"] == "missing":
        msg = "required key is missing"
    elif "input" in err and err["type"] not in ("value_error", "assertion_error"):
        msg += f" (got {err['input']!r})"
    return located.error(prefix + loc, msg, cls)


def fields_at(model, path: Sequence[Any]) -> list[str]:
    """Field names of the pydantic model that sits at ``path`` inside ``model``."""
    import typing

    from pydantic import BaseModel

    def models_in(ann) -> list:
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            return [ann]
        return [m for a in typing.get_args(ann) for m in models_in(a)]

    current = model
    for part in path:
        fields = getattr(current, "model_fields", None)
        if fields is not None and part in fields:
            found = models_in(fields[part].annotation)
            current = found[0] if found else None
        elif fields is None or part not in fields:
            # list index or dict key: stay on the element model found one level up
            continue
        if current is None:
            return []
    return [name for name, f in (getattr(current, "model_fields", {}) or {}).items()
            if not f.exclude]
