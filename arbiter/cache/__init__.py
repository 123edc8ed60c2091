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
``~/.cache/torch-arbiter`` (created mode 0700).

Trust: an entry is run as code (an ONNX model is executed, a decision chooses what runs),
and its checksum only catches accidents: whoever can write the directory can write a
valid entry. So the cache is used only when the directory, every directory above it
(sticky ones such as /tmp excepted) and every entry are owned by this user or root and
writable by no one else, as ssh requires of ~/.ssh (``untrusted``); otherwise it is off,
with a warning saying which path and why. A trusted directory this process cannot write
(an image's baked cache) is used read-only. An entry that loads but then fails (to
compile, run or verify) is evicted (``evict``) so later processes rebuild it; the total
size is bounded (``max_bytes``, least recently used evicted first: a hit refreshes an
entry's mtime). ``arbiter cache`` lists, sizes and clears entries.
"""
from __future__ import annotations

import contextlib
import contextvars
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

from ..ops import attr_value
from ..yamlsrc import read_at_most
from .directory import entries, trusted_owner, untrusted

log = logging.getLogger(__name__)

FORMAT = 1
ENV_DIR = "ARBITER_CACHE_DIR"
#: Default bound on the entries' total size (config ``cache.max_size_gb``).
DEFAULT_MAX_BYTES = 10 * 1024 ** 3


def default_dir() -> Path:
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/torch-arbiter").expanduser()


class Cache:
    """Entries by (kind, key); see the module docstring for the trust model.

    ``enabled`` is False when the directory is unusable or untrusted; ``writable`` is
    False for a trusted directory this process cannot write (an image's baked cache):
    it is then read, never written, and nothing in it is removed. ``max_bytes`` bounds
    the entries' total size (least recently used evicted first; None: no bound).
    """

    def __init__(self, directory: Optional[os.PathLike] = None,
                 max_bytes: Optional[int] = DEFAULT_MAX_BYTES):
        self.dir = Path(directory).expanduser() if directory else default_dir()
        self.max_bytes = max_bytes
        self.enabled = True
        self.writable = True
        self.hits = 0
        self.misses = 0
        self.rejected = 0  # corrupt, foreign or untrusted entries ignored
        self.evicted = 0  # entries removed: failed at run time, or over the size limit
        try:
            _makedirs_private(self.dir)
        except OSError as exc:
            if not self.dir.is_dir():
                self._disable(f"cannot create {self.dir} ({exc})")
                return
        why = untrusted(self.dir)
        if why:
            self._disable(f"{self.dir} is not trusted: {why}. Entries are run as code, so "
                          "the directory and those above it must be writable by you alone "
                          "(as ssh requires of ~/.ssh: `chmod go-w` fixes a mode)")
            return
        try:
            with tempfile.NamedTemporaryFile(dir=self.dir, prefix=".probe-"):
                pass
        except OSError as exc:
            if os.access(self.dir, os.R_OK | os.X_OK):
                self.writable = False
                log.info("arbiter cache: %s is read-only here (%s); using its entries "
                         "without writing", self.dir, exc)
            else:
                self._disable(f"cannot use {self.dir} ({exc})")

    def _disable(self, why: str) -> None:
        self.enabled = False
        log.warning("arbiter cache disabled: %s; set cache.dir in the config or $%s to a "
                    "directory of yours, or cache.enabled: false", why, ENV_DIR)

    def path(self, kind: str, key: str) -> Path:
        return self.dir / kind / key[:2] / f"{key}.bin"

    def get(self, kind: str, key: str) -> Optional[bytes]:
        if not self.enabled:
            return None
        path = self.path(kind, key)
        try:
            raw = _read_entry(path, self._entry_limit())
        except FileNotFoundError:
            self.misses += 1
            return None
        except OSError as exc:
            log.warning("arbiter cache: cannot read %s (%s); rebuilding", path, exc)
            self.misses += 1
            return None
        why = raw if isinstance(raw, str) else (
            untrusted(path.parent, stop=self.dir) or _check(raw, kind, key))
        if isinstance(why, str):
            self.rejected += 1
            self.misses += 1
            log.warning("arbiter cache: ignoring %s entry %s: %s; rebuilding it", kind, path, why)
            self._remove(path)
            return None
        self.hits += 1
        served = _SERVED.get()
        if served is not None:
            served.append((self, kind, key))
        if self.writable:  # least recently used goes first: a hit is a use
            try:
                os.utime(path)
            except OSError:
                pass
        return why

    def put(self, kind: str, key: str, payload: bytes) -> None:
        if not self.enabled or not self.writable:
            return
        header = json.dumps({"format": FORMAT, "kind": kind, "key": key, "length": len(payload),
                             "sha256": hashlib.sha256(payload).hexdigest()}).encode()
        size = len(header) + 1 + len(payload)
        path = self.path(kind, key)
        if self.max_bytes is not None and size > self.max_bytes:
            log.warning("arbiter cache: not storing %s entry %s: %d bytes is more than the "
                        "cache's limit of %d (cache.max_size_gb)", kind, key, size,
                        self.max_bytes)
            return
        try:
            _makedirs_private(path.parent)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")  # mode 0600
            with os.fdopen(fd, "wb") as f:
                f.write(header + b"\n" + payload)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("arbiter cache: cannot write %s (%s); continuing without it", path, exc)
            return
        if self.max_bytes is not None:
            self.shrink(self.max_bytes, keep=path)

    def evict(self, kind: str, key: str, why: str) -> None:
        """Remove an entry that loaded but failed (to compile, run, or verify): kept, it
        would fail again in every later process."""
        if not self.enabled or not self.writable:
            return
        path = self.path(kind, key)
        if os.path.lexists(path):
            log.warning("arbiter cache: removing %s entry %s: %s", kind, path, why)
            self.evicted += 1
            self._remove(path)

    def remove_kind(self, kind: str) -> int:
        """Remove every entry of ``kind``; returns how many."""
        if not self.enabled:
            return 0
        return sum(self._remove(p) for p in sorted((self.dir / kind).glob("*/*.bin")))

    def shrink(self, max_bytes: int, keep: Optional[Path] = None) -> int:
        """Remove the least recently used entries until the total is at most
        ``max_bytes`` (``keep`` stays); returns the bytes removed."""
        found = entries(self.dir)
        total = sum(e.size for e in found)
        removed = 0
        for e in sorted(found, key=lambda e: e.mtime_ns):
            if total <= max_bytes:
                break
            if keep is not None and e.path == keep:
                continue
            if self._remove(e.path):
                total -= e.size
                removed += e.size
                self.evicted += 1
                log.info("arbiter cache: evicted %s (%d bytes, least recently used) to "
                         "stay under %d bytes", e.path, e.size, max_bytes)
        return removed

    def _remove(self, path: Path) -> bool:
        if not self.writable:
            return False
        try:
            path.unlink()
            return True
        except OSError:
            return False

    def _entry_limit(self) -> int:
        return min(MAX_ENTRY_BYTES, self.max_bytes) if self.max_bytes else MAX_ENTRY_BYTES

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


#: Entries served while a ``served()`` block is active in this context.
_SERVED: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar(
    "arbiter_cache_served", default=None)


@contextlib.contextmanager
def served():
    """Collect ``(cache, kind, key)`` of every entry ``Cache.get`` serves inside the
    block (this context: a thread started inside must run in a copy of it). A piece
    wraps a backend's compile in it, to evict what it loaded if the result fails."""
    found: list = []
    token = _SERVED.set(found)
    try:
        yield found
    finally:
        _SERVED.reset(token)


def _makedirs_private(d: Path) -> None:
    """Create ``d`` and any missing parent with mode 0700 (mkdir(parents=True) would give
    the parents the umask's mode, possibly group-writable, which ``untrusted`` refuses)."""
    missing = []
    for p in (d, *d.parents):
        if p.exists():
            break
        missing.append(p)
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            pass


#: Largest entry read (one GPT-2 small ONNX model is 0.5 GB).
MAX_ENTRY_BYTES = 8 * 1024 ** 3

_O_READ = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _read_entry(path: Path, limit: int):
    """An entry's bytes, or a string saying why it is not read: it must be a regular
    file, not a symbolic link (``O_NOFOLLOW``), owned by this user or root and writable
    by no one else (checked on the open file), at most ``limit`` bytes. A FIFO is
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
        if not trusted_owner(st.st_uid):
            return (f"owned by uid {st.st_uid}, not by you (uid {os.geteuid()}) or root "
                    "(entries are run as code)")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return (f"writable by others (mode {stat.filemode(st.st_mode)}; entries are run "
                    "as code)")
        if st.st_size > limit:
            return f"larger than {limit:,} bytes ({st.st_size:,})"
        return read_at_most(fd, st.st_size + 1, 1 << 24)
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
            value = attr_value(gm, n.target)
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


def from_options(enabled: bool, directory: Optional[str],
                 max_size_gb: Optional[float] = None) -> Optional[Cache]:
    """The cache a config asks for, or None (disabled, unusable or untrusted)."""
    if not enabled:
        return None
    cache = Cache(directory, DEFAULT_MAX_BYTES if max_size_gb is None
                  else int(max_size_gb * 1024 ** 3))
    return cache if cache.enabled else None
