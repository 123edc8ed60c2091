"""``Program.save``: the program's file (archive.py) holds

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
import platform
from typing import Any

import torch

from .._version import __version__
from ..errors import describe
from .archive import write
from .safe_program import to_bytes
from .shared import TRANSPOSED, SharedWeights, with_shared

log = logging.getLogger(__name__)


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


def tensors_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({k: v.detach().contiguous().clone() for k, v in tensors.items()})


def save(program: Any, source: Any, path: str | os.PathLike) -> None:
    from ..run.dynamic import Checked

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
        entry: dict[str, Any] = {"id": part.id, "planned": part.backend, "nodes": part.names,
                                 "chain": list(rec.chain), "ran": rec.backend,
                                 "inline": part.id not in pieces, "artifact": None}
        piece = pieces.get(part.id)
        if piece is not None:
            view, fn = piece.current()
            entry["level"] = piece.level()
            if view is not None and not view.inline_aten:
                backend = getattr(view, "backend", view)
                raw = fn.fn if isinstance(fn, Checked) else fn
                why = None
                if getattr(view, "mode", "") == "per shape":
                    why = "compiled per shape"
                saved = None
                if why is None:
                    try:
                        saved = with_shared(backend.save_artifact, raw, piece.gm,
                                            shared=shared)
                    except Exception as exc:  # noqa: BLE001 - saved as ATen instead
                        why = f"{backend.name} failed to save it ({describe(exc)})"
                        log.warning("partition %d: %s; saved as ATen, compiled again at "
                                    "load", part.id, why)
                if saved is not None:
                    meta, blobs = saved
                    names = {}
                    for name, blob in blobs.items():
                        key = f"partitions/{part.id}/{name}"
                        files[key] = blob
                        names[name] = key
                    entry["artifact"] = {"backend": backend.name, "entry": meta, "files": names}
                else:
                    entry["not_saved"] = why or f"{backend.name} has no saved form of it"
        parts.append(entry)
    # a matrix the artifacts take only transposed is stored transposed (the ATen program
    # gets a transposed view of it at load): a load then makes no copy of it
    flipped = sorted(k for k in shared.found if TRANSPOSED + k in shared.refs
                     and k not in shared.refs and weights[k].dim() == 2)
    files["weights.safetensors"] = tensors_bytes(
        {k: v.t() if k in flipped else v for k, v in weights.items()})
    report = program.report()
    config = arb.config.model_dump(mode="json", exclude={"source"})
    manifest = {
        "model": source.model,
        "versions": versions(arb.backends),
        "config": config,
        "signature": program.signature.to_json(),
        "plan": {"partitions": parts},
        "shared_weights": sorted(shared.refs),
        "stored_transposed": flipped,
        "report": report.model_dump(mode="json"),
    }
    write(path, manifest, files)
    log.info("saved %s: %d partitions, %d artifacts, %d weights shared with them", path,
             len(parts), sum(p["artifact"] is not None for p in parts), len(shared.found))
