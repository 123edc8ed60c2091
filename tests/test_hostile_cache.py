"""The persistent cache against hostile files and directories (docs/cache.md, "Trust").

Entries that are not regular files (a FIFO blocked the first read forever; a symlink to
/dev/zero grew memory without bound) are refused with a warning, never read.
"""
from __future__ import annotations

import logging
import os
import stat

import pytest
import torch

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


# -- the trust model: yours alone, as ssh requires of ~/.ssh ---------------------------------
OTHER_UID = 54321  # a uid that is neither this user nor root


def _can_chown() -> bool:
    return os.geteuid() == 0


def test_cache_dir_writable_by_others_is_not_used(tmp_path, caplog):
    d = tmp_path / "c"
    d.mkdir()
    d.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="arbiter.cache"):
        cache = Cache(d)
    assert not cache.enabled
    assert "writable by others" in caplog.text and str(d) in caplog.text
    assert cache.get("onnx", "ab" * 32) is None
    cache.put("onnx", "ab" * 32, b"x")
    assert not list(d.iterdir())


def test_cache_dir_writable_by_its_group_is_not_used(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    d.chmod(0o770)
    assert not Cache(d).enabled


def test_cache_dir_under_a_world_writable_parent_is_not_used(tmp_path):
    """Whoever can write the parent can replace the cache directory itself."""
    parent = tmp_path / "shared"
    parent.mkdir()
    parent.chmod(0o777)
    assert not Cache(parent / "c").enabled


def test_cache_dir_under_a_sticky_parent_is_used(tmp_path):
    """/tmp-like parents (sticky bit: no one else can move what is yours) are fine."""
    parent = tmp_path / "tmp"
    parent.mkdir()
    parent.chmod(0o1777)
    cache = Cache(parent / "c")
    assert cache.enabled and cache.writable
    assert stat.S_IMODE(os.stat(parent / "c").st_mode) == 0o700  # created for you alone


@pytest.mark.skipif(not _can_chown(), reason="needs root to give a file to another uid")
def test_cache_dir_owned_by_another_user_is_not_used(tmp_path, caplog):
    d = tmp_path / "c"
    d.mkdir(mode=0o755)
    os.chown(d, OTHER_UID, OTHER_UID)
    with caplog.at_level(logging.WARNING, logger="arbiter.cache"):
        assert not Cache(d).enabled
    assert f"uid {OTHER_UID}" in caplog.text


@pytest.mark.skipif(not _can_chown(), reason="needs root to give a file to another uid")
def test_entry_owned_by_another_user_is_refused(tmp_path, caplog):
    cache = Cache(tmp_path / "c")
    kind, key, path = _entry(cache)
    os.chown(path, OTHER_UID, OTHER_UID)
    with caplog.at_level(logging.WARNING, logger="arbiter.cache"):
        assert cache.get(kind, key) is None
    assert f"uid {OTHER_UID}" in caplog.text


def test_entry_writable_by_others_is_refused(tmp_path, caplog):
    cache = Cache(tmp_path / "c")
    kind, key, path = _entry(cache)
    path.chmod(0o666)
    with caplog.at_level(logging.WARNING, logger="arbiter.cache"):
        assert cache.get(kind, key) is None
    assert "writable by others" in caplog.text


def test_entry_folder_writable_by_others_is_refused(tmp_path):
    cache = Cache(tmp_path / "c")
    kind, key, path = _entry(cache)
    path.parent.chmod(0o777)
    assert cache.get(kind, key) is None


def test_entries_and_folders_are_created_private(tmp_path):
    cache = Cache(tmp_path / "c")
    _, _, path = _entry(cache)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def _zeroed_onnx(payload: bytes) -> bytes:
    """The ONNX model with its first output multiplied by 0 (what a hostile writer of
    the cache directory did, recomputing the entry's header)."""
    import onnx
    import onnx.helper as h

    model = onnx.load_from_string(payload)
    out = model.graph.output[0].name
    for node in model.graph.node:
        node.output[:] = [f"{o}__pre" if o == out else o for o in node.output]
        node.input[:] = [f"{i}__pre" if i == out else i for i in node.input]
    model.graph.node.append(h.make_node("Constant", [], ["__zero"], value_float=0.0))
    model.graph.node.append(h.make_node("Mul", [f"{out}__pre", "__zero"], [out]))
    return model.SerializeToString()


def _rewrite(path, kind, key, payload: bytes) -> None:
    import hashlib
    import json

    header = json.dumps({"format": 1, "kind": kind, "key": key, "length": len(payload),
                         "sha256": hashlib.sha256(payload).hexdigest()}).encode()
    path.write_bytes(header + b"\n" + payload)


def _f(x):
    return torch.relu(x) * 2 + x


def _ort_run(cache_dir, x, **extra):
    import arbiter

    torch._dynamo.reset()
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "min_block_size": 1,
                          "cache": {"dir": str(cache_dir)}, **extra})
    out = torch.compile(_f, backend=be)(x)
    return be, out


