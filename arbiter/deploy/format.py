"""The saved program's manifest as typed models, written by saving and read by loading.

``SavedManifest`` is what ``manifest.json`` holds besides the archive's own keys
(archive.py: format, version, files). Each partition keeps its chain twice: ``links``,
the chain as data that the loader rebuilds (run/chain.py), and ``chain``, the labels the
report showed. Files of format versions 1 to 3 have no ``links``: ``upgrade`` derives them
from the labels, the one place a label is read back (their layout is fixed: ``name`` or
``name (mode)``, a variant's name ``backend:precision``)."""
from __future__ import annotations

import platform
from typing import Any, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .._version import __version__
from ..errors import ArbiterError, describe
from ..run.chain import Link, Mode

#: the version whose partitions carry ``links``
LINKS_SINCE = 4


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class SavedLink(_Model):
    """One entry of a partition's chain (``run.chain.Link``)."""

    backend: str
    precision: str = ""
    mode: Mode = Field(Mode.STATIC, strict=False)

    @classmethod
    def of(cls, link: Link) -> "SavedLink":
        return cls(backend=link.backend, precision=link.precision, mode=link.mode)

    def link(self) -> Link:
        return Link(self.backend, self.precision, self.mode)


class SavedArtifact(_Model):
    """A compiled partition in its backend's own form (``Backend.save_artifact``)."""

    backend: str  # the entry's name (a variant's: ``onnxruntime:fp16``)
    entry: dict[str, Any] = Field(default_factory=dict)
    files: dict[str, str]  # the artifact's file name -> its name in the archive


class SavedPartition(_Model):
    id: int
    planned: str
    ran: str
    inline: bool
    nodes: list[str]
    chain: list[str]  # the labels, as the report shows them
    links: list[SavedLink] = Field(default_factory=list)
    level: int = 0  # the chain entry that ran when saved
    artifact: Optional[SavedArtifact] = None
    not_saved: Optional[str] = None  # why it has no artifact

    def saved_link(self) -> Link:
        """The link of the entry that ran when it was saved (its artifact's)."""
        return self.links[self.level].link()


class SavedPlan(_Model):
    partitions: list[SavedPartition]


class SavedManifest(_Model):
    model: Any = None
    versions: dict[str, str]
    config: dict[str, Any]
    signature: Any
    plan: SavedPlan
    shared_weights: Optional[list[str]] = None
    stored_transposed: list[str] = Field(default_factory=list)
    report: dict[str, Any]


def link_of_label(label: str) -> Link:
    """A version 1-3 chain label as a link (see the module)."""
    name, _, mode = label.partition(" (")
    backend, _, precision = name.partition(":")
    return Link(backend, precision, Mode(mode.rstrip(")")) if mode else Mode.STATIC)


def read(manifest: dict, version: int, path: str) -> SavedManifest:
    """``manifest`` (an Archive's, of format ``version``) validated: ArbiterError naming
    the field otherwise."""
    try:
        saved = SavedManifest.model_validate(manifest)
        if version < LINKS_SINCE:
            for p in saved.plan.partitions:
                p.links = [SavedLink.of(link_of_label(x)) for x in p.chain]
    except ValidationError as exc:
        raise ArbiterError(f"{path}: manifest.json is malformed ({_words(exc)})") from None
    except ValueError as exc:  # a label of no known mode
        raise ArbiterError(f"{path}: manifest.json is malformed ({exc})") from None
    for p in saved.plan.partitions:
        if len(p.links) != len(p.chain) or not 0 <= p.level < len(p.links):
            raise ArbiterError(f"{path}: manifest.json is malformed (partition {p.id}: its "
                               "links, chain and level do not agree; a chain is never "
                               "empty)")
    return saved


def _words(exc: ValidationError) -> str:
    out = []
    for err in exc.errors()[:3]:
        loc = list(err["loc"])
        if loc[:2] == ["plan", "partitions"] and len(loc) > 2:
            where = f"partition {loc[2]}: {'.'.join(map(str, loc[3:]))}"
        else:
            where = ".".join(map(str, loc))
        out.append(f"{where}: {err['msg']}")
    return "; ".join(out)


def versions(backends: dict[str, Any]) -> dict[str, str]:
    """python, torch, arbiter and each backend's ``version()``."""
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "arbiter": __version__}
    for name, b in backends.items():
        try:
            out[name] = str(b.version())
        except Exception as exc:  # noqa: BLE001 - an unavailable backend has none
            out[name] = f"unavailable ({describe(exc)})"
    return out
