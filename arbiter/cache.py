"""The persistent cache: policy decisions and compiled artifacts, kept between processes.

An entry is one file, ``<dir>/<kind>/<key[:2]>/<key>.bin``: a one-line JSON header
(format, kind, key, payload length and SHA-256) and the payload bytes. Reading checks
all of it: a truncated, corrupt or foreign entry (a header naming another key, another
format) is ignored with a warning, removed, and rebuilt by the caller; it is never
trusted. Writes go to a temporary file renamed into place, so a reader never sees half an
entry and two processes writing the same key leave one whole entry.

A key (``fingerprint``) hashes everything that changes what is built:

* the graph, normalized: nodes are numbered in graph order, so two traces that differ
  only in node names (``add_3`` vs ``add_7``) share a key; every node's op, arguments
  and traced shape, dtype and stride;
* the real inputs' shapes, dtypes and strides;
* a hash of the bytes of every constant baked into the graph (frozen weights): two
  models with one architecture and different weights never share an entry;
* the caller's ``parts``: backend name, version and options, torch's version.

The directory is the config's ``cache.dir``, else ``$ARBITER_CACHE_DIR``, else
``~/.cache/torch-arbiter``. A directory that cannot be written disables the cache, with
one warning.
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import torch
import torch.fx

log = logging.getLogger(__name__)

FORMAT = 1
ENV_DIR = "ARBITER_CACHE_DIR"


def default_dir() -> Path:
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/torch-arbiter").expanduser()


class Cache:
    """Entries by (kind, key). ``enabled`` is False when the directory is unusable."""

    def __init__(self, directory: Optional[os.PathLike] = None):
        self.dir = Path(directory).expanduser() if directory else default_dir()
        self.enabled = True
        self.hits = 0
        self.misses = 0
        self.rejected = 0  # corrupt or foreign entries ignored
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.dir, prefix=".probe-"):
                pass
        except OSError as exc:
            self.enabled = False
            log.warning("arbiter cache disabled: cannot write to %s (%s); set cache.dir in "
                        "the config or $%s to a writable directory, or cache.enabled: false",
                        self.dir, exc, ENV_DIR)

    def path(self, kind: str, key: str) -> Path:
        return self.dir / kind / key[:2] / f"{key}.bin"

    def get(self, kind: str, key: str) -> Optional[bytes]:
        if not self.enabled:
            return None
        path = self.path(kind, key)
        try:
            raw = _read_entry(path, MAX_ENTRY_BYTES)
        except FileNotFoundError:
            self.misses += 1
            return None
        except OSError as exc:
            log.warning("arbiter cache: cannot read %s (%s); rebuilding", path, exc)
            self.misses += 1
            return None
        why = raw if isinstance(raw, str) else _check(raw, kind, key)
        if isinstance(why, str):
            self.rejected += 1
            self.misses += 1
            log.warning("arbiter cache: ignoring %s entry %s: %s; rebuilding it", kind, path, why)
            try:
                path.unlink()
            except OSError:
                pass
            return None
        self.hits += 1
        return why

    def put(self, kind: str, key: str, payload: bytes) -> None:
        if not self.enabled:
            return
        header = json.dumps({"format": FORMAT, "kind": kind, "key": key, "length": len(payload),
                             "sha256": hashlib.sha256(payload).hexdigest()}).encode()
        path = self.path(kind, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(header + b"\n" + payload)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("arbiter cache: cannot write %s (%s); continuing without it", path, exc)

    # JSON decisions are small entries of the same store.
    def get_json(self, kind: str, key: str) -> Optional[Any]:
        raw = self.get(kind, key)
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            self.rejected += 1
            log.warning("arbiter cache: ignoring %s entry %s: not JSON (%s)", kind, key, exc)
            return None

    def put_json(self, kind: str, key: str, value: Any) -> None:
        self.put(kind, key, json.dumps(value, sort_keys=True).encode())


#: Largest entry read (one GPT-2 small ONNX model is 0.5 GB).
MAX_ENTRY_BYTES = 8 * 1024 ** 3

_O_READ = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _read_entry(path: Path, limit: int):
    """An entry's bytes, or a string saying why it is not read: it must be a regular
    file, not a symbolic link (``O_NOFOLLOW``), at most ``limit`` bytes. A FIFO is
    opened without blocking (``O_NONBLOCK``) and refused on its ``fstat``, never read.
    FileNotFoundError and other OSErrors propagate."""
    try:
        fd = os.open(path, _O_READ)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link (entries must be regular files)"
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return f"not a regular file (mode {stat.filemode(st.st_mode)})"
        if st.st_size > limit:
            return f"larger than {limit:,} bytes ({st.st_size:,})"
        chunks, left = [], st.st_size + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _check(raw: bytes, kind: str, key: str):
    """The payload, or a string saying why the entry cannot be trusted."""
    head, sep, payload = raw.partition(b"\n")
    if not sep:
        return "no header"
    try:
        h = json.loads(head)
    except ValueError:
        return "unreadable header"
    if not isinstance(h, dict) or h.get("format") != FORMAT:
        return f"format {h.get('format') if isinstance(h, dict) else '?'} (this arbiter writes {FORMAT})"
    if h.get("kind") != kind or h.get("key") != key:
        return "written for another key (foreign entry)"
    if h.get("length") != len(payload):
        return f"truncated ({len(payload)} of {h.get('length')} bytes)"
    if h.get("sha256") != hashlib.sha256(payload).hexdigest():
        return "checksum mismatch (corrupt)"
    return payload


# -- keys ------------------------------------------------------------------------------
_tensor_digests: Any = None  # WeakIdKeyDictionary: tensor -> (version, digest)


def tensor_digest(t: torch.Tensor) -> str:
    """BLAKE2b of a tensor's bytes (plus dtype and shape), memoized per tensor object and
    in-place version: a model's weights are hashed once per process, not per partition."""
    global _tensor_digests
    if _tensor_digests is None:
        from torch.utils.weak import WeakIdKeyDictionary

        _tensor_digests = WeakIdKeyDictionary()
    hit = _tensor_digests.get(t)
    version = t._version
    if hit is not None and hit[0] == version:
        return hit[1]
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
    data = t.detach()
    if data.device.type != "cpu":
        data = data.cpu()
    data = data.contiguous().reshape(-1).view(torch.uint8)
    if data.numel():
        h.update(memoryview(data.numpy()))
    digest = h.hexdigest()
    _tensor_digests[t] = (version, digest)
    return digest


