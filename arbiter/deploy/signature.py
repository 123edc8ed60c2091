"""What a saved program takes: its inputs' pytree, and per tensor its dtype, rank and sizes.

Sizes are fixed, or a symbol with the range torch.export proved for it. Checked once per
call; nothing else is guarded (no Dynamo).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from ..errors import ArbiterError


class InputError(ArbiterError, TypeError):
    """A call's inputs do not fit the exported signature."""


_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)}


@dataclass
class Signature:
    """``inputs``: per flat tensor input, (name, dtype name, sizes: int or symbol name);
    ``ranges``: symbol -> (min, max or None); ``in_spec``/``out_spec``: the pytrees, as
    ``torch.utils._pytree.treespec_dumps`` writes them (JSON)."""

    inputs: list[tuple[str, str, list]]
    ranges: dict[str, tuple[int, Optional[int]]]
    in_spec: str
    out_spec: str

    def __post_init__(self) -> None:
        from torch.utils._pytree import treespec_loads

        self._in = treespec_loads(self.in_spec)
        self._out = treespec_loads(self.out_spec)
        checks = []
        sites = []
        for k, (name, dtype, sizes) in enumerate(self.inputs):
            if dtype not in _DTYPES:
                raise ArbiterError(f"input {name}: dtype {dtype!r} is not one arbiter.load "
                                   f"knows ({', '.join(_DTYPES)})")
            fixed = tuple((d, s) for d, s in enumerate(sizes) if isinstance(s, int))
            for d, s in enumerate(sizes):
                if not isinstance(s, int):
                    if s not in self.ranges:
                        raise ArbiterError(f"input {name}: size {d} is the symbol {s!r}, "
                                           "which has no range in the saved signature")
                    sites.append((k, d, s))
            checks.append((_DTYPES[dtype], len(sizes), fixed))
        self._checks = checks
        self._sites = sites
        # called as f(*tensors): no pytree work per call
        self.plain = self._in.num_leaves == len(self.inputs) and \
            self._in == _plain_spec(len(self.inputs))
        self.single = self._out.num_leaves == 1 and self._out.is_leaf()

    # -- per call ----------------------------------------------------------------------
    def flatten(self, args: tuple, kwargs: dict) -> Sequence[Any]:
        if self.plain and not kwargs:
            return args
        from torch.utils._pytree import tree_flatten

        flat, spec = tree_flatten((args, kwargs))
        if spec != self._in:
            raise InputError(f"the program takes {_call_words(self._in)}; this call gave "
                             f"{_call_words(spec)}")
        return flat

    def check(self, flat: Sequence[Any]) -> None:
        """Raise InputError unless ``flat`` fits (see the module)."""
        if len(flat) != len(self._checks):
            raise InputError(f"{len(flat)} inputs; the program takes {len(self._checks)} "
                             f"({', '.join(n for n, _, _ in self.inputs)})")
        for t, (dtype, rank, fixed) in zip(flat, self._checks):
            if not isinstance(t, torch.Tensor) or t.dtype is not dtype or t.dim() != rank:
                self._explain(flat)
            shape = t.shape
            for d, s in fixed:
                if shape[d] != s:
                    self._explain(flat)
        if self._sites:
            seen: dict[str, int] = {}
            for k, d, sym in self._sites:
                n = flat[k].shape[d]
                lo, hi = self.ranges[sym]
                if n < lo or (hi is not None and n > hi) or seen.setdefault(sym, n) != n:
                    self._explain(flat)

    def unflatten_inputs(self, flat: Sequence[Any]) -> tuple[tuple, dict]:
        """(args, kwargs) of a call whose flat inputs are ``flat``."""
        from torch.utils._pytree import tree_unflatten

        args, kwargs = tree_unflatten(list(flat), self._in)
        return tuple(args), dict(kwargs)

    def unflatten(self, out: Sequence[Any]) -> Any:
        if self.single:
            return out[0]
        from torch.utils._pytree import tree_unflatten

        return tree_unflatten(list(out), self._out)

    def _explain(self, flat: Sequence[Any]) -> None:
        """Raise InputError naming the first input that does not fit, and why."""
        seen: dict[str, tuple[str, int]] = {}
        for t, (name, dtype, sizes) in zip(flat, self.inputs):
            want = f"{dtype} of shape {_dims(sizes)}"
            if not isinstance(t, torch.Tensor):
                raise InputError(f"input {name}: got a {type(t).__name__}, the program "
                                 f"takes a tensor ({want})")
            got = str(t.dtype).removeprefix("torch.")
            if got != dtype:
                raise InputError(f"input {name}: dtype {got}, the program takes {want}")
            if t.dim() != len(sizes):
                raise InputError(f"input {name}: {t.dim()} dimensions {list(t.shape)}, the "
                                 f"program takes {len(sizes)} ({want})")
            for d, (n, s) in enumerate(zip(t.shape, sizes)):
                if isinstance(s, int):
                    if n != s:
                        raise InputError(f"input {name}: size {n} at dimension {d}, the "
                                         f"program was exported for {s} ({want}; "
                                         "export with dynamic_shapes to vary it)")
                    continue
                lo, hi = self.ranges[s]
                if n < lo or (hi is not None and n > hi):
                    small = " (torch.export traces sizes 0 and 1 apart: export another " \
                        "program for them)" if n < 2 <= lo else ""
                    raise InputError(f"input {name}: size {n} at dimension {d} is outside "
                                     f"the exported range of {s}: [{lo}, "
                                     f"{'inf' if hi is None else hi}]{small}")
                if s in seen and seen[s][1] != n:
                    raise InputError(f"input {name}: size {n} at dimension {d} is {s}, "
                                     f"which is {seen[s][1]} in input {seen[s][0]}")
                seen.setdefault(s, (name, n))

    # -- saved form ----------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"inputs": [[n, d, list(s)] for n, d, s in self.inputs],
                "ranges": {k: list(v) for k, v in self.ranges.items()},
                "in_spec": self.in_spec, "out_spec": self.out_spec}

    @classmethod
    def from_json(cls, data: dict) -> "Signature":
        try:
            inputs = [(str(n), str(d), [s if isinstance(s, int) else str(s) for s in sizes])
                      for n, d, sizes in data["inputs"]]
            ranges = {str(k): (int(lo), None if hi is None else int(hi))
                      for k, (lo, hi) in data["ranges"].items()}
            return cls(inputs, ranges, str(data["in_spec"]), str(data["out_spec"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ArbiterError(f"the saved input signature is malformed ({exc})") from None


def _plain_spec(n: int):
    from torch.utils._pytree import tree_structure

    return tree_structure((tuple(range(n)), {}))


def _call_words(spec: Any) -> str:
    """A call's structure in words: "2 positional arguments and keyword scale"."""
    try:
        pos, kw = spec.children()
        n, keys = pos.num_children, list(kw.context or ())
    except (AttributeError, TypeError, ValueError):
        return "another structure"
    words = f"{n} positional argument{'' if n == 1 else 's'}"
    if keys:
        words += f" and keyword{'' if len(keys) == 1 else 's'} {', '.join(map(str, keys))}"
    return words


def _dims(sizes: list) -> str:
    return "(" + ", ".join(str(s) for s in sizes) + ")"


def from_program(ep: Any, names: list[str], values: list[Any]) -> Signature:
    """The signature of an ExportedProgram: ``names``/``values`` are its user inputs'
    placeholder names and traced values (FakeTensors)."""
    from torch.utils._pytree import treespec_dumps

    from ..shapes import expr, symbols

    # what the partitions were compiled for: the tracing's ranges (PyTorch's 0/1
    # specialization: a Dim(min=1) traces as sizes >= 2; OpenVINO bounds its inputs by
    # them), within what torch.export reports valid
    traced = symbols(values)
    ranges: dict[str, tuple[int, Optional[int]]] = {}
    for sym, vr in ep.range_constraints.items():
        lo = int(vr.lower) if vr.lower.is_finite else 0
        hi = int(vr.upper) if vr.upper.is_finite else None
        t = traced.get(str(sym))
        if t is not None:
            lo = max(lo, t.min)
            hi = t.max if hi is None else (hi if t.max is None else min(hi, t.max))
        ranges[str(sym)] = (lo, hi)
    inputs = []
    for name, v in zip(names, values):
        if not isinstance(v, torch.Tensor):
            raise ArbiterError(f"input {name}: arbiter.export takes tensor inputs only (got "
                               f"{type(v).__name__}); torch.export fixes other values as "
                               "constants of the program: leave them out of args")
        sizes: list = []
        for d, s in enumerate(v.shape):
            e = expr(s)
            if e.is_number:
                sizes.append(int(e))
            elif e.is_Symbol and str(e) in ranges:
                sizes.append(str(e))
            else:
                raise ArbiterError(f"input {name}: size {d} is {e}, a derived dimension; "
                                   "arbiter.export takes plain torch.export.Dim sizes")
        inputs.append((name, str(v.dtype).removeprefix("torch."), sizes))
    spec = ep.call_spec
    return Signature(inputs, ranges, treespec_dumps(spec.in_spec), treespec_dumps(spec.out_spec))
