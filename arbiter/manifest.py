"""Capability manifests: what a backend says it can run, as data.

One YAML file per backend (``capabilities/<backend>.yaml``)::

    backend: onnxruntime
    format: 1
    source: how the file was made (generator command, versions)
    defaults:                 # apply to every op entry that does not say otherwise
      dtypes: [float32, float16, int64, bool]
      devices: [cpu]
      dynamic: false          # may its ops take symbolic shapes? (`arbiter probe --dynamic`)
      verified: declared      # `declared`, or the probe that confirmed the entry
    ops:
      aten.mm.default:        # written by `arbiter probe --write`:
        dtypes: [float32, float64, int64]   # what may run: declared minus tried-and-failed
        verified: probed
        probed_dtypes: [float32]            # the dtypes that passed the probe
        training_dtypes: [float32]          # ... in a training graph (`probe --grad`)
      aten.addmm.default: {}  # one overload
      aten.gelu: {}           # every overload of aten.gelu
      aten.convolution.default: {max_rank: 5, note: "2-D and 3-D only"}
      aten.nll_loss_forward.default:       # written by `arbiter probe`: a float32 node
        wrong_outputs: {1: {float32: "max abs error 7"}}   # that uses output 1 is refused
      "*": {}                 # wildcard: any op (the eager backend)
    patterns:                 # subgraphs claimed whole, matched on the lowered graph
      rms_norm: {dtypes: [float32, float16]}   # a pattern of arbiter/plan/pattern_library.py
      mine: {function: "my_pkg.patterns:fused", inputs: [[4, 8], [8]]}  # any Python function
    decompositions: []        # ops this backend runs decomposed (PyTorch's table): only
                              # the nodes it takes are decomposed (arbiter/decompose/)

Lookup order for a node's op: the exact overload, then the op without overload, then
``"*"``. What data cannot say, a backend says in code with a validator (see
``arbiter.backend.Backend.validators``; for patterns ``Backend.check_pattern``).
``verified:`` says how an entry is known: ``declared`` (by the backend's own software),
``built`` (``arbiter probe --build-only``: converted and built, not run; ``built_dtypes``)
or ``probed`` (run and compared with eager; ``probed_dtypes``). ``training_dtypes`` (written
by ``arbiter probe --grad``; absent in manifests from before it) is the part of
``probed_dtypes`` that passed in a training graph: AOTAutograd's forward with every
output it returns compared, those saved for the backward included, or its backward. It
is a record of where an op was probed, not a condition: what may run is ``dtypes``.
"""
from __future__ import annotations

import functools
import logging
import re
from pathlib import Path
from typing import Any, Literal, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import ConfigError, ManifestError, UnknownOpError, require_known
from .ops import packet_name, resolve
from .yamlsrc import Located, load_file, load_text, validation_error

log = logging.getLogger(__name__)

#: dtype names as torch spells them (``torch.float32`` -> ``float32``).
DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
              torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
              torch.complex64, torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2)
}
DEVICES = ("cpu", "cuda", "xpu", "mps", "meta")


def _check_dtypes(v: Optional[list[str]]) -> Optional[list[str]]:
    require_known("dtype", v or (), DTYPES)
    return v


def _check_devices(v: Optional[list[str]]) -> Optional[list[str]]:
    require_known("device", v or (), DEVICES)
    return v


class OpEntry(BaseModel):
    """What a backend supports of one op. Unset fields take the manifest's defaults."""

    model_config = ConfigDict(extra="forbid")

    dtypes: Optional[list[str]] = Field(None, description="dtypes every tensor input and "
                                        "output of the node must have")
    devices: Optional[list[str]] = Field(None, description="devices the node may run on")
    dynamic: Optional[bool] = Field(None, description="whether the op may take symbolic "
                                    "shapes (one artifact for every size); written by "
                                    "`arbiter probe --dynamic` (two sizes through one "
                                    "artifact). Without it a symbolic node is compiled per "
                                    "concrete shape (config `shapes`)")
    max_rank: Optional[int] = Field(None, ge=0, description="largest tensor rank accepted")
    verified: Optional[str] = Field(None, description="`declared`, `built` (converted "
                                    "and built by `arbiter probe --build-only`, not run) or "
                                    "`probed` (run and compared with eager)")
    probed_dtypes: Optional[list[str]] = Field(
        None, description="dtypes that passed `arbiter probe` (a subset of the allowed "
        "dtypes); the others allowed are declared, not verified")
    built_dtypes: Optional[list[str]] = Field(
        None, description="dtypes whose samples `arbiter probe --build-only` converted and "
        "built (not run: numbers were not compared)")
    training_dtypes: Optional[list[str]] = Field(
        None, description="the `probed_dtypes` in which a training graph holding the op "
        "passed `arbiter probe --grad` (AOTAutograd's forward, every output it returns "
        "compared, those saved for the backward included; or its backward). A record of "
        "what was probed where: what may run is `dtypes`, what is verified "
        "`probed_dtypes`")
    wrong_outputs: Optional[dict[int, dict[str, str]]] = Field(
        None, description="output index -> {dtype: why}: outputs of a tuple-returning op "
        "that the backend computes wrongly in samples of that dtype while the others are "
        "right, or cannot return (a training forward that failed only with them returned; "
        "written by `arbiter probe`, which compares every output); a node of such a "
        "dtype that uses one is refused")
    note: Optional[str] = Field(None, description="free text shown in reports")

    _dtypes = field_validator("dtypes", "probed_dtypes", "built_dtypes", "training_dtypes")(
        classmethod(lambda cls, v: _check_dtypes(v)))
    _devices = field_validator("devices")(classmethod(lambda cls, v: _check_devices(v)))
    _wrong = field_validator("wrong_outputs")(classmethod(
        lambda cls, v: v if v is None or [_check_dtypes(list(p)) for p in v.values()] else v))


