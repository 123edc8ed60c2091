"""The user's config: which backends, in what order, with what options.

A config is YAML (or a dict, or a ``Config``)::

    backends:                  # in priority order; a name or {name, options}
      - name: onnxruntime
        options: {graph_optimization_level: all}
      - inductor
    fallback: [eager]          # what runs what the backends refuse or fail; eager ends it
    policy: priority           # how a backend is chosen among those able to run a node
    min_block_size: 3          # smaller partitions go to the next able backend
    exclude_ops: [aten.gelu]   # never given to a backend other than eager
    pin: {aten._softmax: inductor}   # this op goes to this backend when it can run it
    decompositions: [aten.silu]      # decomposed before partitioning
    freeze_weights: true       # inference graphs: weights become constants of the pieces
    refreeze_limit: 3          # re-freezes when the model's weights change, then inputs
    shapes: {max_specializations: 8}    # symbolic shapes a backend cannot take: per shape
    accuracy: {atol: 1.0e-2}   # lower-precision variants within this of eager may run

Unknown keys are errors; every error names the file, the key path, the line, and what
would have been valid.
"""
from __future__ import annotations

import importlib.resources
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationError,
                      field_validator, model_validator)

from .errors import (ArbiterError, ConfigError, UnknownBackendError, UnknownOpError,
                     did_you_mean, require_known, unknown_name)
from .manifest import DTYPES, load_manifest
from .ops import resolve
from .plan.policy import policy_names
from .registry import aten_fallback, backend_names, get_backend_class
from .yamlsrc import Located, load_file, validation_error

DEFAULT_CONFIG = "default"


