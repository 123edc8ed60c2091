"""Which backends can run which node, and why the others cannot.

Support of a node by a backend = its manifest entry for the node's op, checked against
the node's metadata (dtype, device, rank, symbolic shapes of every tensor it reads and
writes, from the FakeTensors in ``node.meta["val"]``), then the backend's validator for
that op if it has one. Every refusal keeps its reason for the report. A symbolic node
goes to a backend whose entry says ``dynamic: true`` (one artifact for every size), else
is compiled per concrete shape (``NodeSupport.per_shape``) unless that is off; backends
taking symbols come first among its candidates (docs/design.md, "Dynamic shapes").
Results are cached per node signature (op + tensor descriptors), and ``support_all``
computes each output's descriptors once, which keeps the check linear on graphs of
100,000 nodes.
"""
from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

import torch
import torch.fx

from ..backend import Backend
from ..decompose import NotDecomposable, for_names
from ..ops import (DATA_MOVES, is_getitem, is_mutating, is_random, op_name, packet_name,
                  produces_tensor, random_depends_on_args, tensors_in, value_dtypes)
from ..shapes import REASON as SHAPES_REASON
from .findings import findings

#: How a node that is not an ATen op is handled. They run in place, with eager.
NOT_ATEN = "not an ATen operator (runs in place with the ATen fallback)"
SCALAR = "computes a Python/symbolic scalar, not a tensor (runs in place)"
MUTATES = "mutates its input in place (runs in place, in graph order)"
RANDOM = "draws random numbers (runs in place, so torch's RNG stream stays eager's)"
#: with the config's ``random: backend``, a backend that cannot draw its own
NO_RANDOM = ("draws random numbers, and this backend does not draw its own (random: "
             "backend gives them to backends that do)")
NO_OUTPUT = "returns nothing (a runtime assert on sizes: runs in place)"
_COMPUTE = "compute"  # what `CapabilityTable._kind` says of an ATen op judged per node
_PER_NODE = "per-node"  # random or not depending on the node's arguments (dropout_p)


class TensorDesc(NamedTuple):
    """What the manifests constrain about one tensor. (A NamedTuple: hashed and compared
    in C, as it is part of every cache key.)"""

    dtype: Optional[torch.dtype]
    device: str
    rank: int
    symbolic: bool


_new_tuple = tuple.__new__  # TensorDesc(...) without NamedTuple's Python-level __new__

#: A symbolic int a node reads (a size Dynamo traced as a symbol): not a tensor, so no
#: dtype or device, but it makes the node symbolic.
SYMBOLIC_SCALAR = TensorDesc(None, "", 0, True)
_SYM_SCALARS = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _desc(t: Any) -> Optional[TensorDesc]:
    if not isinstance(t, torch.Tensor):
        return None
    shape = t.shape
    symbolic = False
    for s in shape:
        if not isinstance(s, int):
            symbolic = True
            break
    return _new_tuple(TensorDesc, (t.dtype, t.device.type, len(shape), symbolic))


def value_descs(value: Any) -> tuple:
    """Descriptors of the tensors in one ``meta["val"]`` (a tensor, or nested lists of);
    ``SYMBOLIC_SCALAR`` for a symbolic int."""
    if isinstance(value, torch.Tensor):
        return (_desc(value),)
    if isinstance(value, _SYM_SCALARS):
        return (SYMBOLIC_SCALAR,)
    return tuple(map(_desc, tensors_in(value)))


def narrow_refusal(backend: Backend, node: torch.fx.Node, name: str) -> str:
    """Why ``backend`` refuses ``node`` for a value of a dtype it holds narrower
    (``Backend.narrow_dtypes``), or "". Positions into a tensor (``ops.value_dtypes``) stay
    far below any such range and are not judged."""
    if not backend.narrow_dtypes or name in backend.narrow_dtype_ops:
        return ""
    for dtype in value_dtypes(node):
        why = backend.narrow_dtypes.get(dtype)
        if why is not None:
            return f"dtype {str(dtype).removeprefix('torch.')}: {why}"
    return ""


def tensor_descs(node: torch.fx.Node, memo: Optional[dict] = None) -> tuple:
    """Descriptors of every tensor the node reads or writes, from FakeTensor metadata:
    each distinct input node's value, in argument order, then the node's own value.

    ``memo`` (node -> ``value_descs`` of its value) lets a caller checking many nodes
    compute each node's descriptors once.
    """
    if memo is None:
        memo = {}
    out: tuple = ()
    for inp in node.all_input_nodes:
        d = memo.get(inp)
        if d is None:
            d = memo[inp] = value_descs(inp.meta.get("val"))
        out += d
    d = memo.get(node)
    if d is None:
        d = memo[node] = value_descs(node.meta.get("val"))
    return out + d


