"""A loaded program's partitions made runnable, on the chains they were saved with.

Each compiled partition's chain is its saved artifact, loaded (``Preloaded``), then its
saved links from the entry that ran when it was saved (the same backend compiled again
from ATen, the next ones), ending in eager ATen; an entry whose backend is not here is
left out and said in the report. The pieces are made as compiling makes them (run/build.py) and
stitched on the saved plan."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..config import Config, VerifyOptions
from ..errors import ArbiterError
from ..backend import Backend
from ..run.build import entry_of, new_piece
from ..run.chain import Entry, Link, Mode
from ..run.dynamic import Checked
from ..run.record import Fallback, PieceRecord
from ..run.split import stitch
from .format import SavedManifest, SavedPartition
from .opening import Opened
from .program import Deployed, Program
from .report import loaded_report
from .shared import with_shared
from .signature import Signature


class Preloaded(Entry):
    """A chain entry standing for a saved artifact, loaded already."""

    mode = Mode.SAVED

    def __init__(self, backend: Backend, fn: Callable, precision: str = ""):
        super().__init__(backend)
        self._precision = precision
        self._fn = fn

    @property
    def link(self) -> Link:
        return Link(self.backend.name, self._precision, Mode.SAVED)

    def graph_for(self, gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        return gm  # compiled already

    def compile(self, gm: torch.fx.GraphModule, args: Any) -> Callable:
        return self._fn


def signature_of(saved: SavedManifest, path: str) -> Signature:
    """The saved program's input signature (signature.py)."""
    try:
        return Signature.from_json(saved.signature)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ArbiterError(f"{path}: manifest.json is malformed "
                           f"({type(exc).__name__}: {exc})") from None


def preload(backend: Backend, p: SavedPartition, files: dict[str, bytes], gm: torch.fx.GraphModule,
            opened: Opened) -> Preloaded:
    """Partition ``p``'s saved artifact loaded by ``backend`` (raises what it raises); one
    its saved link says was symbolic checked per call as when it was compiled
    (run/dynamic.py)."""
    link = p.saved_link()
    fn = with_shared(backend.load_artifact, dict(p.artifact.entry), files, gm,
                     shared=opened.shared)
    if link.mode is Mode.SYMBOLIC:
        fn = Checked(fn, gm, [])
    return Preloaded(backend, fn, link.precision)


@dataclass
class Loaded:
    """What the loader hands over: the program read, the backends here, and each
    compiled partition's saved artifact loaded (or why not)."""

    path: str
    saved: SavedManifest
    signature: Any
    opened: Opened
    config: Config
    backends: dict[str, Any]
    missing: dict[str, str]  # backend -> why it is not usable here
    eager: Any
    artifacts: dict[int, tuple[Optional[Preloaded], str]]
    changed: Callable[[str], bool]  # whether a backend's version differs from the saved one
    version: int  # the file's format version
    versions: dict[str, str]  # python's, torch's, arbiter's and the backends' here
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """The file's name: what its pieces' logs and records call the graph."""
        return os.path.basename(self.path)


def chain_at_load(ld: Loaded, p: SavedPartition) -> tuple[list[Entry], list[tuple[str, str]]]:
    """The chain at load, and (entry, why) for each saved entry left out."""
    pre, why = ld.artifacts[p.id]
    left: list[tuple[str, str]] = []
    chain: list[Entry] = [pre] if pre is not None else []
    if pre is None and p.artifact is not None:
        left.append((p.artifact.backend, why))
    for saved in p.links[p.level:]:
        link = saved.link()
        if link.backend == ld.eager.name:
            break
        backend = ld.backends.get(link.backend)
        if backend is None or link.precision:
            if all(link.name != frm for frm, _ in left):  # one note per backend
                left.append((link.name, "not available here (" + (
                    "a lower-precision variant is not rebuilt at load" if link.precision else
                    ld.missing.get(link.backend, "not in the config")) + ")"))
            continue
        chain.append(entry_of(link, backend, limit=ld.config.shapes.max_specializations,
                              tolerances=ld.config.verify.tolerances, graph_label=ld.label))
    chain.append(Entry(ld.eager))
    return chain, left


def build(ld: Loaded, verify_all: Optional[str]) -> Program:
    """The program with fresh pieces; ``verify_all``: a verify mode for every piece
    (``first``), or None: each piece's own (docs/deploy.md)."""
    runners, inline, records = {}, set(), {}
    rows = []
    for p in ld.saved.plan.partitions:
        if p.inline:
            inline.add(p.id)
            records[p.id] = PieceRecord.of_links(p.id, p.planned, [k.link() for k in p.links],
                                                 backend=ld.eager.name)
            rows.append((p, "eager", ""))
            continue
        chain, left = chain_at_load(ld, p)
        first = chain[0]
        verify = ld.config.verify
        if verify_all is not None or not isinstance(first, Preloaded) or \
                ld.changed(first.backend.name):
            verify = VerifyOptions(mode="first", tolerances=verify.tolerances)
        elif verify.mode == "unverified":  # its first-use checks ran before it was saved
            verify = VerifyOptions(mode="off", tolerances=verify.tolerances)
        sub = ld.opened.subs[p.id]
        piece = new_piece(p.id, p.planned, sub.gm, chain, ld.label, ld.config, verify=verify)
        for frm, why in left:
            piece.record.fallbacks.append(Fallback(frm, first.name, "load", why))
        records[p.id] = piece.record
        runners[p.id] = (sub, piece)
        reasons = [f"{f}: {w}" for f, w in left]
        if p.artifact is None and not isinstance(first, Preloaded):
            reasons.insert(0, f"saved as ATen: {p.not_saved or 'no artifact'}")
        rows.append((p, "saved artifact" if isinstance(first, Preloaded) else
                     "eager" if first.inline_aten else "pending", "; ".join(reasons)))
    fn = stitch(ld.opened.plan, runners, inline)
    deployed = Deployed(ld.path, ld.version, dict(ld.saved.versions), ld.versions,
                        notes=list(ld.notes))
    deployed.partitions = [
        {"id": p.id, "saved_backend": p.ran or p.planned,
         "artifact": p.artifact.entry.get("format", "aten") if p.artifact is not None
         else ("eager" if p.inline else "aten"),
         "loaded": how, "reason": why} for p, how, why in rows]
    report = ld.saved.report
    return Program(fn, ld.signature, ld.opened.graph.weights,
                   lambda: loaded_report(report, records, deployed), deployed=deployed)