def _value_desc(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        try:
            return ["T", str(v.dtype), [str(s) for s in v.shape], [str(s) for s in v.stride()],
                    v.device.type]
        except RuntimeError:  # sparse and other layouts without strides
            return ["T", str(v.dtype), [str(s) for s in v.shape], str(v.layout)]
    if isinstance(v, (list, tuple)):
        return [_value_desc(x) for x in v]
    if isinstance(v, (int, float, bool, str)) or v is None:
        return repr(v)
    return type(v).__name__


def graph_text(gm: torch.fx.GraphModule) -> str:
    """The graph with node names replaced by their position: equal for equal graphs."""
    index: dict[torch.fx.Node, str] = {}
    lines = []

    def arg(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return index[a]
        if isinstance(a, (list, tuple)):
            return [arg(x) for x in a]
        if isinstance(a, dict):
            return {str(k): arg(v) for k, v in sorted(a.items(), key=lambda kv: str(kv[0]))}
        if isinstance(a, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return str(a)
        return repr(a)

    for i, n in enumerate(gm.graph.nodes):
        index[n] = f"%{i}"
        if n.op == "get_attr":
            value = gm
            for part in n.target.split("."):
                value = getattr(value, part)
            target = ["const", tensor_digest(value) if isinstance(value, torch.Tensor)
                      else repr(value)]
        elif n.op == "placeholder":
            target = "input"
        else:
            target = getattr(n.target, "__name__", None) if not isinstance(
                n.target, (str, torch._ops.OpOverload)) else str(n.target)
            if n.op == "call_function" and not isinstance(n.target, torch._ops.OpOverload):
                target = f"{getattr(n.target, '__module__', '')}.{target}"
        lines.append(json.dumps([n.op, target, arg(n.args), arg(n.kwargs),
                                 _value_desc(n.meta.get("val"))], default=str))
    return "\n".join(lines)


def fingerprint(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], parts: dict,
                constants: Optional[dict] = None) -> str:
    """The cache key of building ``gm`` for ``example_inputs`` (see the module docstring).

    ``constants`` (placeholder -> tensor) are weights bound to placeholders rather than
    held as attributes: their bytes are hashed too.
    """
    h = hashlib.sha256()
    h.update(json.dumps({"format": FORMAT, "torch": torch.__version__, **parts},
                        sort_keys=True, default=str).encode())
    h.update(graph_text(gm).encode())
    h.update(json.dumps([_value_desc(a) for a in example_inputs]).encode())
    if constants:
        names = {n: i for i, n in enumerate(gm.graph.nodes)}
        for node, t in sorted(constants.items(), key=lambda kv: names.get(kv[0], -1)):
            h.update(f"{names.get(node, -1)}={tensor_digest(t)};".encode())
    return h.hexdigest()


def from_options(enabled: bool, directory: Optional[str]) -> Optional[Cache]:
    """The cache a config asks for, or None (disabled or unusable)."""
    if not enabled:
        return None
    cache = Cache(directory)
    return cache if cache.enabled else None
