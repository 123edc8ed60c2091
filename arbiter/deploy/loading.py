"""``arbiter.load``: a saved program (saving.py) made callable again.

The file is opened and checked (archive.py: format version, sizes, hashes; format.py: the
manifest's fields), the ATen program read as data (opening.py) while a thread reads and
checks the partitions' saved artifacts (each used only once its size and hash matched),
and each compiled partition becomes a piece whose chain starts with its saved artifact,
loaded here (``Backend.load_artifact``), then goes on down its saved links (rebuild.py).
A backend missing at load, an artifact that fails to load, or native code not allowed
(``native_code``) moves the partition down that chain, recorded as a fallback at stage
``load``. A backend whose version differs from the saved one gets its first call checked
against eager ATen (verify ``first``), as does every partition compiled again at load.
Then the check at load (load_check.py) runs the saved example inputs. The report says all
of it (docs/deploy.md)."""
from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from ..config import Config, ConfigLike, load_config
from ..errors import describe
from ..registry import aten_fallback, backend_names
from ..run.build import instantiate
from ..run.resources import apply as apply_resources
from .archive import Archive
from .format import SavedPartition, read, versions
from .load_check import checked
from .opening import open_program
from .rebuild import Loaded, Preloaded, build, preload, signature_of

log = logging.getLogger(__name__)


def _config(saved: dict, override: ConfigLike, notes: list[str]) -> Config:
    if override is not None:
        return load_config(override)
    data = dict(saved)
    data.pop("manifests", None)  # planning is done: the capability manifests are not read
    known = set(backend_names())
    specs = data.get("backends") or []
    names = [s if isinstance(s, str) else s.get("name") for s in specs]
    missing = [n for n in names if n not in known]
    if missing:
        notes.append(f"backend(s) {', '.join(missing)} are not installed here (unknown names)")
        data["backends"] = [s for s, n in zip(specs, names) if n in known] or ["eager"]
        data["fallback"] = [f for f in data.get("fallback", []) if f in known]
    return load_config(data)


class Loader:
    """One load (see the module)."""

    def __init__(self, path: str, config: ConfigLike, native_code: bool):
        self.path = path
        self.native_code = native_code
        self.archive = Archive(path)
        self.version = int(self.archive.manifest["format_version"])
        self.saved = read(self.archive.manifest, self.version, path)
        self.notes: list[str] = []
        self.signature = signature_of(self.saved, path)
        self.config = _config(self.saved.config, config, self.notes)
        self.backends: dict[str, Any] = {}
        self.missing: dict[str, str] = {}
        for name in self.config.chain_names():
            backend = instantiate(self.config, name)
            try:
                ok, why = backend.loadable()
            except Exception as exc:  # noqa: BLE001 - a broken install
                ok, why = False, f"broken: {describe(exc)}"
            if ok:
                self.backends[name] = backend
            else:
                self.missing[name] = why
        apply_resources(self.config.resources, [b for b in self.backends.values()
                                                if not b.inline_aten],
                        first_backend=self.config.backends[0].name, training=False)
        self.eager = aten_fallback()()
        self.versions = versions(self.backends)
        for name, saved in self.saved.versions.items():
            now = self.versions.get(name)
            if now is not None and now != saved:
                self.notes.append(f"{name}: saved with {saved}, loaded with {now}"
                                  + (": its partitions' first calls are checked against eager"
                                     if name in self.backends else ""))
                log.warning("%s: %s was %s when saved, is %s here", path, name, saved, now)

    def _changed(self, name: str) -> bool:
        saved = self.saved.versions
        return saved.get(name) != self.versions.get(name) or \
            saved.get("torch") != self.versions.get("torch")

    def loaded(self) -> Loaded:
        """The program read and its saved artifacts loaded (see the module)."""
        # the saved artifacts are read and checked in a thread while this one reads the
        # ATen program (both mostly outside the GIL: file reads, sha256)
        pool = ThreadPoolExecutor(1, thread_name_prefix="arbiter-load")
        try:
            parts = self.saved.plan.partitions
            files = {p.id: pool.submit(self._files, p) for p in parts
                     if not p.inline and self._refused(p) is None}
            opened = open_program(self.archive, self.saved, lambda fn: pool.submit(fn))
            artifacts = {}
            for p in parts:
                if not p.inline:
                    artifacts[p.id] = self._artifact(p, files.get(p.id), opened)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return Loaded(self.path, self.saved, self.signature, opened, self.config,
                      self.backends, self.missing, self.eager, artifacts, self._changed,
                      self.version, self.versions, self.notes)

    def _refused(self, p: SavedPartition) -> Optional[str]:
        """Why partition ``p``'s saved artifact is not loaded here, or None."""
        art = p.artifact
        if art is None:
            return p.not_saved or "no saved artifact"
        missing = self._missing(p)
        if missing is not None:
            return missing
        if art.entry.get("native_code") and not self.native_code:
            return (f"its {art.entry.get('format', art.backend)} artifact is native code (a "
                    "shared library), loaded only with arbiter.load(..., native_code=True)")
        return None

    def _missing(self, p: SavedPartition) -> Optional[str]:
        """Why the backend of ``p``'s saved artifact cannot load it here, or None."""
        base = p.saved_link().backend
        if base in self.backends:
            return None
        return f"{base} is not available here ({self.missing.get(base, 'not in the config')})"

    def _files(self, p: SavedPartition) -> dict[str, bytes]:
        """Partition ``p``'s artifact files, each checked (archive.py)."""
        return {k: self.archive.read(v) for k, v in p.artifact.files.items()}

    def _artifact(self, p: SavedPartition, files: Any, opened: Any
                  ) -> tuple[Optional[Preloaded], str]:
        """(the saved artifact loaded, or None; why not); ``files``: the future of its
        files (``_files``), None when ``_refused`` says why."""
        if files is None:  # refused before its files were read
            why = self._refused(p) or "not read"
            if p.artifact is not None and self._missing(p) is not None:
                # said at load, not only in the report: it runs down its saved chain
                log.warning("%s: partition %s: its saved artifact is not used: %s; it runs "
                            "down the saved chain", self.path, p.id, why)
            return None, why
        name = p.artifact.backend
        backend = self.backends[p.saved_link().backend]
        files = files.result()  # a file refused (size, hash) raises here
        try:
            return preload(backend, p, files, opened.subs[p.id].gm, opened), ""
        except Exception as exc:  # noqa: BLE001 - down the saved chain
            log.warning("%s: partition %s: %s failed to load its artifact (%s)", self.path,
                        p.id, name, describe(exc))
            return None, f"{name} failed to load it ({describe(exc)})"


def load(path: str | os.PathLike, *, config: ConfigLike = None, native_code: bool = False,
         check: bool = True) -> Any:
    """The program ``Program.save`` wrote to ``path`` (see the module; docs/deploy.md).

    ``config``: the config to load under (its backends' options; a backend it does not
    list is not used); None: the saved one. ``native_code``: load artifacts that are
    native code (AOTInductor's shared libraries); off by default, since loading one runs
    code from the file. ``check``: run the saved example inputs once and compare with
    the outputs the program gave on them when it was exported (compiles anything the load
    left to compile)."""
    start = time.perf_counter()
    loader = Loader(str(path), config, native_code)
    try:
        loaded = loader.loaded()
        program = build(loaded, None)
        if check:
            program = checked(loader.archive, loader.config.verify.tolerances, program,
                              lambda mode: build(loaded, mode))
    finally:
        loader.archive.close()
    program.deployed.load_s = time.perf_counter() - start
    return program