def dtype_device_refused(d: TensorDesc, entry: Any, whose: str) -> Optional[str]:
    """Why ``entry`` (a manifest's or a pattern's, ``whose``) refuses a tensor of ``d``'s
    dtype or device, or None."""
    if d.dtype not in entry.dtypes:
        allowed = ", ".join(sorted(str(x).removeprefix("torch.") for x in entry.dtypes))
        return (f"dtype {str(d.dtype).removeprefix('torch.')} not supported "
                f"({whose} allows {allowed})")
    if d.device not in entry.devices:
        return f"device {d.device} not supported ({whose} allows {', '.join(sorted(entry.devices))})"
    return None


@dataclass
class NodeSupport:
    """The backends able to run a node, best first, and why each other one refused."""

    candidates: tuple[str, ...]
    refusals: dict[str, str] = field(default_factory=dict)
    #: the backend a config `pin` gives this node (it is able, and first): the
    #: partitioner never moves it off for `min_block_size`
    pinned: str = ""
    #: candidates that take this symbolic node only compiled per concrete shape, and why
    per_shape: dict[str, str] = field(default_factory=dict)


class CapabilityTable:
    """Answers `which backends can run this node` for one config's backends."""

    def __init__(self, backends: Sequence[Backend], *, exclude_ops: Sequence[str] = (),
                 pin: Optional[dict[str, str]] = None, unavailable: Optional[dict[str, str]] = None,
                 max_specializations: int = 8, random: str = "eager"):
        # `backends` is the chain, in order; the last one runs ATen in place and takes all.
        self.backends = list(backends)
        # "eager": random ops run in place (eager's RNG stream); "backend": they go to
        # backends that draw their own (``Backend.draws_random``), like any op
        self.random = random
        self.max_specializations = max_specializations  # 0: no per-shape compiles
        self.fallback_name = self.backends[-1].name
        self.exclude = frozenset(exclude_ops)
        self.pin = dict(pin or {})
        self.unavailable = dict(unavailable or {})
        self._cache: dict[Any, NodeSupport] = {}
        self._kinds: dict[Any, Any] = {}  # target -> what `_kind` says
        self._validated: dict[str, bool] = {}  # op name -> has a validator somewhere
        self._generation = findings().generation  # the findings the answers above saw

    def _current(self) -> None:
        """Forget cached answers made before a finding was added (arbiter/plan/findings.py)."""
        gen = findings().generation
        if gen != self._generation:
            self._cache.clear()
            self._validated.clear()
            self._generation = gen

    def support(self, node: torch.fx.Node, memo: Optional[dict] = None) -> NodeSupport:
        """The backends able to run ``node``, best first. ``memo``: see ``tensor_descs``."""
        self._current()
        target = node.target
        kind = self._kinds.get(target)
        if kind is None:
            kind = self._kinds[target] = self._kind(node)
        if kind is _PER_NODE:
            kind = (("random", target), RANDOM) if is_random(node) else _COMPUTE
        random = self.random == "backend" and kind is not _COMPUTE and kind[1] is RANDOM
        if kind is _COMPUTE or random:
            if produces_tensor(node):
                descs = tensor_descs(node, memo)
                key = (target, descs, True) if random else (target, descs)
                hit = self._cache.get(key)
                if hit is None:
                    hit = self._evaluate(node, op_name(target), descs, random)
                    # Validators look at the node itself (argument values), so only cache
                    # the answer when no backend has a validator for this op.
                    if not self._has_validator(op_name(target)):
                        self._cache[key] = hit
                return hit
            kind = (("scalar", target), SCALAR)
        key, reason = kind
        hit = self._cache.get(key)
        if hit is None:
            hit = NodeSupport((self.fallback_name,),
                              {b.name: reason for b in self.backends[:-1]})
            self._cache[key] = hit
        return hit

    def support_all(self, nodes: Sequence[torch.fx.Node]) -> list[NodeSupport]:
        """``support`` of each node, sharing descriptor work between them.

        The common case (an ATen op producing one tensor, whose signature was seen
        before) is answered inline; everything else goes through ``support``.
        """
        self._current()
        memo: dict = {}
        out: list[NodeSupport] = []
        append = out.append
        support = self.support
        kinds = self._kinds
        cache = self._cache
        tensor = torch.Tensor
        for node in nodes:
            target = node.target
            if kinds.get(target) is _COMPUTE and isinstance(node.meta.get("val"), tensor):
                hit = cache.get((target, tensor_descs(node, memo)))
                if hit is not None:
                    append(hit)
                    continue
            append(support(node, memo))
        return out

    @staticmethod
    def _kind(node: torch.fx.Node) -> Any:
        """What the op of ``node`` is: ``_COMPUTE``, or (cache key, reason) for an op that
        runs in place with the fallback whatever its arguments."""
        target = node.target
        if not isinstance(target, torch._ops.OpOverload):
            return ("notaten", target), NOT_ATEN
        if not target._schema.returns:  # _assert_scalar, sym_constrain_range...
            return ("nooutput", target), NO_OUTPUT
        if is_mutating(node):
            return ("mutates", target), MUTATES
        if random_depends_on_args(node):
            return _PER_NODE
        if is_random(node):
            return ("random", target), RANDOM
        return _COMPUTE

    def _has_validator(self, name: str) -> bool:
        """Whether a node's answer depends on more than its signature (a validator, or
        a manifest entry with ``wrong_outputs``): then it is not cached."""
        hit = self._validated.get(name)
        if hit is None:
            # an entry with wrong outputs depends on the node's users, like a validator
            pk = packet_name(name)
            # so is one a backend decomposes (its decomposition depends on shapes and
            # argument values)
            # and one a first-use check found wrong (arbiter/plan/findings.py)
            hit = self._validated[name] = any(
                name in b.validators or pk in b.validators
                or bool(getattr(b.manifest().entry(name), "wrong_outputs", ()))
                or name in b.manifest().decompositions or pk in b.manifest().decompositions
                or bool(found_wrong(b, name))
                # and one moving data a narrow backend may take as positions, by its
                # readers (ops.read_as_positions)
                or (pk in DATA_MOVES and bool(b.narrow_dtypes))
                for b in self.backends)
        return hit

    def _evaluate(self, node: torch.fx.Node, name: str, descs: tuple,
                  random: bool = False) -> NodeSupport:
        """``random``: the node draws random numbers (``random: backend``): only backends
        that draw their own may take it."""
        candidates: list[str] = []
        per_shape: dict[str, str] = {}
        refusals: dict[str, str] = {}
        excluded = name in self.exclude or packet_name(name) in self.exclude
        symbolic = any(d.symbolic for d in descs)
        for backend in self.backends:
            if backend.name == self.fallback_name:
                continue
            if backend.name in self.unavailable:
                refusals[backend.name] = f"unavailable: {self.unavailable[backend.name]}"
                continue
            if excluded:
                refusals[backend.name] = "excluded by the config's exclude_ops"
                continue
            if random and not backend.draws_random:
                refusals[backend.name] = NO_RANDOM
                continue
            why = self._refuse(backend, node, name, descs)
            # (a decomposed node has no entry of its own; its decomposition is traced
            # for static shapes only, so it is refused above when symbolic)
            if why is None and symbolic and not getattr(backend.manifest().entry(name),
                                                        "dynamic", False):
                why = (f"{SHAPES_REASON}: {name} is not probed dynamic in the {backend.name} "
                       f"manifest (`arbiter probe {backend.name} --dynamic`)")
                if self.max_specializations > 0:
                    per_shape[backend.name] = why + "; compiled per concrete shape"
                    continue
                why += "; per-shape compiles are off (shapes.max_specializations: 0)"
            if why is None:
                candidates.append(backend.name)
            else:
                refusals[backend.name] = why
        # with symbols: one artifact for every size beats a compile per size
        candidates += list(per_shape)
        candidates.append(self.fallback_name)
        pinned = self.pin.get(name) or self.pin.get(packet_name(name))
        if pinned in candidates:
            candidates.remove(pinned)
            candidates.insert(0, pinned)
        return NodeSupport(tuple(candidates), refusals,
                           pinned=pinned if pinned in candidates else "", per_shape=per_shape)

    @staticmethod
    def _refuse(backend: Backend, node: torch.fx.Node, name: str, descs: tuple,
                decompose: bool = True) -> Optional[str]:
        """Why ``backend`` cannot run the node at all (symbolic shapes aside), or None.
        ``decompose``: a node its manifest wants decomposed is judged by its
        decomposition's nodes (``_refuse_decomposed``)."""
        declined = ""
        if decompose and backend.manifest().decompositions:
            decomps = for_names(backend.manifest().decompositions)
            if decomps.applies(node):
                if not decomps.keeps(node):
                    return _refuse_decomposed(backend, decomps, node, name)
                # the decomposition declines these arguments, or the node is symbolic:
                # judged whole, as it is
                declined = (f" (it is decomposed for {backend.name}, but "
                            f"{decomps.kept_because(node)} here)")
        entry = backend.manifest().entry(name)
        if entry is None:
            return f"{name} is not in the {backend.name} manifest{declined}"
        why = narrow_refusal(backend, node, name)
        if why:
            return why
        for d in descs:
            if d.dtype is None:  # SYMBOLIC_SCALAR: judged by the caller
                continue
            why = dtype_device_refused(d, entry, "manifest")
            if why is not None:
                return why
            if entry.max_rank is not None and d.rank > entry.max_rank:
                return f"rank {d.rank} tensor exceeds max_rank {entry.max_rank}"
        if entry.wrong_outputs:
            used = used_outputs(node)
            dtypes = {d.dtype for d in descs}
            for k, bad, why in entry.wrong_outputs:
                if k in used and dtypes & bad:
                    return (f"output {k} is used and {backend.name} computes it wrongly "
                            f"(probe: {why})")
        for f in found_wrong(backend, name):
            if f.refuses((_dtype_name(d.dtype) for d in descs if d.dtype is not None),
                         _used_or_whole(node)):
                return f"{name}: {f.reason()}"
        check = backend.validators.get(name) or backend.validators.get(packet_name(name))
        if check is not None:
            return check(node)
        return None


