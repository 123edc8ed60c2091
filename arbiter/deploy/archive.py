"""The saved program's file: one stored (uncompressed) zip of ``manifest.json`` and its files.

The manifest lists each file with its size and sha256. Reading is bounded and checked:
the manifest at most ``MAX_MANIFEST`` bytes of JSON, its format and version first
(another version is refused, naming both); every file read is listed in the manifest,
read at most its listed size plus one byte, and its size and hash compared before
anything parses it, else an ArbiterError naming the file and what differs. A stored
member is read straight from its offset, with its own file handle (``read`` may run in
several threads at once), the sha256 standing for zipfile's CRC-32; any other member
goes through zipfile. ``read_buffer`` reads a stored member into one writable uint8
tensor (the weights, without a copy: tensor_file.py), hashing each chunk in a thread
while the next is read. docs/deploy.md ("Loading, and what is checked").
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import struct
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    import torch

from ..errors import ArbiterError

FORMAT = "arbiter-program"
#: 2: an artifact may refer to the program's weights instead of holding them (shared.py);
#: 3: a weight the artifacts take only transposed is stored transposed (saving.py);
#: 4: each partition's chain as data, ``links`` (format.py; 1-3 have labels only)
FORMAT_VERSION = 4
#: the versions this arbiter reads (1: every artifact holds its own weights)
READS = (1, 2, 3, 4)
MANIFEST = "manifest.json"
MAX_MANIFEST = 64 * 1024 * 1024
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # a zip local file header: signature ... name, extra lengths
#: ``read_buffer``'s chunk: read while the one before is hashed
CHUNK = 16 * 1024 * 1024


def writable(path: str | os.PathLike, flag: str = "") -> Path:
    """``path`` as a file that can be written (a saved program, a command's ``flag``
    output): ArbiterError naming it where it is a directory or its folder does not exist,
    checked before the work that fills it (a compile of minutes)."""
    path = Path(path)
    named = f"{flag} {path}" if flag else str(path)
    if path.is_dir():
        raise ArbiterError(f"{named}: is a directory; give a file path")
    if not path.parent.is_dir():
        raise ArbiterError(f"{named}: the folder {path.parent} does not exist")
    return path


def write(path: str | os.PathLike, manifest: dict[str, Any], files: dict[str, bytes]) -> None:
    """Write ``files`` and ``manifest`` (its ``files`` key filled in) to ``path``,
    atomically (a temporary file of its own in the same folder, renamed; removed if
    anything fails)."""
    manifest = dict(manifest, format=FORMAT, format_version=FORMAT_VERSION,
                    files={name: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()}
                           for name, b in files.items()})
    path = writable(path)
    # a name no other save picks (two saves to one path at once each write their own),
    # created as open() creates files: the user's umask applies
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as raw, \
                zipfile.ZipFile(raw, "w", compression=zipfile.ZIP_STORED) as zf:
            zf.writestr(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
            for name, blob in files.items():
                zf.writestr(name, blob)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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
        if version not in READS:
            raise ArbiterError(f"{self.path}: saved in format version {version!r}; this "
                               f"arbiter reads versions {', '.join(map(str, READS))} (save "
                               "the program again with this arbiter)")
        if not isinstance(manifest.get("files"), dict):
            raise ArbiterError(f"{self.path}: {MANIFEST} lists no files")
        self.manifest = manifest

    def close(self) -> None:
        self._zip.close()

    def verify_all(self) -> None:
        """Every file the manifest lists, checked against its size and sha256 (one at a
        time): raises ``ArbiterError`` naming the first that differs."""
        for name in self.manifest["files"]:
            self.read_buffer(name)

    def _entry(self, name: str) -> tuple[int, Any]:
        entry = self.manifest["files"].get(name)
        if not isinstance(entry, dict) or not isinstance(entry.get("size"), int):
            raise ArbiterError(f"{self.path}: {name} is not listed in {MANIFEST}")
        return entry["size"], entry.get("sha256")

    def _verify(self, name: str, got: int, size: int, digest: str, want: Any) -> None:
        if got != size:
            raise ArbiterError(f"{self.path}: {name} has {got} bytes, {MANIFEST} says "
                               f"{size} (truncated or altered)")
        if digest != want:
            raise ArbiterError(f"{self.path}: {name} does not match its sha256 in "
                               f"{MANIFEST} (altered or corrupted)")

    def read(self, name: str) -> bytes:
        """The file ``name``, checked against the manifest's size and sha256."""
        size, want = self._entry(name)
        blob = self._read_stored(name, size, self._read_whole)
        if blob is None:
            blob = self._read_member(name, size)
        self._verify(name, len(blob), size, hashlib.sha256(blob).hexdigest(), want)
        return blob

    def read_buffer(self, name: str) -> "torch.Tensor":
        """The file ``name`` as a uint8 tensor of its own (writable), checked as ``read``
        checks (see the module)."""
        import torch

        size, want = self._entry(name)
        buf = torch.empty(size, dtype=torch.uint8)
        view = memoryview(buf.numpy())
        got_digest = self._read_stored(name, size, lambda f, _: self._read_hashed(f, view))
        if got_digest is None:  # a member zipfile must read: whole, then copied
            blob = self._read_member(name, size)
            self._verify(name, len(blob), size, hashlib.sha256(blob).hexdigest(), want)
            view[:] = blob
            return buf
        got, digest = got_digest
        self._verify(name, got, size, digest, want)
        return buf

    @staticmethod
    def _read_whole(f: Any, size: int) -> bytes:
        parts = [f.read(size)]
        got = len(parts[0])
        while got < size and parts[-1]:  # a short read (a huge member): the rest
            parts.append(f.read(size - got))
            got += len(parts[-1])
        return parts[0] if len(parts) == 1 else b"".join(parts)

    @staticmethod
    def _read_hashed(f: Any, view: memoryview) -> tuple[int, str]:
        """(bytes read, their sha256) of ``len(view)`` bytes of ``f`` read into ``view``,
        each chunk hashed in a thread while the next is read."""
        from concurrent.futures import ThreadPoolExecutor

        h = hashlib.sha256()
        got, pending = 0, None
        with ThreadPoolExecutor(1, thread_name_prefix="arbiter-hash") as pool:
            while got < len(view):
                n = f.readinto(view[got:got + CHUNK])
                if not n:
                    break
                if pending is not None:
                    pending.result()
                pending = pool.submit(h.update, view[got:got + n])
                got += n
            if pending is not None:
                pending.result()
        return got, h.hexdigest()

    def _read_stored(self, name: str, size: int, reader: Callable[[Any, int], Any]
                     ) -> Optional[Any]:
        """``reader(f, size)`` on a stored member's file positioned at its bytes (see the
        module); None for a member zipfile must read."""
        try:
            info = self._zip.getinfo(name)
        except KeyError:
            raise ArbiterError(f"{self.path}: {name} is missing (truncated?)") from None
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
            return None
        if info.file_size != size or info.compress_size != size:
            raise ArbiterError(f"{self.path}: {name} has {info.file_size} bytes, {MANIFEST} "
                               f"says {size} (truncated or altered)")
        try:
            with open(self.path, "rb", buffering=0) as f:
                f.seek(info.header_offset)
                head = f.read(_LOCAL_HEADER.size)
                if len(head) != _LOCAL_HEADER.size:
                    raise EOFError("the local header is cut")
                magic, name_len, extra_len = _LOCAL_HEADER.unpack(head)
                if magic != b"PK\x03\x04" or f.read(name_len) != info.orig_filename.encode(
                        "utf-8" if info.flag_bits & 0x800 else "cp437"):
                    raise zipfile.BadZipFile("the local header does not match the directory")
                f.seek(extra_len, os.SEEK_CUR)
                return reader(f, size)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            raise ArbiterError(f"{self.path}: {name} cannot be read: truncated or altered "
                               f"({type(exc).__name__}: {exc})") from None

    def _read_member(self, name: str, size: int) -> bytes:
        try:
            with self._zip.open(name) as f:
                return f.read(size + 1)  # one byte more: a longer member is seen
        except KeyError:
            raise ArbiterError(f"{self.path}: {name} is missing (truncated?)") from None
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            raise ArbiterError(f"{self.path}: {name} cannot be read: truncated or altered "
                               f"({type(exc).__name__}: {exc})") from None
