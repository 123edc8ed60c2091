"""The base class of every backend, ``Backend``, and what a backend's options are built from.

A backend is a class with a name, an ``Options`` model, a manifest, and ``compile``;
``Backend`` holds the defaults of everything else arbiter asks of one (availability, a
build-only mode, saved artifacts, precision variants, shared resources, the persistent
cache). ``NoOptions`` is the options model of a backend that takes none; ``Validator`` the
type of its per-op checks (``Backend.validators``); ``thread_option`` the validator of a
thread-count option, bounded (``bounded_threads``) by the CPUs this process may run on
(``usable_cpus``).

Backends register with ``arbiter.registry`` (``register_backend``), which re-exports these
names, so ``from arbiter.registry import Backend`` works as ``from arbiter.backend import
Backend`` does. docs/writing-a-backend.md has a complete backend.
"""
from __future__ import annotations

import importlib.resources
import inspect
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Optional

import torch
from pydantic import BaseModel, ConfigDict, field_validator

from .cache import fingerprint
from .manifest import Manifest, load_manifest

log = logging.getLogger(__name__)


class NoOptions(BaseModel):
    """A backend that takes no options."""

    model_config = ConfigDict(extra="forbid")


#: A validator says why a backend refuses a node the manifest admits, or None.
Validator = Callable[[torch.fx.Node], Optional[str]]