#: backend -> its ``version()``, asked once: a backend's version reads package metadata
#: (about 0.4 ms), and planning asks for every node of every candidate (BERT-base: 2390
#: times, 0.6-0.9 s of a warm start)
_VERSIONS: "weakref.WeakKeyDictionary[Backend, Optional[str]]" = weakref.WeakKeyDictionary()


def found_wrong(backend: Backend, name: str) -> list:
    """What first-use checks found ``backend`` (this version) computing wrongly of op
    ``name`` (arbiter/plan/findings.py); [] for a backend without a version."""
    try:
        version = _VERSIONS[backend]
    except (KeyError, TypeError):
        try:
            version = str(backend.version())
        except Exception:  # noqa: BLE001 - a backend that cannot say is not matched
            version = None
        try:
            _VERSIONS[backend] = version
        except TypeError:  # not weakly referenceable: asked every time
            pass
    if version is None:
        return []
    return findings().for_op(backend.name, version, name)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _used_or_whole(node: torch.fx.Node) -> Optional[set[int]]:
    """The outputs of ``node`` its users read, or None when it has one output."""
    return used_outputs(node) if isinstance(node.meta.get("val"), (tuple, list)) else None


def _refuse_decomposed(backend: Backend, decomps, node: torch.fx.Node,
                       name: str) -> Optional[str]:
    """Why ``backend`` refuses ``node``, an op its manifest wants decomposed
    (arbiter/decompose/): the decomposition cannot be traced, or one of its nodes is
    refused (checked as it is: not decomposed again). None: it takes the node."""
    try:
        sub = decomps.trace(node)
    except NotDecomposable as exc:
        return f"{name} is decomposed for {backend.name}, but {exc}"
    out = next(m for m in reversed(sub.graph.nodes) if m.op == "output")
    if isinstance(out.args[0], (tuple, list)) and any(not is_getitem(u) for u in node.users):
        return f"{name} is decomposed for {backend.name}, but its tuple is read whole"
    memo: dict = {}
    for m in sub.graph.nodes:
        if m.op != "call_function" or is_getitem(m):
            continue
        kind = CapabilityTable._kind(m)
        if kind is _PER_NODE:
            kind = (None, RANDOM) if is_random(m) else _COMPUTE
        if kind is _COMPUTE and not produces_tensor(m):
            kind = (None, SCALAR)
        if kind is not _COMPUTE:
            return f"{name} is decomposed for {backend.name} into {op_name(m.target)}, which {kind[1]}"
        sub_name = op_name(m.target)
        why = CapabilityTable._refuse(backend, m, sub_name, tensor_descs(m, memo),
                                      decompose=False)
        if why is not None:
            return f"{name} is decomposed for {backend.name}; {sub_name} there: {why}"
    return None


def used_outputs(node: torch.fx.Node) -> set[int]:
    """Indices of a tuple-returning node's outputs that some node reads (through its
    getitems; tracers leave a getitem per output, read or not); a node whose value is
    read whole counts as using every output."""
    used: set[int] = set()
    for user in node.users:
        if is_getitem(user) and isinstance(user.args[1], int):
            if user.users:
                used.add(user.args[1])
        else:
            val = node.meta.get("val")
            return set(range(len(val))) if isinstance(val, (list, tuple)) else {0}
    return used

