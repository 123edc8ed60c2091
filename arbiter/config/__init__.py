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
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationError,
                      field_validator)

from ..errors import (ArbiterError, ConfigError, UnknownBackendError, UnknownOpError,
                      did_you_mean, unknown_name)
from ..manifest import load_manifest
from ..ops import resolve
from ..plan.policy import policy_names
from ..registry import aten_fallback, backend_names, get_backend_class
from ..yamlsrc import Located, load_file, validation_error
# the option blocks, re-exported: ``from arbiter.config import VerifyOptions`` keeps working
from .options import (AccuracyOptions, CacheOptions, CalibrationOptions,  # noqa: F401
                      MeasureOptions, ResourcesOptions, ShapesOptions, Tolerance,
                      TopKAgreement, VerifyOptions)

DEFAULT_CONFIG = "default"


class BackendSpec(BaseModel):
    """One backend of the config, with its options (checked by the backend's Options)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="a registered backend (`arbiter backends` lists them)")
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="backend options; see the backend's docs")


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

    from ..decompose import extra

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
    raise ConfigError(f"a config is a path, a dict or an arbiter.Config, not {type(src).__name__}")