class Defaults(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dtypes: list[str] = Field(default_factory=lambda: ["float32"])
    devices: list[str] = Field(default_factory=lambda: ["cpu"])
    dynamic: bool = False
    verified: str = "declared"

    _dtypes = field_validator("dtypes")(classmethod(lambda cls, v: _check_dtypes(v)))
    _devices = field_validator("devices")(classmethod(lambda cls, v: _check_devices(v)))


class PatternEntry(BaseModel):
    """A subgraph a backend claims as one unit (``patterns:``; arbiter/plan/patterns.py).

    Matched on the lowered ATen graph with torch.fx's ``SubgraphMatcher``; the tensors
    entering and leaving a match are checked against ``dtypes``/``devices``/``dynamic``/
    ``max_rank`` like an op's, then by the backend's ``check_pattern``."""

    model_config = ConfigDict(extra="forbid")

    function: Optional[str] = Field(
        None, description="`module:function`: a Python function of tensors, traced to ATen "
        "as the pattern (its literals must match exactly). Absent: the pattern library's "
        "function of the entry's name (arbiter/plan/pattern_library.py), whose literals "
        "(eps, dims, scale) are matched as wildcards and checked by the library")
    inputs: Optional[list[list[int]]] = Field(
        None, description="with `function`: the shape of each argument it is traced with")
    dtypes: Optional[list[str]] = Field(None, description="dtypes every tensor entering "
                                        "or leaving the match must have")
    devices: Optional[list[str]] = Field(None, description="devices the match may run on")
    dynamic: Optional[bool] = Field(None, description="whether symbolic shapes are accepted")
    max_rank: Optional[int] = Field(None, ge=0, description="largest tensor rank accepted")
    verified: Optional[str] = Field(None, description="`declared`, or how the claim was "
                                    "checked (`tested`: the backend's tests compare it with "
                                    "eager)")
    note: Optional[str] = Field(None, description="free text shown in reports")

    _dtypes = field_validator("dtypes")(classmethod(lambda cls, v: _check_dtypes(v)))
    _devices = field_validator("devices")(classmethod(lambda cls, v: _check_devices(v)))

    @field_validator("function")
    @classmethod
    def _function(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*", v):
            raise ValueError(f"function {v!r} is not `module.path:function`")
        return v


class ProbeInfo(BaseModel):
    """What `arbiter probe` found (written by it): versions, counts, failed ops."""

    model_config = ConfigDict(extra="forbid")

    date: str
    torch: str
    backend_version: str
    device: str = Field("cpu", description="the device the probe's samples ran on")
    mode: Literal["run", "build"] = Field("run", description="`run`: samples run and "
                                          "compared with eager; `build`: converted and "
                                          "built only (`--build-only`)")
    dtypes_tried: list[str] = Field(default_factory=list)
    opinfos: str = Field("", description="OpInfos probed / OpInfos selected")
    samples_passed: int = 0
    samples_failed: int = 0
    samples_skipped: int = 0
    training_opinfos: str = Field("", description="`arbiter probe --grad` (training "
                                  "graphs): OpInfos probed / selected")
    training_samples_passed: int = Field(0, description="`--grad`: graphs (forward and "
                                         "backward counted apart) that passed")
    training_samples_failed: int = 0
    training_samples_skipped: int = 0
    failed: dict[str, str] = Field(default_factory=dict, description="ops removed "
                                   "because every sample of them alone failed, with why")
    unverified: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="op -> {dtype: why}: a sample of the op alone "
        "gave wrong numbers in that dtype while another sample (other arguments) passed: "
        "the dtype stays allowed but is not in `probed_dtypes` (kept while the versions "
        "are the same)")
    dtypes_dropped: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="op -> {dtype: why}: declared dtypes a sample "
        "with the op tried and no sample passed, so the op no longer allows them")
    dynamic_opinfos: str = Field("", description="`arbiter probe --dynamic`: OpInfos "
                                 "probed / selected")
    dynamic_samples_passed: int = 0
    dynamic_samples_failed: int = 0
    dynamic_failed: dict[str, str] = Field(
        default_factory=dict, description="op -> why: ops whose sample alone failed at two "
        "sizes through one artifact (they stay `dynamic: false`)")
    dynamic_partial: dict[str, str] = Field(
        default_factory=dict, description="op -> why: ops marked `dynamic` that passed "
        "only with the innermost size of each input static (a feature size), and how "
        "they failed with every size symbolic")


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: str
    format: Literal[1] = 1
    source: Optional[str] = Field(None, description="how this file was produced")
    defaults: Defaults = Field(default_factory=Defaults)
    ops: dict[str, OpEntry] = Field(default_factory=dict)
    patterns: dict[str, PatternEntry] = Field(
        default_factory=dict, description="name -> a subgraph the backend claims whole")
    decompositions: list[str] = Field(
        default_factory=list, description="ops this backend runs through their "
        "decomposition (PyTorch's table, or arbiter's own where it has none: "
        "arbiter/decompose/): such a node is offered to this backend when it can run "
        "every op of the node's decomposition, and is decomposed only in the partitions "
        "this backend compiles; other backends get the node as it is")
    probe: Optional[ProbeInfo] = Field(None, description="set by `arbiter probe --write`; "
                                       "entries it verified say `verified: probed` "
                                       "(`built` after `--build-only`)")

    @field_validator("ops", "patterns", mode="before")
    @classmethod
    def _none_entries(cls, v: Any) -> Any:
        # `aten.relu.default:` with no value in YAML means "supported with the defaults".
        if isinstance(v, dict):
            return {k: ({} if e is None else e) for k, e in v.items()}
        return v

    def entry(self, name: str) -> Optional["ResolvedEntry"]:
        """The resolved entry for a canonical op name, or None if not supported."""
        return self._resolved(name)

    def pattern_entry(self, name: str) -> Optional["ResolvedEntry"]:
        """The resolved conditions of pattern ``name`` (``patterns:``), or None."""
        entry = self.patterns.get(name)
        return None if entry is None else self._with_defaults(entry)

    def verification(self) -> str:
        """How the entries are known, in a few words: "210 ops (probed 183 of which 40 in
        training graphs, declared 27)"."""
        if "*" in self.ops:
            return "all ops"
        counts: dict[str, int] = {}
        for e in self.ops.values():
            v = (e or OpEntry()).verified or self.defaults.verified
            counts[v] = counts.get(v, 0) + 1
        trained = sum(bool(e and e.training_dtypes) for e in self.ops.values())
        order = ("probed", "built", "declared")
        parts = [f"{k} {counts[k]}" + (f" of which {trained} in training graphs"
                                       if k == "probed" and trained else "")
                 for k in sorted(counts, key=lambda k: (
                     order.index(k) if k in order else len(order), k))]
        n, m = len(self.ops), len(self.patterns)
        text = f"{n} op{'s' * (n != 1)} ({', '.join(parts)})" if n else "no ops"
        if m:
            text += f", {m} pattern{'s' * (m != 1)}"
        return text

    def model_post_init(self, __context: Any) -> None:
        self._resolved = functools.lru_cache(maxsize=None)(self._resolve)

    def _resolve(self, name: str) -> Optional["ResolvedEntry"]:
        entry = self.ops.get(name) or self.ops.get(packet_name(name)) or self.ops.get("*")
        if entry is None:
            return None
        return self._with_defaults(entry)

    def _with_defaults(self, entry: Any) -> "ResolvedEntry":
        d = self.defaults
        # `dtypes: []` (every declared dtype failed the probe) allows none: only an
        # absent list means the defaults.
        return ResolvedEntry(
            dtypes=frozenset(DTYPES[n] for n in (d.dtypes if entry.dtypes is None
                                                 else entry.dtypes)),
            probed_dtypes=None if getattr(entry, "probed_dtypes", None) is None
            else frozenset(DTYPES[n] for n in entry.probed_dtypes),
            devices=frozenset(entry.devices or d.devices),
            dynamic=d.dynamic if entry.dynamic is None else entry.dynamic,
            max_rank=entry.max_rank,
            verified=entry.verified or d.verified,
            built_dtypes=None if getattr(entry, "built_dtypes", None) is None
            else frozenset(DTYPES[n] for n in entry.built_dtypes),
            wrong_outputs=tuple((k, frozenset(DTYPES[d] for d in per if d in DTYPES),
                                 "; ".join(f"{d}: {why}" for d, why in per.items()))
                                for k, per in sorted((getattr(entry, "wrong_outputs", None)
                                                      or {}).items())),
        )


class ResolvedEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    dtypes: frozenset
    devices: frozenset
    dynamic: bool
    max_rank: Optional[int]
    verified: str
    probed_dtypes: Optional[frozenset] = None  # None: the probe did not record them
    built_dtypes: Optional[frozenset] = None   # what `probe --build-only` built
    wrong_outputs: tuple = ()  # ((output index, dtypes, why), ...): see OpEntry


def _validate(located: Located, backend: Optional[str]) -> Manifest:
    try:
        manifest = Manifest.model_validate(located.data)
    except ValidationError as exc:
        raise validation_error(located, exc, Manifest, ManifestError) from None
    if backend is not None and manifest.backend != backend:
        raise located.error(("backend",), f"manifest is for backend {manifest.backend!r}, "
                            f"expected {backend!r}", ManifestError)
    unknown: list[str] = []
    for name, entry in manifest.ops.items():
        allowed = manifest.defaults.dtypes if entry.dtypes is None else entry.dtypes
        for key in ("probed_dtypes", "built_dtypes"):
            extra = [d for d in getattr(entry, key) or () if d not in allowed]
            if extra:
                raise located.error(("ops", name, key), f"{', '.join(extra)} passed the "
                                    f"probe but the entry does not allow it (dtypes: "
                                    f"{', '.join(allowed) or 'none'})", ManifestError)
        extra = [d for d in entry.training_dtypes or () if d not in (entry.probed_dtypes or ())]
        if extra:
            raise located.error(("ops", name, "training_dtypes"), f"{', '.join(extra)} passed "
                                f"in a training graph but not in `probed_dtypes` "
                                f"({', '.join(entry.probed_dtypes or ()) or 'none'})",
                                ManifestError)
        if name == "*":
            continue
        try:
            resolve(name)
        except UnknownOpError as exc:
            if not other_torch(manifest):
                raise located.error(("ops", name), str(exc), ManifestError) from None
            unknown.append(name)
    for name, pat in manifest.patterns.items():
        if pat.function is not None and pat.inputs is None:
            raise located.error(("patterns", name, "inputs"), "a pattern given by "
                                "`function` needs `inputs`: the shape of each argument it "
                                "is traced with", ManifestError)
    gone: list[str] = []
    for i, name in enumerate(manifest.decompositions):
        try:
            resolve(name)
        except UnknownOpError as exc:
            if not other_torch(manifest):
                raise located.error(("decompositions", i), str(exc), ManifestError) from None
            gone.append(name)
    if gone:
        manifest.decompositions = [n for n in manifest.decompositions if n not in gone]
        unknown += gone
    if unknown:
        # written with another torch: its ops are that torch's, and an op this one lacks
        # cannot be in a graph here (a typo in a manifest of this torch stays an error)
        log.warning("%s: %d op(s) unknown to torch %s left out (the manifest was probed "
                    "with torch %s): %s", located.file, len(unknown), torch.__version__,
                    manifest.probe.torch, ", ".join(unknown))
        for name in unknown:
            manifest.ops.pop(name, None)
    return manifest


