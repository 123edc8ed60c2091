"""``Program.save``: a compiled program written to one file, to load elsewhere.

The file (archive.py) holds

* ``program.json`` + ``weights.safetensors``: the whole decomposed ATen program
  (safe_program.py): what eager runs, the inline partitions, and every partition's ATen
  graph for the fallback chain; a matrix the artifacts take only transposed is stored
  transposed (``stored_transposed`` in the manifest; shared.py);
* ``samples.safetensors``: the example inputs and the program's outputs on them (the
  check at load);
* ``partitions/<id>/...``: each compiled partition in its backend's own form
  (``Backend.save_artifact``: ONNX, OpenVINO IR, an AOTInductor package), where the
  backend can write it, without the weights ``weights.safetensors`` holds already where
  the backend can refer to them (shared.py: an ONNX model's initializers);
* ``manifest.json``: versions, the config, the input signature, the plan (each
  partition's nodes, chain, the backend that ran and its artifact), the report."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, Optional

import torch

from ..errors import describe
from ..run.chain import Entry, Mode
from .archive import write
from .format import (SavedArtifact, SavedLink, SavedManifest, SavedPartition, SavedPlan,
                     versions)
from .safe_program import to_bytes
from .shared import TRANSPOSED, SharedWeights, with_shared

log = logging.getLogger(__name__)


def tensors_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({k: v.detach().contiguous().clone() for k, v in tensors.items()})


def save(program: Any, source: Any, path: str | os.PathLike) -> None:
    arb = source.arbiter
    record = source.record
    program_json, weights = to_bytes(source.ep)
    files = {"program.json": program_json, "weights.safetensors": b""}  # written below
    shared = SharedWeights(weights)
    ins, outs = source.samples
    files["samples.safetensors"] = tensors_bytes(
        {**{f"in.{i}": t for i, t in enumerate(ins)}, **{f"out.{i}": t for i, t in enumerate(outs)}})
    pieces = arb.pieces_of(record)
    parts = []
    for part in record.plan.partitions:
        rec = record.records[part.id]
        piece = pieces.get(part.id)
        saved = SavedPartition(id=part.id, planned=part.backend, nodes=part.names,
                               chain=list(rec.chain), ran=rec.backend, inline=piece is None,
                               links=[SavedLink.of(k) for k in rec.links])
        if piece is not None:
            saved.level, entry, fn = piece.running()
            if entry is not None and not entry.inline_aten:
                saved.artifact, saved.not_saved = _artifact(part.id, entry, fn, piece.gm,
                                                            shared, files)
        parts.append(saved)
    # a matrix the artifacts take only transposed is stored transposed (the ATen program
    # gets a transposed view of it at load): a load then makes no copy of it
    flipped = sorted(k for k in shared.found if TRANSPOSED + k in shared.refs
                     and k not in shared.refs and weights[k].dim() == 2)
    files["weights.safetensors"] = tensors_bytes(
        {k: v.t() if k in flipped else v for k, v in weights.items()})
    manifest = SavedManifest(
        model=source.model, versions=versions(arb.backends),
        config=arb.config.model_dump(mode="json", exclude={"source"}),
        signature=program.signature.to_json(), plan=SavedPlan(partitions=parts),
        shared_weights=sorted(shared.refs), stored_transposed=flipped,
        report=program.report().model_dump(mode="json"))
    write(path, manifest.model_dump(mode="json"), files)
    log.info("saved %s: %d partitions, %d artifacts, %d weights shared with them", path,
             len(parts), sum(p.artifact is not None for p in parts), len(shared.found))


def _artifact(pid: int, entry: Entry, fn: Callable, gm: torch.fx.GraphModule,
              shared: SharedWeights,
              files: dict[str, bytes]) -> tuple[Optional[SavedArtifact], Optional[str]]:
    """Partition ``pid``'s artifact (its files added to ``files``), or why it has none."""
    if entry.mode is Mode.PER_SHAPE:
        return None, "compiled per shape"
    try:
        saved = with_shared(entry.backend.save_artifact, fn, gm, shared=shared)
    except Exception as exc:  # noqa: BLE001 - saved as ATen instead
        why = f"{entry.backend.name} failed to save it ({describe(exc)})"
        log.warning("partition %d: %s; saved as ATen, compiled again at load", pid, why)
        return None, why
    if saved is None:
        return None, f"{entry.backend.name} has no saved form of it"
    meta, blobs = saved
    names = {}
    for name, blob in blobs.items():
        names[name] = key = f"partitions/{pid}/{name}"
        files[key] = blob
    return SavedArtifact(backend=entry.backend.name, entry=meta, files=names), None
