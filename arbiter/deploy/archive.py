"""The saved program's file: one zip archive (stored, not compressed) holding
``manifest.json`` and the files it lists, each with its size and sha256.

Reading is bounded and checked: the manifest at most ``MAX_MANIFEST`` bytes of JSON, its
format and version first (another version is refused, naming both); every file read is
listed in the manifest, read at most its listed size plus one byte, and its size and hash
compared before anything parses it. A truncated or altered file is refused with an
ArbiterError naming the file and what differs."""
from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path
from typing import Any

from ..errors import ArbiterError

FORMAT = "arbiter-program"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MAX_MANIFEST = 64 * 1024 * 1024


def write(path: str | os.PathLike, manifest: dict[str, Any], files: dict[str, bytes]) -> None:
    """Write ``files`` and ``manifest`` (its ``files`` key filled in) to ``path``,
    atomically (a temporary file renamed)."""
    manifest = dict(manifest, format=FORMAT, format_version=FORMAT_VERSION,
                    files={name: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()}
                           for name, b in files.items()})
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
        for name, blob in files.items():
            zf.writestr(name, blob)
    os.replace(tmp, path)


class Archive:
    """A saved program opened for reading (see the module)."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        try:
            self._zip = zipfile.ZipFile(self.path)
            info = self._zip.getinfo(MANIFEST)
        except FileNotFoundError:
            raise ArbiterError(f"{self.path}: no such file") from None
        except (zipfile.BadZipFile, KeyError, OSError, EOFError) as exc:
            raise ArbiterError(f"{self.path}: not a saved arbiter program, or truncated "
                               f"({type(exc).__name__}: {exc})") from None
        if info.file_size > MAX_MANIFEST:
            raise ArbiterError(f"{self.path}: {MANIFEST} is {info.file_size} bytes, over the "
                               f"limit of {MAX_MANIFEST}")
        raw = self._read_member(MANIFEST, info.file_size)
        try:
            manifest = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ArbiterError(f"{self.path}: {MANIFEST} is not valid JSON ({exc})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ArbiterError(f"{self.path}: not a saved arbiter program ({MANIFEST} says "
                               f"format {manifest.get('format') if isinstance(manifest, dict) else None!r})")
        version = manifest.get("format_version")
        if version != FORMAT_VERSION:
            raise ArbiterError(f"{self.path}: saved in format version {version!r}; this "
                               f"arbiter reads version {FORMAT_VERSION} only (save the "
                               "program again with this arbiter)")
        if not isinstance(manifest.get("files"), dict):
            raise ArbiterError(f"{self.path}: {MANIFEST} lists no files")
        self.manifest = manifest

    def close(self) -> None:
        self._zip.close()

    def read(self, name: str) -> bytes:
        """The file ``name``, checked against the manifest's size and sha256."""
        entry = self.manifest["files"].get(name)
        if not isinstance(entry, dict) or not isinstance(entry.get("size"), int):
            raise ArbiterError(f"{self.path}: {name} is not listed in {MANIFEST}")
        size = entry["size"]
        blob = self._read_member(name, size)
        if len(blob) != size:
            raise ArbiterError(f"{self.path}: {name} has {len(blob)} bytes, {MANIFEST} says "
                               f"{size} (truncated or altered)")
        if hashlib.sha256(blob).hexdigest() != entry.get("sha256"):
            raise ArbiterError(f"{self.path}: {name} does not match its sha256 in "
                               f"{MANIFEST} (altered or corrupted)")
        return blob

    def _read_member(self, name: str, size: int) -> bytes:
        try:
            with self._zip.open(name) as f:
                return f.read(size + 1)  # one byte more: a longer member is seen
        except KeyError:
            raise ArbiterError(f"{self.path}: {name} is missing (truncated?)") from None
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            raise ArbiterError(f"{self.path}: {name} cannot be read: truncated or altered "
                               f"({type(exc).__name__}: {exc})") from None