class Backend:
    """Base class of every backend.

    Subclasses set ``name`` and implement ``compile``; most also override
    ``available`` (optional packages) and ``Options`` (a pydantic model of the options
    a config may set under ``backends: [{name: ..., options: {...}}]``).
    """

    name: ClassVar[str] = ""
    #: pydantic model of the backend's config options; unknown keys are rejected.
    Options: ClassVar[type[BaseModel]] = NoOptions
    #: the command that installs what the backend needs, shown when it is unavailable.
    install_hint: ClassVar[str] = ""
    #: True for the backend whose partitions are ATen nodes run in place (eager).
    inline_aten: ClassVar[bool] = False
    #: the color reports draw this backend in (CSS, "#rrggbb"), the same in every file;
    #: "" lets the report pick one from the name
    color: ClassVar[str] = ""
    #: per-op checks for what the manifest cannot say: {"aten.x.default": fn(node)->reason}
    validators: ClassVar[dict[str, Validator]] = {}
    #: dtypes the backend computes in a narrower type whatever the op (OpenVINO's CPU
    #: plugin holds int64 in 32 bits): {dtype: why}; a node reading or writing one as a
    #: value is refused (positions, as ``ops.value_dtypes`` tells them, are not values),
    #: except the ops of ``narrow_dtype_ops``
    narrow_dtypes: ClassVar[dict[torch.dtype, str]] = {}
    narrow_dtype_ops: ClassVar[frozenset] = frozenset()
    #: True for a backend whose compiled code draws fresh random numbers on every call
    #: (Inductor's seeds come from torch's generator per call): under the config's
    #: ``random: backend`` it may take random ops (dropout); others never get them
    draws_random: ClassVar[bool] = False

    def __init__(self, options: Optional[BaseModel] = None):
        self.options = options if options is not None else self.Options()

    # -- what the backend is ---------------------------------------------------------
    def available(self) -> tuple[bool, str]:
        """(True, "") when the backend can run here; else (False, why, with the fix)."""
        return True, ""

    def plannable(self) -> tuple[bool, str]:
        """(True, "") when a dry run (``explain``, ``report --dry-run``) may plan onto this
        backend and ``arbiter probe --build-only`` may build with it although
        ``available()`` says it cannot run here (TensorRT without CUDA builds engines);
        by default, what ``available()`` says."""
        return self.available()

    def build_only(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str:
        """Convert and build ``gm`` as ``compile`` would, without running it (no device
        needed): a line saying what was built. Raise where ``compile`` would refuse.
        ``arbiter probe --build-only`` uses it; backends without such a mode raise."""
        raise NotImplementedError(f"backend {self.name!r} has no build-only mode")

    def check_pattern(self, name: str, match: Any) -> Optional[str]:
        """Why this backend refuses one match of a pattern its manifest claims
        (``patterns:``), or None: what the manifest's dtypes/devices/ranks cannot say
        (a kernel's size limits, a mode). ``match`` is an ``arbiter.plan.patterns.Match``."""
        return None

    def nonfinite_guard(self, gm: torch.fx.GraphModule) -> list[str]:
        """The ops of ``gm`` this backend computes unlike eager when an input holds NaN
        or inf, and takes anyway on the condition that the partition's inputs are
        checked on every call (a call with a non-finite input then runs in eager ATen);
        [] when nothing needs the check. Backends with an ``exact_nonfinite`` option
        answer while it is ``guard``."""
        return []

    def version(self) -> str:
        return torch.__version__

    @classmethod
    def manifest_path(cls) -> Path:
        """``capabilities/<name>.yaml``: shipped with arbiter, or beside the module."""
        shipped = importlib.resources.files("arbiter.capabilities") / f"{cls.name}.yaml"
        if shipped.is_file():
            return Path(str(shipped))
        return Path(inspect.getfile(cls)).parent / "capabilities" / f"{cls.name}.yaml"

    @classmethod
    def manifest(cls) -> Manifest:
        cached = cls.__dict__.get("_manifest_cache")
        if cached is None:
            cached = load_manifest(cls.manifest_path(), backend=cls.name)
            cls._manifest_cache = cached
        return cached

    def use_manifest(self, path: str | Path) -> None:
        """Read this instance's capabilities from ``path`` instead of the shipped manifest
        (a config's ``manifests:``); the class and other instances keep theirs."""
        loaded = load_manifest(path, backend=self.name)
        self.manifest = lambda: loaded  # shadows the classmethod, for this instance only

    @classmethod
    def declared_ops(cls) -> Optional[dict]:
        """{OpOverload: entry dict} the backend's own software says it handles, for
        ``arbiter manifest``; None means every op (a wildcard manifest)."""
        raise NotImplementedError(f"backend {cls.name!r} declares no ops; write "
                                  f"{cls.manifest_path()} by hand")

    # -- what the backend does -------------------------------------------------------
    def compile(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        """Turn an ATen FX graph into a callable taking the same positional inputs.

        ``gm`` returns a tuple of tensors; the callable must return a tuple or list of
        tensors of the same shapes and dtypes. Raise on failure: the caller falls back
        to the next backend in the chain and records why.
        """
        raise NotImplementedError

    # -- saved programs (arbiter.export / arbiter.load; docs/deploy.md) -----------------------
    def save_artifact(self, compiled: Callable, gm: torch.fx.GraphModule
                      ) -> Optional[tuple[dict[str, Any], dict[str, bytes]]]:
        """What ``compiled`` (this backend's ``compile`` result for the partition ``gm``)
        is in the backend's own serialized form: ``(entry, files)``, ``entry`` a JSON-able
        dict ``load_artifact`` reads back (with ``"native_code": True`` when loading it
        runs code from the file: a shared library), ``files`` name -> bytes. None: this
        compiled form cannot be saved; the partition is then saved as ATen only and
        compiled again at load. Default: None.

        A backend may take a keyword argument ``shared`` here and in ``load_artifact``
        (arbiter/deploy/shared.py): ``shared.find(tensor)`` is the key of a program weight
        with exactly that tensor's bytes (or None), which the entry can name instead of
        saving the data; ``shared.get(key)`` gives it back at load."""
        return None

    def loadable(self) -> tuple[bool, str]:
        """(True, "") when this backend can load and run saved artifacts here (what
        ``arbiter.load`` asks); by default ``available()``. A backend whose compile needs
        more than its runtime (an exporter) says less here."""
        return self.available()

    def load_artifact(self, entry: dict[str, Any], files: dict[str, bytes],
                      gm: torch.fx.GraphModule) -> Callable:
        """The callable ``save_artifact`` saved, rebuilt from its ``entry`` and ``files``
        (hashes and sizes already checked) for the partition ``gm`` (ATen, with its traced
        metadata). Raise when it cannot be: the partition falls down its saved chain."""
        raise NotImplementedError(f"backend {self.name!r} cannot load saved artifacts")

    # -- lower-precision variants (docs/precision.md) --------------------------------------
    #: set on a variant instance (``variant``): the label of its precision ("bf16"); ""
    #: for a backend at the graph's own precision
    precision: str = ""
    #: set on a variant instance: the name of the backend it is a variant of
    base_name: str = ""

    def precision_variants(self) -> dict[str, dict[str, Any]]:
        """Lower-precision option sets this backend offers on this machine: label ->
        options overriding the config's (``{"bf16": {"precision": "bf16"}}``). A config
        with ``accuracy:`` makes each a candidate, kept only when its outputs are within
        that tolerance of eager (arbiter.measure.precision). Default: none."""
        return {}

    def variant(self, label: str, options: BaseModel) -> "Backend":
        """A copy of this backend with ``options`` (a lower-precision variant), named
        ``<name>:<label>``; its manifest, validators and class are this backend's."""
        other = type(self)(options)
        other.name = f"{self.name}:{label}"  # shadows the class's name for this instance
        other.precision = label
        other.base_name = self.name
        if "manifest" in self.__dict__:  # a config's `manifests:` entry
            other.manifest = self.__dict__["manifest"]
        other.artifact_cache = self.artifact_cache
        return other

    # -- shared resources (arbiter/run/resources.py) --------------------------------------
    #: the budget of the config this instance belongs to (``use_budget``); None before
    budget: Optional[Any] = None

    def use_budget(self, budget: Any) -> None:
        """The ``resources.Budget`` of this instance's config (threads as the process
        has them; its own ``spin``): for what a backend can set per compiled model,
        such as whether a session's threads spin. Called for every instance."""
        self.budget = budget

    def configure_resources(self, budget: Any) -> dict[str, Any]:
        """Apply the process's ``resources.Budget`` (threads, spin owner, shared arena).

        Called once per process per backend name, before this backend's first compile
        (``Arbiter`` does it). Set process-wide pools and arenas here; what can only be
        set per compiled model, keep on the backend and use in ``compile``. With
        ``budget.coordinate`` false, change nothing. Return the settings now in force,
        for the report (``{}``: nothing to say).
        """
        return {}

    # -- the persistent cache (arbiter/cache/) ----------------------------------------
    #: set by ``Arbiter`` when its config enables the cache: a ``cache.Cache``, or None.
    artifact_cache: Optional[Any] = None

    def cache_parts(self) -> dict:
        """What, besides the graph, its inputs and its constants, changes what
        ``compile`` builds: part of every artifact key. Override to add more (a device)."""
        return {"backend": self.name, "version": self.version(),
                "options": self.options.model_dump(mode="json")}

    def cached_artifact(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                        build: Callable[[], bytes], kind: str = "artifact") -> bytes:
        """Bytes a backend can rebuild its compiled form from (an ONNX model, say), from
        the cache when an entry for this graph, inputs, weights and ``cache_parts``
        exists, else from ``build()`` (then stored). The backend calls this inside
        ``compile`` around its slow step; without a cache it is ``build()``."""
        cache = self.artifact_cache
        if cache is None:
            return build()
        key = fingerprint(gm, example_inputs, self.cache_parts())
        blob = cache.get(kind, key)
        if blob is not None:
            log.info("%s: %s loaded from the cache (%d bytes)", self.name, kind, len(blob))
            return blob
        blob = build()
        cache.put(kind, key, blob)
        return blob


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def bounded_threads(requested: int, what: str) -> int:
    """``requested`` threads, at most ``usable_cpus()`` (with a warning naming ``what``):
    more only compete for the same cores, and a config asking for 100,000 once made
    threads until every process on the host got EAGAIN. For backends' thread options
    and the process's budget (arbiter/run/resources.py)."""
    limit = usable_cpus()
    if requested > limit:
        log.warning("%s: %d threads asked for, but this process may run on %d CPUs; "
                    "using %d", what, requested, limit, limit)
        return limit
    return requested


def thread_option(field: str, what: str) -> Any:
    """A backend's options validator (pydantic) for ``field``, a thread count or None (the
    backend's own default): bounded by ``bounded_threads``, which names ``what``."""
    def bounded(cls, v: Optional[int]) -> Optional[int]:
        return v if v is None else bounded_threads(v, what)

    return field_validator(field)(classmethod(bounded))
