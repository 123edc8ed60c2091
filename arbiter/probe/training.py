"""The training probe (``arbiter probe --grad``): each sample's AOTAutograd graphs.

A training step hands arbiter a forward and a backward per Dynamo graph, and their ops
differ from an inference trace's: ``_embedding_bag``, ``max_pool2d_with_indices``, the
tensors the forward returns for the backward, the ``*_backward`` ops.
``trace_training_sample`` captures both graphs from a real forward and backward of the
sample through ``aot_function`` (the partitioner arbiter's lowering uses, no
decompositions), with their real inputs and a fixed random cotangent;
``probe_training`` probes the forward with every output it returns compared, then the
backward. An OpInfo whose forward holds an op with several outputs gets more samples,
one per new argument value (``grad_samples``: embedding_bag's modes). docs/robustness.md
("`--grad`") says why, and what the results do to the manifest.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ..errors import describe
from .credit import probe_graph
from .judge import returned_nodes, returns_tuple
from .result import SampleResult
from .sampling import nondeterministic, sample_fn
from .settings import Case, Probe

#: Samples of one OpInfo looked at, and run at most, when its forward holds an op with
#: several outputs (one sample otherwise).
TRAINING_LOOKED = 64
TRAINING_RUNS = 8


@dataclass
class TrainingGraphs:
    """A sample's two graphs with their real inputs; the forward returns what the user
    sees, then from ``saved_from`` on what the backward reads (inputs left out)."""

    forward: torch.fx.GraphModule
    forward_inputs: list
    saved_from: int
    backward: torch.fx.GraphModule
    backward_inputs: list


def grad_samples(opinfo, dtype: torch.dtype, limit: int = TRAINING_LOOKED) -> list:
    """The OpInfo's samples (of its first ``limit``) with a differentiable tensor input of
    more than one element."""
    torch.manual_seed(0)
    return [s for s in itertools.islice(opinfo.sample_inputs("cpu", dtype, requires_grad=True),
                                        limit)
            if isinstance(s.input, torch.Tensor) and s.input.numel() > 1
            and s.input.requires_grad]


def arguments(sample) -> set[tuple[str, str]]:
    """(where, value) of a sample's switch-like arguments: bools, ints, strings, and
    whether each tensor argument is given or None (floats and tensors' values left out)."""
    out = set()
    for path, v in pytree.tree_flatten_with_path((sample.args, sample.kwargs))[0]:
        if isinstance(v, torch.Tensor):
            v = "a tensor"
        elif not (v is None or isinstance(v, (bool, int, str))):
            continue
        out.add((pytree.keystr(path), repr(v)))
    return out


def _computed(nodes: list) -> list:
    """``nodes`` less repeats, graph inputs and non-tensors: what a partition returns
    (values computed inside it)."""
    kept: list = []
    for n in nodes:
        if isinstance(n, torch.fx.Node) and n.op != "placeholder" and n not in kept \
                and isinstance(n.meta.get("val"), torch.Tensor):
            kept.append(n)
    return kept


def _returning(gm: torch.fx.GraphModule, nodes: list, what: str) -> None:
    if not nodes:
        raise TypeError(f"the {what} graph computes nothing")
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    out.args = (tuple(nodes),)
    gm.graph.eliminate_dead_code()
    gm.recompile()


def trace_training_sample(opinfo, sample) -> TrainingGraphs:
    """AOTAutograd's forward and backward graphs of one OpInfo sample as arbiter's
    lowering gets them, and their real inputs, captured from a real forward and a
    backward with a fixed random cotangent per differentiable output. Gradients that are
    None are left out of the backward's outputs. Raises TypeError when the sample makes
    no such pair of graphs of tensors."""
    from functorch.compile import aot_function

    leaves = [v for v in pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
              if isinstance(v, torch.Tensor)]
    if any(t.layout != torch.strided for t in leaves):
        raise TypeError("sparse or other non-strided input")
    wants = [t.requires_grad for t in leaves]
    call, tensors = sample_fn(opinfo, sample)
    captured: dict = {}

    def capture(kind: str):
        def compiler(gm, _inputs):
            captured[kind] = gm

            def run(args):
                captured[f"{kind} inputs"] = [
                    a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
                return gm(*args)

            run._boxed_call = True
            return run
        return compiler

    ins = [t.clone().requires_grad_(w) for t, w in zip(tensors, wants)]
    outs = aot_function(call, fw_compiler=capture("forward"),
                        bw_compiler=capture("backward"))(*ins)
    diff = [o for o in outs if o.requires_grad]
    grads_of = [t for t in ins if t.requires_grad]
    if not diff or not grads_of:
        raise TypeError("no differentiable output or input")
    gen = torch.Generator().manual_seed(1)
    cots = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in diff]
    torch.autograd.grad(diff, grads_of, cots, allow_unused=True)
    if "backward inputs" not in captured:
        raise TypeError("AOTAutograd made no backward graph")
    for kind in ("forward", "backward"):
        if not all(isinstance(a, torch.Tensor) for a in captured[f"{kind} inputs"]):
            raise TypeError(f"the {kind} graph takes a non-tensor input")
    fw, bw = captured["forward"], captured["backward"]
    # the backward's inputs: the forward's saved values, then the cotangents; the
    # forward returns the saved values last
    params = [n for n in bw.graph.nodes if n.op == "placeholder"]
    n_saved = sum(not n.name.startswith("tangents") for n in params)
    returned = returned_nodes(fw)
    user, saved = returned[:len(returned) - n_saved], returned[len(returned) - n_saved:]
    user = _computed(user)
    _returning(fw, _computed(user + saved), "forward")
    _returning(bw, _computed(returned_nodes(bw)), "backward")
    return TrainingGraphs(fw, captured["forward inputs"], len(user), bw,
                          captured["backward inputs"])


def probe_training(p: Probe, case: Case) -> list[SampleResult]:
    """The training graphs of the OpInfo's first sample, forward then backward; more
    samples when its forward holds an op with several outputs (module docstring)."""
    if nondeterministic(case.info):
        return [case.skipped("nondeterministic",
                             "outputs are uninitialized or random: nothing to compare")]
    try:
        candidates = grad_samples(case.info, case.dtype)
    except Exception as exc:  # noqa: BLE001 - OpInfo samples some dtypes cannot make
        return [case.skipped("trace", describe(exc))]
    out: list[SampleResult] = []
    seen: set = set()
    several = False
    runs = 0
    for sample in candidates:
        new = arguments(sample) - seen
        if out and not (several and new):
            continue
        seen |= new
        try:
            g = trace_training_sample(case.info, sample)
        except Exception as exc:  # noqa: BLE001 - OpInfo samples some ops cannot trace
            if not out:
                return [case.skipped("trace", describe(exc))]
            continue
        first = not out
        several = several or (first and any(returns_tuple(n) for n in g.forward.graph.nodes))
        out += probe_graph(p, case, g.forward, g.forward_inputs, "forward", g.saved_from,
                           force=not first)
        out += probe_graph(p, case, g.backward, g.backward_inputs, "backward",
                           force=not first)
        runs += 1
        if not several or runs >= TRAINING_RUNS:
            break
    return out or [case.skipped("trace", "no sample")]
