"""YAML loading that remembers where every key came from, and reads bounded input.

pydantic reports errors by key path (``("backends", 1, "name")``); users need the line in
their file. We compose the YAML node tree once and keep a map from key path to line, so
every error can say ``my.yaml:7: backends[1].name: ...``.

A config or manifest may come from anyone, so what is read is bounded before anything
expands it (docs/robustness.md): regular files only (a FIFO would block, ``/dev/zero``
never ends; opened with ``O_NONBLOCK`` and checked with ``fstat``), at most
``MAX_BYTES``; then one pass over the parser's events (libyaml's parser is iterative)
refuses nesting deeper than ``MAX_DEPTH`` (the composer recurses in C: 100,000 nested
lists crashed the process) and documents whose aliases expand to more than ``MAX_NODES``
nodes (a 0.5 KB "billion laughs" expands to 387 million). Only then is the node tree
composed. The loader is PyYAML's safe one: no tag constructs a Python object.
"""
from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
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


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """PyYAML's safe loader (its C one where built), reading ``1e-3`` as a float as YAML
    1.2 does: YAML 1.1's float needs a dot (``1.0e-3``), and ``rtol: 1e-3``, the first
    tolerance a user writes, was the string '1e-3', refused as "not a valid number"."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))

#: Largest file read (the biggest shipped manifest is 0.16 MB).
MAX_BYTES = 8 * 1024 * 1024
#: Deepest nesting of lists and mappings (configs and manifests nest 5 deep).
MAX_DEPTH = 64
#: Most nodes after expanding aliases (the biggest shipped manifest has 15,000).
MAX_NODES = 500_000


@dataclass(frozen=True)
class Stats:
    """What ``scan`` saw: nodes after alias expansion, and the deepest nesting."""

    nodes: int
    depth: int


def scan(text: str, file: str = "<string>") -> Stats:
    """Check ``text``'s nesting depth and alias-expanded size from the parser's events,
    before anything is composed or expanded; ConfigError past a bound."""
    expanded = 0  # nodes the document would have with every alias expanded
    deepest = 0
    open_: list[tuple[int, Any]] = []  # per open collection: (expanded at start, anchor)
    anchors: dict[str, int] = {}  # anchor -> expanded size of its node
    for ev in yaml.parse(text, Loader=_Loader):
        if isinstance(ev, yaml.AliasEvent):
            size = anchors.get(ev.anchor)
            if size is None:
                continue  # an undefined alias: the composer reports it with its line
            expanded += size
        elif isinstance(ev, yaml.ScalarEvent):
            expanded += 1
            if ev.anchor is not None:
                anchors[ev.anchor] = 1
        elif isinstance(ev, yaml.CollectionStartEvent):
            open_.append((expanded, ev.anchor))
            expanded += 1
            deepest = max(deepest, len(open_))
            if len(open_) > MAX_DEPTH:
                raise ConfigError(f"lists and mappings nest deeper than {MAX_DEPTH} levels",
                                  file=file, line=ev.start_mark.line + 1)
            continue
        elif isinstance(ev, yaml.CollectionEndEvent):
            start, anchor = open_.pop()
            if anchor is not None:
                anchors[anchor] = expanded - start
            continue
        else:
            continue
        if expanded > MAX_NODES:
            raise ConfigError(f"aliases expand the document past {MAX_NODES:,} nodes "
                              f"(alias *{ev.anchor})" if isinstance(ev, yaml.AliasEvent)
                              else f"the document has more than {MAX_NODES:,} nodes",
                              file=file, line=ev.start_mark.line + 1)
    return Stats(expanded, deepest)


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
        scan(text, file)
        loader = _Loader(text)
        try:
            root = loader.get_single_node()
            data = loader.construct_document(root) if root is not None else None
        finally:
            loader.dispose()
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


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFDIR: "a directory",
          stat.S_IFSOCK: "a socket"}


def read_at_most(fd: int, most: int, chunk: int = 1 << 20) -> bytes:
    """Up to ``most`` bytes of the open file ``fd``, read ``chunk`` at a time until its
    end: a file that grows while it is read never makes the read unbounded (the persistent
    cache reads its entries so too)."""
    chunks, left = [], most
    while left > 0:
        got = os.read(fd, min(left, chunk))
        if not got:
            break
        chunks.append(got)
        left -= len(got)
    return b"".join(chunks)


def read_regular(path: str | Path, limit: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file at ``path`` (symlinks followed), at most ``limit``;
    ConfigError for anything else, without blocking on a FIFO or reading a device."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError("file not found", file=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc}", file=str(path)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a file")
            raise ConfigError(f"not a regular file ({kind}); give the path of a YAML file",
                              file=str(path))
        if st.st_size > limit:
            raise ConfigError(f"file is larger than {limit:,} bytes ({st.st_size:,})",
                              file=str(path))
        data = read_at_most(fd, limit + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc}", file=str(path)) from None
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew while we read
        raise ConfigError(f"file is larger than {limit:,} bytes", file=str(path))
    return data


def load_file(path: str | Path) -> Located:
    path = Path(path)
    raw = read_regular(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read file: {exc}", file=str(path)) from None
    return load_text(text, str(path))


def validation_error(located: Located, exc, model, cls: type[ConfigError] = ConfigError,
                     prefix: tuple = ()):
    """Turn pydantic's first error into a ConfigError with file, key path, line and hint.

    ``prefix`` is where ``model`` sits in the file (a backend's options, say).
    """
    errors = exc.errors()
    err = errors[0]
    if err["type"] == "missing":
        # a required key missing beside an unknown one is usually its misspelling
        # (`{rtol: 1, atl: 1}`): name the unknown key, which says what to fix
        extra = next((e for e in errors if e["type"] == "extra_forbidden"
                      and tuple(e["loc"][:-1]) == tuple(err["loc"][:-1])), None)
        err = extra or err
    loc = tuple(err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        valid = fields_at(model, loc[:-1])
        msg = (f"unknown key {loc[-1]!r}{did_you_mean(loc[-1], valid)}; "
               + (f"valid keys: {', '.join(valid)}" if valid else "it takes no keys"))
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
