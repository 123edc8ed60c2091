"""The persistent cache against hostile files and directories (docs/cache.md, "Trust").

Entries that are not regular files (a FIFO blocked the first read forever; a symlink to
/dev/zero grew memory without bound) are refused with a warning, never read.
"""
from __future__ import annotations

import logging
import os

import pytest

from arbiter.cache import Cache


def _entry(cache: Cache, kind="onnx", key="ab" + "0" * 62):
    cache.put(kind, key, b"payload bytes")
    path = cache.path(kind, key)
    assert path.is_file()
    return kind, key, path


# -- entries that are not regular files --------------------------------------------------
def test_fifo_entry_is_refused_without_blocking(tmp_path, caplog):
    cache = Cache(tmp_path / "c")
    kind, key, path = _entry(cache)
    path.unlink()
    os.mkfifo(path)
    with caplog.at_level(logging.WARNING, logger="arbiter.cache"):
        assert cache.get(kind, key) is None
    assert "not a regular file" in caplog.text and str(path) in caplog.text
    assert cache.rejected == 1
    assert not path.exists()  # removed, so the next put rebuilds it


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom"])
def test_symlink_entry_is_refused(tmp_path, caplog, target):
    if not os.path.exists(target):
        pytest.skip(f"{target} does not exist here")
    cache = Cache(tmp_path / "c")
    kind, key, path = _entry(cache)
    path.unlink()
    path.symlink_to(target)
    with caplog.at_level(logging.WARNING, logger="arbiter.cache"):
        assert cache.get(kind, key) is None
    assert "symbolic link" in caplog.text
    assert not os.path.lexists(path)
    assert os.path.exists(target)  # the link went, never what it pointed to


def test_symlink_to_a_valid_entry_is_refused(tmp_path):
    """An entry elsewhere (another user's file, say) linked into the cache is not ours."""
    cache = Cache(tmp_path / "c")
    kind, key, path = _entry(cache)
    elsewhere = tmp_path / "elsewhere.bin"
    os.replace(path, elsewhere)
    path.symlink_to(elsewhere)
    assert cache.get(kind, key) is None
    assert elsewhere.exists()


def test_directory_entry_is_refused(tmp_path):
    cache = Cache(tmp_path / "c")
    kind, key, path = _entry(cache)
    path.unlink()
    path.mkdir()
    assert cache.get(kind, key) is None