def _only_entry(cache_dir):
    from arbiter.cache.directory import entries

    (e,) = entries(cache_dir)
    return e


@pytest.mark.skipif(not _can_chown(), reason="needs root to give a file to another uid")
def test_tampered_onnx_entry_of_another_user_is_never_loaded(tmp_path, fresh_dynamo, caplog):
    """Before: anyone who could write the directory rewrote an entry (outputs x 0) with
    a valid header, and the next run loaded it silently."""
    pytest.importorskip("onnxruntime")
    d = tmp_path / "c"
    x = torch.randn(4, 4)
    _ort_run(d, x)
    e = _only_entry(d)
    _rewrite(e.path, e.kind, e.key, _zeroed_onnx(Cache(d).get(e.kind, e.key)))
    os.chown(e.path, OTHER_UID, OTHER_UID)
    with caplog.at_level(logging.WARNING, logger="arbiter.cache"):
        be, out = _ort_run(d, x)
    torch.testing.assert_close(out, _f(x))
    assert be.cache.hits == 0 and be.cache.rejected == 1
    assert f"uid {OTHER_UID}" in caplog.text


def test_tampered_onnx_entry_in_a_shared_directory_is_never_loaded(tmp_path, fresh_dynamo):
    pytest.importorskip("onnxruntime")
    d = tmp_path / "c"
    x = torch.randn(4, 4)
    _ort_run(d, x)
    e = _only_entry(d)
    _rewrite(e.path, e.kind, e.key, _zeroed_onnx(Cache(d).get(e.kind, e.key)))
    d.chmod(0o777)  # what made the tampering possible: now the cache is not used
    be, out = _ort_run(d, x)
    torch.testing.assert_close(out, _f(x))
    assert be.cache is None


def test_tampered_entry_of_your_own_is_caught_by_verify_and_evicted(tmp_path, fresh_dynamo,
                                                                     caplog):
    """Within the trust model (your own files) a rewritten entry is loaded; `verify`
    still catches it, and the entry is evicted so the next process rebuilds it."""
    pytest.importorskip("onnxruntime")
    d = tmp_path / "c"
    x = torch.randn(4, 4) + 1
    _ort_run(d, x)
    e = _only_entry(d)
    _rewrite(e.path, e.kind, e.key, _zeroed_onnx(Cache(d).get(e.kind, e.key)))
    with caplog.at_level(logging.WARNING):
        be, out = _ort_run(d, x, verify={"mode": "first"})
    torch.testing.assert_close(out, _f(x))
    assert be.cache.hits == 1 and be.cache.evicted == 1
    assert not e.path.exists() and "removing onnx entry" in caplog.text
    (p,) = [p for g in be.report().graphs for p in g.partitions]
    assert [fb.stage for fb in p.fallbacks] == ["verify"]
    be2, out2 = _ort_run(d, x, verify={"mode": "first"})  # rebuilt, right, kept
    torch.testing.assert_close(out2, _f(x))
    assert be2.cache.hits == 0 and _only_entry(d).path.exists()
    (p2,) = [p for g in be2.report().graphs for p in g.partitions]
    assert p2.backend == "onnxruntime" and not p2.fallbacks


