"""Output paths a command writes, checked before the work that fills them."""
from __future__ import annotations

from pathlib import Path

from ..errors import ArbiterError


def output_file(path: str, flag: str) -> Path:
    """``path`` as a file ``flag`` may write: ArbiterError naming both where it is a
    directory or its folder does not exist (before a compile of minutes, not after)."""
    out = Path(path)
    if out.is_dir():
        raise ArbiterError(f"{flag} {path}: is a directory; give a file path")
    folder = out.parent
    if not folder.is_dir():
        raise ArbiterError(f"{flag} {path}: the folder {folder} does not exist")
    return out