class BackendSpec(BaseModel):
    """One backend of the config, with its options (checked by the backend's Options)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="a registered backend (`arbiter backends` lists them)")
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="backend options; see the backend's docs")


class MeasureOptions(BaseModel):
    """How policy `measure` times candidates (docs/policies.md)."""

    model_config = ConfigDict(extra="forbid")

    time_budget_s: StrictFloat = Field(120.0, gt=0, description="no new candidate is started "
                                 "after this long per graph (compiles included); what is "
                                 "left unmeasured is ranked by `cost`")
    repeats: StrictInt = Field(5, ge=1, description="interleaved timing rounds (each times "
                               "every candidate once, the order rotating); the median counts")
    max_repeats: StrictInt = Field(15, ge=1, description="more rounds, up to this many, while "
                                   "the fastest candidate's quartiles overlap another's "
                                   "(within `time_budget_s`)")
    warmup: StrictInt = Field(2, ge=0, description="untimed runs before timing (at least one "
                        "always runs: it compiles)")
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
        "the graph uses it (arbiter/plan/evidence.py); a failure demotes the partition and "
        "is kept (the op is refused on that backend from then on, in later processes too: "
        "arbiter/findings.py); `first`: check every partition's first call; `every`: every "
        "`every_n` calls; `off`: trust the manifests' declarations, unchecked")
    every_n: StrictInt = Field(100, ge=1, description="with mode `every`: check one call in N "
                         "(the first call of each compiled backend included)")
    tolerances: dict[str, Tolerance] = Field(
        default_factory=dict, description="dtype name -> {rtol, atol}, overriding the "
        "defaults of arbiter.run.verify.DEFAULT_TOLERANCES (float32: rtol 1e-4, atol 1e-5); "
        "integer and bool outputs must be equal")

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
        "(partitions run one at a time); `auto`: the CPUs this process may run on (under "
        "torch.distributed at most torch's own thread count and the host's share, "
        "cores / LOCAL_WORLD_SIZE). "
        "More than that is reduced to it, with a warning (threads beyond the cores only "
        "compete; 100,000 once exhausted the host's process table)")
    spin: str = Field(
        "auto", description="the one backend whose idle threads may keep spinning after "
        "a run (lower latency for itself, stolen cores for the others); `none`: no "
        "backend's; `auto`: the first of `backends:` (it takes the most nodes), or none "
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


class Config(BaseModel):
    """A torch-arbiter config. Field docs are the reference; see docs/config.md."""

    model_config = ConfigDict(extra="forbid")

    backends: list[BackendSpec] = Field(
        description="backends in priority order; a string is shorthand for {name: ...}")
    fallback: list[str] = Field(
        default_factory=list,
        description="backends that run what the `backends` refuse or fail to compile, in "
                    "order; eager ATen always ends the chain and need not be listed")
    policy: str = Field(
        "priority", description="`priority`: the first backend in config order that can "
                                "run a node gets it; `calibrated` (the embedded default's): "
                                "the placement predicted fastest from this machine's "
                                "calibration, the top two timed on the first call when "
                                "close; `measure`: the fastest placement by "
                                "timing candidates; `cost`: by a static cost estimate; or a "
                                "policy registered with `@register_policy`")
    measure: MeasureOptions = Field(default_factory=MeasureOptions,
                                    description="how policy `measure` times candidates")
    calibration: CalibrationOptions = Field(
        default_factory=CalibrationOptions,
        description="this machine's calibration, which policy `calibrated` predicts with")
    against_eager: Literal["off", "training", "all"] = Field(
        "training", description="a policy that does not measure (`priority`, `cost`, "
        "`calibrated`) has its plan timed against eager ATen on the graph's first call (interleaved rounds, "
        "as `measure` times, with its `repeats`, `warmup` and `time_budget_s`); the graph "
        "runs in eager when eager is faster than the plan by more than 3%, and the report "
        "gives both times. `training`: forward and backward graphs (on this project's CPU "
        "measurements, backward graphs were slower on compiled backends than eager's "
        "kernels: docs/policies.md); `all`: inference graphs too; `off`: the plan runs "
        "untimed. Policy `measure` always has eager among its candidates")
    cache: CacheOptions = Field(default_factory=CacheOptions,
                                description="the persistent cache of decisions and artifacts")
    verify: VerifyOptions = Field(default_factory=VerifyOptions,
                                  description="accuracy checks against eager ATen")
    resources: ResourcesOptions = Field(default_factory=ResourcesOptions,
                                        description="one thread budget and arena per process")
    accuracy: Optional[AccuracyOptions] = Field(
        None, description="a tolerance against float32 eager, {rtol, atol}: candidates "
        "then include the lower-precision variants the backends offer (OpenVINO's bf16 "
        "hint), each verified on the first call's real inputs and kept only within it; "
        "the fastest accepted placement runs (docs/precision.md). None: every backend "
        "computes at the graph's own precision, checked as `verify` says")
    shapes: ShapesOptions = Field(default_factory=ShapesOptions,
                                  description="symbolic shapes: compiles per concrete shape")
    compile_timeout_s: Optional[StrictFloat] = Field(
        None, gt=0, description="give up waiting for a backend's compile of one partition "
        "after this long and fall back to the next backend of its chain (reported, stage "
        "`compile`). The compile then runs in a helper thread; Python cannot stop a thread, "
        "so a compile that hangs keeps its thread (and what it holds) until it ends, and its "
        "result is discarded (docs/robustness.md). None: wait as long as it takes")
    min_block_size: StrictInt = Field(
        3, ge=1, description="a partition with fewer compute nodes is handed to the next "
                             "backend able to run its nodes (eager is exempt)")
    exclude_ops: list[str] = Field(
        default_factory=list, description="ops (`aten.x` or `aten.x.overload`) that only "
                                          "eager may run")
    pin: dict[str, str] = Field(
        default_factory=dict, description="op -> backend: that backend gets the op whenever "
                                          "its manifest allows, whatever its priority and "
                                          "`min_block_size`; ops are named as lowered "
                                          "(`aten._softmax`, not `aten.softmax`)")
    decompositions: list[str] = Field(
        default_factory=list, description="ops decomposed (PyTorch's decomposition table) "
                                          "in the whole graph before partitioning, for "
                                          "every backend (a backend's manifest "
                                          "`decompositions:` applies only to the nodes it "
                                          "takes)")
    random: Literal["eager", "backend"] = Field(
        "eager", description="where ops that draw random numbers (dropout, rand, bernoulli) "
        "run. `eager` (the default): in place, in graph order, so a compiled model draws "
        "exactly what eager PyTorch draws from torch's generator (bit-equal training runs, "
        "reproducible with `torch.manual_seed`); a dropout's mask is drawn apart from its "
        "data, so the compute around it stays on one backend (static float32/float64 "
        "shapes; others cut the graph at the dropout). `backend`: like any op, on a "
        "backend that draws its own random numbers "
        "on every call (Inductor, as under `torch.compile`): the same distribution "
        "(keep rate, scaling), not the same numbers; `verify` skips partitions that draw")
    manifests: dict[str, str] = Field(
        default_factory=dict, description="backend -> a capability manifest file to use "
                                          "instead of the shipped one (`arbiter probe "
                                          "BACKEND --write --out FILE` writes one); a "
                                          "relative path is relative to this config file")
    freeze_weights: bool = Field(
        True, description="inference graphs hand parameters and buffers to backends as "
                          "constants (folded, prepacked); every call checks that the model "
                          "still holds those weights, and re-freezes when it does not "
                          "(another instance, load_state_dict, an optimizer step)")
    refreeze_limit: StrictInt = Field(
        3, ge=0, description="times one graph is re-frozen when its weights change; "
                             "after that it takes its weights as inputs (no constants)")
    source: Optional[str] = Field(None, exclude=True,
                                  description="where the config came from (set by the loader)")

    @field_validator("backends", mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"name": b} if isinstance(b, str) else b for b in v]
        return v

    @field_validator("backends")
    @classmethod
    def _non_empty(cls, v: list[BackendSpec]) -> list[BackendSpec]:
        if not v:
            raise ValueError("at least one backend is required")
        return v

    # -- derived views -----------------------------------------------------------
    def chain_names(self) -> list[str]:
        """Every backend a node may go to, in order: backends, fallback, eager."""
        names = [b.name for b in self.backends]
        names += [f for f in self.fallback if f not in names]
        last = aten_fallback().name
        if last not in names:
            names.append(last)
        return names

    def options_for(self, name: str) -> dict[str, Any]:
        for spec in self.backends:
            if spec.name == name:
                return spec.options
        return {}

    def decision_settings(self) -> dict[str, Any]:
        """The settings that key a cached decision (``DECISION_SETTINGS``), as JSON."""
        return self.model_dump(mode="json", include=set(DECISION_SETTINGS))


#: The settings of a ``Config`` that key a cached decision of policy `measure` (with the
#: graph, its inputs, its frozen weights and the backends' versions and manifests:
#: ``Planner.decision_parts``, docs/cache.md): a decision taken under other values of
#: these is taken again. Those left out change how a decision is made or checked, not
#: which placements exist or are allowed (`measure`'s budget and rounds; `mix`, which adds
#: a candidate, keys it in arbiter/measure/decision.py), or nothing about placement
#: (`cache`, `verify`, `resources`, `compile_timeout_s`, `refreeze_limit`). As
#: Torch-TensorRT keeps its list of engine-invariant settings beside its settings class.
DECISION_SETTINGS: frozenset[str] = frozenset({
    "backends", "fallback", "min_block_size", "exclude_ops", "pin", "decompositions",
    "freeze_weights", "manifests", "shapes", "accuracy", "policy", "random",
    "against_eager"})


def _check_semantics(config: Config, located: Located) -> Config:
    """What pydantic's types cannot say: names that must exist, options that must fit."""
    known = backend_names()
    seen: set[str] = set()
    for i, spec in enumerate(config.backends):
        if spec.name not in known:
            raise located.error(("backends", i, "name"),
                                str(UnknownBackendError(spec.name, known)))
        if spec.name in seen:
            raise located.error(("backends", i, "name"), f"backend {spec.name!r} is listed twice")
        seen.add(spec.name)
        cls = get_backend_class(spec.name)
        try:
            cls.Options.model_validate(spec.options)
        except ValidationError as exc:
            raise validation_error(located, exc, cls.Options,
                                   prefix=("backends", i, "options")) from None
    if config.policy not in policy_names():
        raise located.error(("policy",), unknown_name("policy", config.policy, policy_names()))
    for i, name in enumerate(config.fallback):
        if name not in known:
            raise located.error(("fallback", i), str(UnknownBackendError(name, known)))
    chain = config.chain_names()
    for key in ("exclude_ops", "decompositions"):
        for i, op in enumerate(getattr(config, key)):
            try:
                resolve(op)
            except UnknownOpError as exc:
                raise located.error((key, i), str(exc)) from None
            if key == "decompositions":
                why = _no_decomposition(op)
                if why:
                    raise located.error((key, i), why)
    for op, backend in config.pin.items():
        try:
            resolve(op)
        except UnknownOpError as exc:
            raise located.error(("pin", op), str(exc)) from None
        if backend not in chain:
            raise located.error(("pin", op), f"backend {backend!r} is not in this config"
                                f"{did_you_mean(backend, chain)}; configured: {', '.join(chain)}")
    base = Path(located.file).parent if located.file and not located.file.startswith("<") \
        and Path(located.file).exists() else Path.cwd()
    for name, path in config.manifests.items():
        if name not in chain:
            raise located.error(("manifests", name), f"backend {name!r} is not in this config"
                                f"{did_you_mean(name, chain)}; configured: {', '.join(chain)}")
        full = Path(path).expanduser()
        full = full if full.is_absolute() else base / full
        try:
            load_manifest(full, backend=name)
        except ArbiterError as exc:
            raise located.error(("manifests", name), f"cannot use {str(full)!r}: {exc}") from None
        config.manifests[name] = str(full)
    return config


