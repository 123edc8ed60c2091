"""The config's option blocks, each a pydantic model that ``Config`` holds under its key.

The blocks: ``measure:``, ``calibration:``, ``cache:``, ``verify:``, ``accuracy:``,
``shapes:``, ``resources:``. Kept apart from ``Config`` and its loading (the package's
``__init__``) so that each file holds one idea; ``arbiter.config`` re-exports them.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictFloat, StrictInt, field_validator,
                      model_validator)

from ..errors import require_known
from ..manifest import DTYPES
from ..registry import backend_names

class MeasureOptions(BaseModel):
    """How policy `measure` times candidates (docs/policies.md)."""

    model_config = ConfigDict(extra="forbid")

    time_budget_s: StrictFloat = Field(120.0, gt=0, description="no new candidate is started "
                                 "after this long per graph (compiles included); what is "
                                 "left unmeasured is ranked by `cost`")
    repeats: StrictInt = Field(5, ge=1, description="interleaved timing rounds (each times "
                               "every candidate once, the order rotating); the median counts. "
                               "Two rounds end it where the fastest candidate's slowest "
                               "sample is 15% below every other's fastest")
    max_repeats: StrictInt = Field(15, ge=1, description="more rounds, up to this many, while "
                                   "the fastest candidate's quartiles overlap another's "
                                   "(within `time_budget_s`)")
    warmup: StrictInt = Field(2, ge=0, description="untimed runs before timing (at least two "
                        "always run: the first compiles, the last sizes the samples)")
    refine: bool = Field(True, description="after the whole-graph candidates, move one "
                         "partition of the best at a time to another able backend, keeping "
                         "moves that beat it by more than 3% (Collage-style), within the budget")
    refine_patience: StrictInt = Field(
        5, ge=0, description="stop refining after this many moves in a row that did not "
        "win (each move compiles its new partitions: on BERT-style models the whole 120 s "
        "budget went to moves that never won); 0: only the budget stops it")
    mix: bool = Field(True, description="after the whole-graph candidates, cut the graph at "
                      "module boundaries (nn_module_stack), time each kind of segment (and "
                      "of adjacent pair) on each backend that ran the graph alone, choose a "
                      "backend per segment by dynamic programming over the chain, and time "
                      "that mixed placement end to end against the best (docs/policies.md)")
    mix_max_segments: StrictInt = Field(
        48, ge=2, description="mixing cuts at the deepest module depth giving at most this "
        "many segments (BERT-base: its layers' attention, intermediate and output blocks)")
    progress: bool = Field(True, description="show a progress line on stderr when "
                           "measuring takes more than 2 s (it is logged at INFO anyway)")


class CalibrationOptions(BaseModel):
    """Where policy `calibrated` gets this machine's calibration (docs/policies.md)."""

    model_config = ConfigDict(extra="forbid")

    file: Optional[str] = Field(None, description="a calibration written by `arbiter calibrate "
                                "--out FILE`, used as it is; default $ARBITER_CALIBRATION, "
                                "else the cache's, measured when first needed")
    time_budget_s: StrictFloat = Field(60.0, gt=0, description="measuring one when first "
                                       "needed starts no compile after this long; the rest is "
                                       "measured when next needed (`arbiter calibrate`: no bound)")
    progress: bool = Field(True, description="a progress line on stderr past 2 s")


class CacheOptions(BaseModel):
    """The persistent cache of decisions and compiled artifacts (docs/cache.md)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="read and write the cache")
    dir: Optional[str] = Field(None, description="cache directory; default "
                               "$ARBITER_CACHE_DIR or ~/.cache/torch-arbiter. It must be "
                               "yours (or root's) and writable by no one else, or the "
                               "cache is off with a warning (entries are run as code); "
                               "one you cannot write (baked into an image) is used "
                               "read-only")
    max_size_gb: StrictFloat = Field(10.0, gt=0, description="bound on the entries' total "
                                     "size: the least recently used are evicted after a "
                                     "write (`arbiter cache` lists and clears them)")


class Tolerance(BaseModel):
    """Outputs match when |got - eager| <= atol + rtol * |eager| elementwise."""

    model_config = ConfigDict(extra="forbid")

    rtol: StrictFloat = Field(ge=0, description="relative tolerance")
    atol: StrictFloat = Field(ge=0, description="absolute tolerance")


class VerifyOptions(BaseModel):
    """Accuracy checks of compiled partitions against eager ATen (docs/robustness.md)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["off", "unverified", "first", "every"] = Field(
        "unverified", description="`unverified` (the default): check the first call on a "
        "backend of each partition that holds an (op, dtype) no probe verified for the way "
        "the graph uses it (arbiter/plan/evidence.py), or several compute nodes (compiled "
        "together: no probe ran that; arbiter/run/checks/first_use.py); a failure demotes the "
        "partition and "
        "is kept (the op is refused on that backend from then on, in later processes too: "
        "arbiter/plan/findings.py); `first`: check every partition's first call; `every`: every "
        "`every_n` calls; `off`: trust the manifests' declarations, unchecked")
    every_n: StrictInt = Field(100, ge=1, description="with mode `every`: check one call in N "
                         "(the first call of each compiled backend included)")
    tolerances: dict[str, Tolerance] = Field(
        default_factory=dict, description="dtype name -> {rtol, atol}, overriding the "
        "defaults of arbiter.run.checks.verify.DEFAULT_TOLERANCES (float32: rtol 1e-4, "
        "atol 1e-5); integer and bool outputs must be equal")

    @field_validator("tolerances")
    @classmethod
    def _known_dtypes(cls, v: dict[str, "Tolerance"]) -> dict[str, "Tolerance"]:
        require_known("dtype", v, DTYPES)
        return v


