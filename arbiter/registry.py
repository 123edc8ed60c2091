"""The backend registry: one dict, one decorator, lazy discovery.

Built-in backends live in ``arbiter.backends`` (the ``backends/`` folder), one module
each; third-party backends register through the ``arbiter.backends`` entry-point group.
Neither is imported until a backend is looked up, so ``import arbiter`` stays light and a
broken optional package cannot break it. For a backend that is unavailable,
``install_advice`` says whether its install command would install what is missing.

The base class, ``Backend``, and its helpers are arbiter/backend.py's, re-exported here:
``from arbiter.registry import Backend`` keeps working for third-party backends.

A third-party backend, in short (docs/writing-a-backend.md has a complete one with its
manifest, tested by running it)::

    # my_pkg/my_backend.py
    from arbiter import Backend, register_backend

    @register_backend
    class MyBackend(Backend):
        name = "mine"
        install_hint = "pip install my-runtime"

        def available(self):
            try:
                import my_runtime  # noqa: F401
            except ImportError as exc:
                return False, f"my_runtime is not installed ({exc})"
            return True, ""

        def compile(self, gm, example_inputs):
            return my_runtime.compile(gm, example_inputs)   # a callable(*tensors)

    # pyproject.toml
    [project.entry-points."arbiter.backends"]
    mine = "my_pkg.my_backend"

and ``my_pkg/capabilities/mine.yaml`` beside it, or a ``manifest_path`` of its own, which
must be a classmethod (arbiter reads the manifest from the class; anything else is refused
at registration).
"""
from __future__ import annotations

import importlib
import logging
import pkgutil
import threading
from typing import Optional

# the base class and its helpers, re-exported: third-party backends import them from here
from .backend import (Backend, NoOptions, Validator, bounded_threads,  # noqa: F401
                      thread_option, usable_cpus)
from .errors import ArbiterError, UnknownBackendError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "arbiter.backends"


def missing_packages(hint: str) -> Optional[list[str]]:
    """The distributions that the pip command ``hint`` (a backend's ``install_hint``,
    ``pip install 'torch-arbiter[triton]'``) would install and that are not installed
    here, extras expanded: [] when all are (the backend is unavailable for another
    reason: no GPU, say); None when that cannot be told (not a pip command, or no
    ``packaging`` to read requirements with)."""
    import shlex
    from importlib import metadata

    try:
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:
        return None
    try:
        words = shlex.split(hint.split(" (")[0])  # "(a remark)" ends the command
    except ValueError:
        return None
    if "install" not in words or "pip" not in " ".join(words[:words.index("install")]):
        return None
    todo = [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
    missing: list[str] = []
    seen: set[str] = set()
    while todo:
        try:
            req = Requirement(todo.pop())
        except InvalidRequirement:
            return None
        if req.name in seen:
            continue
        seen.add(req.name)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            missing.append(req.name)
            continue
        for extra in req.extras:  # what `pip install name[extra]` adds
            for text in dist.requires or []:
                sub = Requirement(text)
                if sub.marker is not None and sub.marker.evaluate({"extra": extra}):
                    todo.append(str(sub).split(";")[0])
    return missing


def install_advice(cls: type[Backend]) -> str:
    """`` (install: HINT)`` for a backend that is unavailable, when its install command
    would install something missing here; "" when what it names is installed (then the
    reason is not a missing package) or the backend has no hint."""
    if not cls.install_hint:
        return ""
    missing = missing_packages(cls.install_hint)
    return "" if missing == [] else f" (install: {cls.install_hint})"


_REGISTRY: dict[str, type[Backend]] = {}
_discovered = False
_lock = threading.RLock()


def register_backend(cls: Optional[type[Backend]] = None, *, name: Optional[str] = None):
    """Class decorator: ``@register_backend`` or ``@register_backend(name="x")``."""

    def wrap(c: type[Backend]) -> type[Backend]:
        if not (isinstance(c, type) and issubclass(c, Backend)):
            raise TypeError(f"@register_backend expects a Backend subclass, got {c!r}")
        if name is not None:
            c.name = name
        if not c.name:
            raise ArbiterError(f"backend class {c.__qualname__} has no `name`")
        _check_class_methods(c)
        with _lock:
            old = _REGISTRY.get(c.name)
            if old is not None and old is not c and old.__qualname__ != c.__qualname__:
                raise ArbiterError(f"backend {c.name!r} is registered twice: by "
                                   f"{old.__module__}.{old.__qualname__} and "
                                   f"{c.__module__}.{c.__qualname__}")
            _REGISTRY[c.name] = c
        return c

    return wrap(cls) if cls is not None else wrap


def _check_class_methods(c: type[Backend]) -> None:
    """Refuse, at registration, a backend whose ``manifest_path`` or ``manifest`` is not a
    classmethod: arbiter calls them on the class, before any instance exists (an attribute
    ``manifest_path = Path(...)`` failed later, inside Dynamo: "'PosixPath' object is not
    callable")."""
    for attr in ("manifest_path", "manifest"):
        owner = next(k for k in c.__mro__ if attr in k.__dict__)
        value = owner.__dict__[attr]
        if isinstance(value, (classmethod, staticmethod)):
            continue
        what = "a plain method" if callable(value) else f"an attribute ({value!r})"
        raise ArbiterError(
            f"backend class {owner.__module__}.{owner.__qualname__} ({c.name!r}): `{attr}` "
            f"is {what}, but arbiter calls it on the class; write\n"
            f"    @classmethod\n    def {attr}(cls):\n        return "
            + ("Path(__file__).parent / \"capabilities\" / \"" + c.name + ".yaml\""
               if attr == "manifest_path" else "load_manifest(cls.manifest_path())")
            + "\n(docs/writing-a-backend.md)")


def _discover() -> None:
    """Import the built-in backend modules and the entry-point group, once."""
    global _discovered
    with _lock:
        if _discovered:
            return
        _discovered = True
        # discovery by name, as for plugins: the built-in backends sit above this module
        builtin = importlib.import_module("arbiter.backends")
        for info in sorted(pkgutil.iter_modules(builtin.__path__), key=lambda i: i.name):
            if info.name.startswith("_"):
                continue
            # Built-in backend modules import only torch at module level; their heavy
            # packages are imported inside methods, so this cannot fail on a missing one.
            importlib.import_module(f"{builtin.__name__}.{info.name}")
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                loaded = ep.load()
            except Exception as exc:  # a broken plugin must not break arbiter
                log.warning("cannot load backend plugin %r (%s): %s", ep.name, ep.value, exc)
                continue
            if isinstance(loaded, type) and issubclass(loaded, Backend):
                register_backend(loaded)


def backend_names() -> list[str]:
    _discover()
    return sorted(_REGISTRY)


def get_backend_class(name: str) -> type[Backend]:
    _discover()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownBackendError(name, _REGISTRY) from None


def aten_fallback() -> type[Backend]:
    """The backend that runs ATen in place: the end of every fallback chain."""
    _discover()
    for cls in _REGISTRY.values():
        if cls.inline_aten:
            return cls
    raise ArbiterError("no backend with inline_aten=True is registered")