def _no_decomposition(op: str) -> str:
    """Why ``op`` (resolved) cannot be decomposed, or "": PyTorch's decomposition table
    (``torch._decomp``, what arbiter.run.lower applies) must hold it or an overload."""
    import torch
    from torch._decomp import decomposition_table

    from .decompose import extra

    ns, base, *rest = op.split(".")
    packet = getattr(getattr(torch.ops, ns), base)
    target = getattr(packet, rest[0]) if rest else packet
    names = set()
    for o in [*decomposition_table, *extra()]:
        if not isinstance(o, torch._ops.OpOverload):
            continue
        if o == target or o.overloadpacket == target:
            return ""
        names.add(f"{o.namespace}.{o.overloadpacket.__name__}")
    return (f"{op} has no decomposition in PyTorch's table (torch._decomp), so listing it "
            f"changes nothing{did_you_mean(f'{ns}.{base}', sorted(names))}")


def shipped_configs() -> dict[str, Path]:
    """Configs shipped with arbiter (configs/*.yaml), by name."""
    root = importlib.resources.files("arbiter.configs")
    return {Path(p.name).stem: Path(str(p)) for p in root.iterdir()
            if p.name.endswith(".yaml")}


def _from_located(located: Located) -> Config:
    if not isinstance(located.data, dict):
        raise located.error((), "a config must be a mapping with at least `backends:`")
    try:
        config = Config.model_validate(located.data)
    except ValidationError as exc:
        raise validation_error(located, exc, Config) from None
    config.source = located.file
    return _check_semantics(config, located)


ConfigLike = Union[None, str, Path, dict, Config]


def config_from_dict(data: dict, source: str) -> Config:
    """A Config from a dict whose errors name ``source`` as where it came from
    (``torch.compile(options=...)``, say)."""
    return _from_located(Located(data, {}, source))


def load_config(src: ConfigLike = None) -> Config:
    """A Config from a path, the name of a shipped config, a dict, or a Config.

    ``None`` is the embedded default config (configs/default.yaml).
    """
    if isinstance(src, Config):
        return src
    if src is None:
        src = DEFAULT_CONFIG
    if isinstance(src, dict):
        return _from_located(Located(src, {}, "<dict>"))
    if isinstance(src, (str, Path)):
        path = Path(src)
        if not path.suffix and not path.exists():
            shipped = shipped_configs()
            if str(src) not in shipped:
                raise ConfigError(f"no config file or shipped config named {str(src)!r}"
                                  f"{did_you_mean(str(src), shipped)}; shipped: "
                                  f"{', '.join(sorted(shipped))}", file=str(src))
            path = shipped[str(src)]
        return _from_located(load_file(path))
    raise ArbiterError(f"a config is a path, a dict or an arbiter.Config, not {type(src).__name__}")
