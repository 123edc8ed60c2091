"""The cache's directory: whether it can be trusted, and the entry files it holds.

Whether it can be trusted to hold entries that are run as code (``untrusted``), and the
entry files it holds, unread (``entries``: what ``arbiter cache`` lists and
``Cache.shrink`` evicts from). The cache itself is the package's ``__init__``.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


# -- trust -------------------------------------------------------------------------------
def trusted_owner(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def untrusted(directory: os.PathLike, stop: Optional[os.PathLike] = None) -> str:
    """Why ``directory`` cannot be trusted to hold entries, or "".

    Trusted: owned by this user or root and writable by no one else, and so is every
    directory above it, except that a directory above may be writable by others when its
    sticky bit is set (``/tmp``): no one else can then move or replace what is in it.
    With ``stop`` (the cache's root), only the directories up to it are checked, all
    strictly (an entry's own folders). Symbolic links are resolved first."""
    real = Path(os.path.realpath(directory))
    stop_real = Path(os.path.realpath(stop)) if stop is not None else None
    first = True
    for d in (real, *real.parents):
        try:
            st = os.stat(d)
        except OSError as exc:
            return f"cannot stat {d} ({exc})"
        if not trusted_owner(st.st_uid):
            return f"{d} is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}) or root"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            if first or stop_real is not None or not st.st_mode & stat.S_ISVTX:
                who = "others" if st.st_mode & stat.S_IWOTH else "its group"
                return f"{d} is writable by {who} (mode {stat.filemode(st.st_mode)})"
        first = False
        if stop_real is not None and d == stop_real:
            break
    return ""


# -- listing (arbiter cache) ----------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    """One entry file: its kind, key, path, size and last use (mtime)."""

    kind: str
    key: str
    path: Path
    size: int
    mtime_ns: int


def entries(directory: os.PathLike) -> list[Entry]:
    """Every entry file under ``directory`` (``<kind>/<xx>/<key>.bin``), unread."""
    root = Path(directory)
    out = []
    try:
        kinds = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return out
    for kind in kinds:
        if not kind.is_dir(follow_symlinks=False) or kind.name.startswith("."):
            continue
        for sub in os.scandir(kind.path):
            if not sub.is_dir(follow_symlinks=False):
                continue
            for f in os.scandir(sub.path):
                if not f.name.endswith(".bin") or f.name.startswith("."):
                    continue
                try:
                    st = f.stat(follow_symlinks=False)
                except OSError:
                    continue
                out.append(Entry(kind.name, f.name[:-4], Path(f.path), st.st_size,
                                 st.st_mtime_ns))
    return out