# -- entries that load but fail are evicted ----------------------------------------------------
OPS = ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"]


def _artifact_backend(make_backend, name, fail_at):
    """A backend whose compiled form is rebuilt from cached bytes: b"good" works,
    anything else fails at ``fail_at`` ("compile" or "run")."""

    def compile(self, gm, example_inputs):
        blob = self.cached_artifact(gm, example_inputs, lambda: b"good", kind="art")
        if blob != b"good" and fail_at == "compile":
            raise RuntimeError("cannot load artifact")

        def fn(*args):
            if blob != b"good":
                raise RuntimeError("artifact crashed at run time")
            return gm(*args)
        return fn

    return make_backend(name, OPS, compile=compile)


@pytest.mark.parametrize("fail_at", ["compile", "run"])
def test_entry_that_fails_is_evicted_and_rebuilt(make_backend, fresh_dynamo, tmp_path,
                                                 caplog, fail_at):
    """Before: an entry that loaded but failed was kept, and failed again in every
    later process."""
    import arbiter

    _artifact_backend(make_backend, "art", fail_at)
    d = tmp_path / "c"
    cfg = {"backends": ["art"], "min_block_size": 1, "cache": {"dir": str(d)}}
    x = torch.randn(4, 4)
    torch.testing.assert_close(torch.compile(_f, backend=arbiter.Arbiter(cfg))(x), _f(x))
    e = _only_entry(d)
    _rewrite(e.path, e.kind, e.key, b"bad artifact")
    torch._dynamo.reset()
    with caplog.at_level(logging.WARNING):
        be = arbiter.Arbiter(cfg)
        torch.testing.assert_close(torch.compile(_f, backend=be)(x), _f(x))
    (p,) = [p for g in be.report().graphs for p in g.partitions]
    assert [fb.stage for fb in p.fallbacks] == [fail_at] and p.backend == "eager"
    assert be.cache.evicted == 1 and not e.path.exists()
    torch._dynamo.reset()
    be = arbiter.Arbiter(cfg)  # the next process: rebuilt, runs on the backend
    torch.testing.assert_close(torch.compile(_f, backend=be)(x), _f(x))
    (p,) = [p for g in be.report().graphs for p in g.partitions]
    assert p.backend == "art" and not p.fallbacks
    assert Cache(d).get(e.kind, e.key) == b"good"


# -- read-only caches are used read-only --------------------------------------------------------
@pytest.fixture
def read_only(tmp_path):
    """make(dir) makes ``dir`` read-only for this process: chmod for a normal user; for
    root (who writes through modes), a read-only bind mount, undone after the test."""
    import subprocess

    mounted = []

    def make(d):
        if os.geteuid() != 0:
            for root, dirs, files in os.walk(d):
                for n in dirs:
                    os.chmod(os.path.join(root, n), 0o555)
            d.chmod(0o555)
            return d
        ro = tmp_path / "ro"
        ro.mkdir()
        ok = subprocess.run(["mount", "--bind", str(d), str(ro)], capture_output=True)
        if ok.returncode != 0:
            pytest.skip(f"root cannot bind-mount here: {ok.stderr.decode()[:100]}")
        mounted.append(ro)
        ok = subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], capture_output=True)
        if ok.returncode != 0:
            pytest.skip(f"cannot remount read-only: {ok.stderr.decode()[:100]}")
        return ro

    yield make
    for ro in mounted:
        subprocess.run(["umount", str(ro)], check=False)