def release(version: str) -> str:
    """A version without its local build label (``2.13.0+cpu`` -> ``2.13.0``)."""
    return str(version).split("+", 1)[0]


def other_torch(manifest: Manifest) -> Optional[str]:
    """Why the manifest's probe results come from another torch than this one, or None:
    the release (``2.13.0``) differs; the build (``+cpu``, ``+cu130``) does not count."""
    probe = manifest.probe
    if probe is None or release(probe.torch) == release(torch.__version__):
        return None
    return f"probed with torch {probe.torch}, this is {torch.__version__}"


def _as_manifest_error(exc: ConfigError) -> ManifestError:
    return ManifestError(exc.reason, file=exc.file, key=exc.key, line=exc.line)


def load_manifest(path: str | Path, backend: Optional[str] = None) -> Manifest:
    """Load and check a manifest file; errors name the file, key and line."""
    try:
        located = load_file(path)
    except ManifestError:
        raise
    except ConfigError as exc:
        raise _as_manifest_error(exc) from None
    return _validate(located, backend)


def parse_manifest(text: str, file: str = "<manifest>", backend: Optional[str] = None) -> Manifest:
    try:
        located = load_text(text, file)
    except ManifestError:
        raise
    except ConfigError as exc:
        raise _as_manifest_error(exc) from None
    return _validate(located, backend)