class TopKAgreement(BaseModel):
    """Classifier outputs: the share of rows (the last dimension holding the classes)
    whose top-1 class lies among float32 eager's top ``k`` classes."""

    model_config = ConfigDict(extra="forbid")

    k: StrictInt = Field(1, ge=1, description="1: the top-1 classes must agree")
    agreement: StrictFloat = Field(gt=0, le=1, description="the least share of rows that "
                                   "must agree, over all calibration inputs (0.99: 99%)")


class AccuracyOptions(BaseModel):
    """A stated bound against float32 eager: lower-precision variants within it may run,
    for the whole graph or module by module (docs/precision.md). Every bound given must
    hold."""

    model_config = ConfigDict(extra="forbid")

    rtol: StrictFloat = Field(0.0, ge=0, description="relative tolerance: outputs pass "
                              "when |got - eager| <= atol + rtol * |eager| elementwise")
    atol: StrictFloat = Field(0.0, ge=0, description="absolute tolerance")
    max_rel_norm: Optional[StrictFloat] = Field(
        None, gt=0, description="the relative error norm ||got - eager|| / ||eager|| of "
        "every floating output (over the whole tensor) must not exceed this")
    topk: Optional[TopKAgreement] = Field(
        None, description="classifiers: {k, agreement}, the share of rows whose top-1 "
        "class is among eager's top k")
    every_n: StrictInt = Field(100, ge=1, description="a graph running a lower precision "
                               "is checked against float32 eager again one call in N "
                               "(drift watch); out of the bound, its lower-precision "
                               "partitions return to float32, with a warning and a "
                               "fallback (stage `verify`) in the report")
    per_module: bool = Field(True, description="search module-boundary segments for the "
                             "fastest mix of a variant and float32 within the bound, "
                             "when the whole graph at lower precision is not")
    search_budget_s: StrictFloat = Field(300.0, gt=0, description="the per-module search "
                                         "of one graph stops starting new steps after "
                                         "this long (compiles included)")
    holdout: StrictFloat = Field(0.25, ge=0, lt=1, description="the share of "
                                 "`arbiter.tune`'s batches kept from the search: the "
                                 "chosen placement's error is measured again on them "
                                 "and it is refused outside the bound")

    @property
    def elementwise(self) -> bool:
        """Whether an elementwise bound (rtol, atol) is stated."""
        return self.atol > 0 or self.rtol > 0

    def describe(self) -> str:
        """The bound in words: ``atol 0.01, max_rel_norm 0.01``."""
        parts = []
        if self.elementwise:
            parts.append(f"rtol {self.rtol:g}, atol {self.atol:g}")
        if self.max_rel_norm is not None:
            parts.append(f"max_rel_norm {self.max_rel_norm:g}")
        if self.topk is not None:
            parts.append(f"top-{self.topk.k} agreement {self.topk.agreement:g}")
        return ", ".join(parts)

    @model_validator(mode="after")
    def _some_tolerance(self) -> "AccuracyOptions":
        if not self.elementwise and self.max_rel_norm is None and self.topk is None:
            raise ValueError("accuracy needs a bound: rtol or atol above 0, max_rel_norm "
                             "or topk (without one no lower-precision variant can pass; "
                             "leave `accuracy` out for float32 as eager computes it)")
        return self


class ShapesOptions(BaseModel):
    """Symbolic (dynamic) shapes where a backend cannot take symbols (docs/design.md)."""

    model_config = ConfigDict(extra="forbid")

    max_specializations: StrictInt = Field(
        8, ge=0, description="a partition with symbolic shapes on a backend whose manifest "
        "does not mark its ops `dynamic` (or whose dynamic artifact failed its check at a "
        "second shape) is compiled per concrete input shape, at most this many times; "
        "the next shape goes to the next backend of its chain. 0: such nodes are refused "
        "(planned on a backend that takes symbols, else eager)")


class ResourcesOptions(BaseModel):
    """One thread budget and one memory arena for all backends (docs/resources.md)."""

    model_config = ConfigDict(extra="forbid")

    threads: Union[Literal["auto"], StrictInt] = Field(
        "auto", description="intra-op threads each backend may use while it runs "
        "(partitions run one at a time); `auto`: torch's own thread count as the process "
        "holds it, at most the CPUs this process may run on (under torch.distributed "
        "also at most the host's share, cores / LOCAL_WORLD_SIZE). torch's count is the "
        "user's and is never changed. "
        "More than that is reduced to it, with a warning (threads beyond the cores only "
        "compete; 100,000 once exhausted the host's process table)")
    spin: str = Field(
        "auto", description="the one backend whose idle threads may keep spinning after "
        "a run (lower latency for itself, stolen cores for the others); `none`: no "
        "backend's; `auto`: the backend holding most of each graph's plan (from that "
        "graph's compile on; the first of `backends:` before any), or none "
        "when the process's first compiled graph trains (grad on, an input requiring "
        "grad): eager work runs between the backends' calls in a training step and a "
        "spinning pool takes its cores (ResNet-18's step 131 ms against 74 ms, "
        "docs/resources.md). The budget is fixed at the process's first graph")
    shared_arena: bool = Field(True, description="backends that can share one memory "
                               "arena across their sessions do (ONNX Runtime)")
    coordinate: bool = Field(True, description="false: leave every backend's threads, "
                             "spinning and arenas at its own defaults (no budget)")

    @field_validator("threads", mode="wrap")
    @classmethod
    def _positive(cls, v: Any, handler) -> Union[str, int]:
        if v != "auto" and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"threads must be `auto` or an integer >= 1, not {v!r}")
        return handler(v)

    @field_validator("spin")
    @classmethod
    def _spin_owner(cls, v: str) -> str:
        require_known("spin owner", [v], ["auto", "none", *backend_names()])
        return v