def test_read_only_cache_is_used_read_only(tmp_path, read_only, fresh_dynamo):
    """Before: a valid cache that could not be written (baked into an image) was
    ignored."""
    pytest.importorskip("onnxruntime")
    d = tmp_path / "c"
    x = torch.randn(4, 4)
    _ort_run(d, x)
    from arbiter.cache.directory import entries

    before = {e.path.name: e.mtime_ns for e in entries(d)}
    ro = read_only(d)
    be, out = _ort_run(ro, x)
    torch.testing.assert_close(out, _f(x))
    assert be.cache is not None and not be.cache.writable
    assert be.cache.hits == 1
    be.cache.put("onnx", "cd" * 32, b"x")  # not written, no error
    be.cache.evict("onnx", next(iter(before)).removesuffix(".bin"), "test")  # not removed
    assert {e.path.name: e.mtime_ns for e in entries(d)} == before


# -- a size limit, least recently used first ------------------------------------------------------
def test_size_limit_evicts_the_least_recently_used(tmp_path):
    """Before: the cache grew without bound (one GPT-2 small entry is 499 MB)."""
    cache = Cache(tmp_path / "c", max_bytes=1000)
    keys = [f"{i:02d}" + "0" * 62 for i in range(3)]
    cache.put("onnx", keys[0], b"a" * 300)
    cache.put("onnx", keys[1], b"b" * 300)
    # mtimes set explicitly: the order of uses, without relying on clock resolution
    os.utime(cache.path("onnx", keys[0]), ns=(1_000, 1_000))
    os.utime(cache.path("onnx", keys[1]), ns=(2_000, 2_000))
    assert cache.get("onnx", keys[0]) == b"a" * 300  # a use: now the most recent
    cache.put("onnx", keys[2], b"c" * 300)  # over 1000 bytes: the least recent goes
    assert cache.path("onnx", keys[0]).exists()
    assert not cache.path("onnx", keys[1]).exists()
    assert cache.path("onnx", keys[2]).exists()
    assert cache.evicted == 1


def test_entry_larger_than_the_limit_is_not_stored(tmp_path, caplog):
    cache = Cache(tmp_path / "c", max_bytes=100)
    with caplog.at_level(logging.WARNING, logger="arbiter.cache"):
        cache.put("onnx", "ab" * 32, b"x" * 500)
    assert not cache.path("onnx", "ab" * 32).exists() and "max_size_gb" in caplog.text


def test_config_max_size_reaches_the_cache(tmp_path):
    import arbiter

    be = arbiter.Arbiter({"backends": ["eager"],
                          "cache": {"dir": str(tmp_path / "c"), "max_size_gb": 0.5}})
    assert be.cache.max_bytes == 512 * 1024 ** 2


# -- arbiter cache ----------------------------------------------------------------------------------
def test_cli_cache_list_size_clear(tmp_path, capsys):
    from arbiter.cli import main

    d = tmp_path / "c"
    cache = Cache(d)
    cache.put("onnx", "ab" + "1" * 62, b"x" * 2000)
    cache.put("decision", "cd" + "2" * 62, b"{}")
    assert main(["cache", "list", "--dir", str(d)]) == 0
    out = capsys.readouterr().out
    assert "onnx" in out and "decision" in out and "2 entries" in out
    assert main(["cache", "size", "--dir", str(d)]) == 0
    out = capsys.readouterr().out
    assert "total" in out and "2 entries" in out and "10.0 GiB" in out
    assert main(["cache", "clear", "--dir", str(d), "--kind", "onnx"]) == 0
    assert "removed 1 entry (" in capsys.readouterr().out
    assert cache.get("decision", "cd" + "2" * 62) == b"{}"
    assert cache.get("onnx", "ab" + "1" * 62) is None
    assert main(["cache", "clear", "--dir", str(d)]) == 0
    assert main(["cache", "size", "--dir", str(d)]) == 0
    assert "0 entries" in capsys.readouterr().out


def test_cli_cache_warns_on_an_untrusted_directory(tmp_path, capsys):
    from arbiter.cli import main

    d = tmp_path / "c"
    d.mkdir()
    d.chmod(0o777)
    assert main(["cache", "list", "--dir", str(d)]) == 0
    assert "does not use this cache" in capsys.readouterr().err
