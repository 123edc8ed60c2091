"""Choosing OpInfo samples and tracing them to ATen graphs (``make_fx``), for the probe.

An OpInfo (``torch.testing._internal.common_methods_invocations.op_db``) gives samples:
an input, other arguments, keyword arguments. ``sample_fn`` makes one a function of its
tensors; ``trace_sample`` traces it (tensors become graph inputs), with fake or symbolic
sizes; ``graph_ops`` says which nodes of a traced graph a backend would get, or why the
graph cannot be probed. Training graphs (AOTAutograd's forward and backward) are traced
in arbiter/probe/training.py.
"""
from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Optional

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ..errors import ArbiterError
from ..ops import is_getitem, is_mutating, is_random, op_name


def opinfos(names: Optional[Sequence[str]] = None) -> list:
    """OpInfos of PyTorch's op_db, optionally only those matching ``names``: an OpInfo
    name (``nn.functional.gelu``: every variant), one variant (``max.binary``, as
    ``label`` writes it), or an ATen op ``aten.gelu[.overload]``. An OpInfo name or
    variant that matches none is an ``ArbiterError`` naming it (a probe that silently ran
    nothing for it would look like a pass)."""
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ImportError as exc:  # expecttest is what is usually missing
        raise ArbiterError(f"cannot import PyTorch's OpInfo database ({exc}); install the "
                           "test extra: pip install 'torch-arbiter[test]'") from None
    if not names:
        return list(op_db)

    def matches(o, n: str) -> bool:
        key = n.split(".")[1] if n.startswith("aten.") else n
        return (o.name in (n, key) or o.aten_name in (n, key) or label(o) == n
                or (o.name.startswith("nn.functional") and o.name.rsplit(".", 1)[-1] == n))

    # an ATen op no OpInfo is named for may still be reached (the dynamic probe's
    # hand-made samples), and so may the quantize/dequantize ops (quant_samples.py): only
    # OpInfo names must match
    unmatched = [n for n in names if not n.startswith(("aten.", "quantized_decomposed"))
                 and not any(matches(o, n) for o in op_db)]
    if unmatched:
        import difflib

        known = sorted({label(o) for o in op_db} | {o.name for o in op_db})
        hints = {n: difflib.get_close_matches(n, known, 3) for n in unmatched}
        raise ArbiterError("no OpInfo matches " + "; ".join(
            f"{n!r}" + (f" (close: {', '.join(h)})" if h else "") for n, h in hints.items())
            + ": give an OpInfo name (nn.functional.gelu), a variant (max.binary) or an "
            "ATen op (aten.gelu)")
    return [o for o in op_db if any(matches(o, n) for n in names)]


def label(info) -> str:
    """An OpInfo's name with its variant: ``nn.functional.batch_norm.without_cudnn``."""
    return info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")


def nondeterministic(info) -> bool:
    """OpInfos whose outputs no comparison can judge (uninitialized memory, randomness),
    by PyTorch's own flags on them."""
    return bool(getattr(info, "has_nondeterministic_output", False)
                or getattr(info, "skip_correctness_check_compile_vs_eager", False))


def pick_sample(opinfo, dtype: torch.dtype):
    """The first sample whose input has more than one element, else the first sample."""
    torch.manual_seed(0)
    first = None
    for k, s in enumerate(opinfo.sample_inputs("cpu", dtype, requires_grad=False)):
        if first is None:
            first = s
        if isinstance(s.input, torch.Tensor) and s.input.numel() > 1:
            return s
        if k >= 8:
            break
    return first


def samples(opinfo, dtype: torch.dtype, limit: int):
    """The OpInfo's first ``limit`` samples, less those of one element or fewer."""
    torch.manual_seed(0)
    for k, s in enumerate(opinfo.sample_inputs("cpu", dtype, requires_grad=False)):
        if k >= limit:
            return
        first = s.input[0] if isinstance(s.input, (list, tuple)) and s.input else s.input
        if isinstance(first, torch.Tensor) and first.numel() > 1:
            yield s


def sample_fn(opinfo, sample):
    """(fn, real input tensors) for one OpInfo sample: ``fn(*tensors)`` calls the op with
    the sample's other arguments and returns its tensor outputs as a tuple."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    idx = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    tensors = [leaves[i].detach().clone() for i in idx]

    def fn(*ts):
        vals = list(leaves)
        for i, t in zip(idx, ts):
            vals[i] = t
        inp, args, kwargs = pytree.tree_unflatten(vals, spec)
        out = opinfo.op(inp, *args, **kwargs)
        return tuple(o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor))

    return fn, tensors


def trace_sample(opinfo, sample, decompositions: Optional[dict] = None,
                 symbolic: bool = False, static_last: bool = False, duck: bool = True):
    """(ATen graph returning a tuple, real input tensors) for one OpInfo sample;
    ``symbolic``: sizes traced as symbols (``symbolic_inputs``; 0 and 1 stay static)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    call, tensors = sample_fn(opinfo, sample)

    def fn(*ts):
        flat = call(*ts)
        if not flat:
            raise TypeError("the op returned no tensor")
        return flat

    if not symbolic:
        return make_fx(fn, tracing_mode="fake",
                       decomposition_table=decompositions or {})(*tensors), tensors
    return make_fx(fn, tracing_mode="symbolic", decomposition_table=decompositions or {})(
        *symbolic_inputs(tensors, static_last, duck)), tensors


def symbolic_inputs(tensors: Sequence[torch.Tensor], static_last: bool = False,
                    duck: bool = True) -> list:
    """Fake copies of ``tensors`` with a symbol for every size of 2 or more; equal sizes
    share one ("duck" sizing, as Dynamo does: a sample's equal sizes are often meant
    equal, such as the key and value lengths of attention, which no meta kernel checks);
    ``static_last``: the innermost size of each stays static (a feature or head size,
    fixed by weights in a model); ``duck=False``: a symbol per size."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (DimDynamic, ShapeEnv,
                                                       StatelessSymbolicContext)

    mode = FakeTensorMode(shape_env=ShapeEnv())
    out = []
    for t in tensors:
        dims = [(DimDynamic.DUCK if duck else DimDynamic.DYNAMIC)
                if n > 1 and not (static_last and d == t.dim() - 1)
                else DimDynamic.STATIC for d, n in enumerate(t.shape)]
        out.append(mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(
            dynamic_sizes=dims)))
    return out


def graph_ops(gm: torch.fx.GraphModule, allow_sizes: bool = False
              ) -> tuple[list[torch.fx.Node], Optional[str]]:
    """The ATen compute nodes of a sample's graph, or why it cannot be probed.
    ``allow_sizes``: size computations (``sym_size``, ``operator.mul`` of sizes) are left
    out rather than refused (a symbolic trace has them; arbiter runs them in place)."""
    nodes = []
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output", "get_attr") or is_getitem(n):
            continue
        if allow_sizes and isinstance(n.meta.get("val"), (torch.SymInt, torch.SymBool,
                                                          torch.SymFloat, int, bool)):
            continue
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            return [], f"non-ATen node {n.format_node()[:80]}"
        if is_mutating(n):
            return [], f"{op_name(n.target)} mutates its input (never handed to a backend)"
        if is_random(n):
            return [], f"{op_name(n.target)} is random (never handed to a backend)"
        nodes.append(n)
    if not nodes:
        return [], "the graph has no ATen op"
    return nodes, None


@contextlib.contextmanager
def quiet_warnings():
    """Warnings off while a sample is traced, compiled or run (exporters warn a lot)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
