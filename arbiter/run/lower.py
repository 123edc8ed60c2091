"""Lowering Dynamo's graph to ATen IR with AOTAutograd.

``aot_module_simplified`` traces forward and backward (or a single inference graph when
no gradient is needed) into functional ATen graphs with FakeTensor metadata on every
node, and calls our compiler once per graph. Decompositions are PyTorch's own table
(``torch._decomp``), restricted to the ops the config's ``decompositions:`` lists (a
backend's manifest list applies only to the nodes it takes: arbiter/decompose/), and
arbiter's own of PyTorch's fused inference kernels (``nn.TransformerEncoderLayer``'s fast
path: arbiter/decompose/fused.py), which every graph gets.

Inference graphs hand parameters and buffers to backends as constants. AOTAutograd's
metadata says which graph inputs are static (parameters and buffers lifted by Dynamo) and
which the graph mutates; static, unmutated inputs are bound to the real tensors Dynamo
passed us, so backends such as ONNX Runtime can fold and prepack them. Training graphs
keep weights as inputs, since the optimizer changes them between calls.

With dynamic shapes the graph also computes sizes: Dynamo's SymInt inputs combined by
``operator.mul`` and friends, right before their first use. ``hoist_size_arithmetic``
moves them to the top (the first of run/passes.py's passes), so the partitioner sees
them ready before any compute node and does not cut a backend's run in two around them.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

log = logging.getLogger(__name__)

#: compile_graph(graph, kind, constants) -> callable(*inputs); kind is "inference",
#: "forward" or "backward".
CompileOne = Callable[[torch.fx.GraphModule, str, dict], Callable]


def decomposition_table(names: Sequence[str]) -> dict:
    """The decompositions applied to every graph when it is lowered: PyTorch's fused
    inference kernels (arbiter/decompose/fused.py; no backend takes them whole), then
    those the config's ``decompositions:`` names."""
    from ..decompose import table
    from ..decompose.fused import table as fused

    return {**fused(), **table(names)}


def input_names(gm: torch.fx.GraphModule) -> list[tuple[str, str]]:
    """(name, kind) of each input of a Dynamo graph in the user's terms: the name as
    ``fc1.weight`` and the kind ``parameter``, ``buffer`` or ``input``, from Dynamo's
    sources (the placeholder's name and ``input`` where it has none)."""
    import re

    names = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        source = getattr(getattr(n.meta.get("grapharg"), "source", None), "name", None)
        if callable(source):
            source = source()
        if not isinstance(source, str):
            names.append((n.name, "input"))
            continue
        kind = ("buffer" if "._buffers[" in source else
                "parameter" if "._parameters[" in source else "input")
        source = re.sub(r"\._(?:modules|parameters|buffers)\['([^']*)'\]", r".\1", source)
        names.append((re.sub(r"^L\['([^']*)'\]", r"\1", source), kind))
    return names


def lifted_weights(gm: torch.fx.GraphModule) -> tuple[list[torch.Tensor],
                                                      list[tuple[str, str]]]:
    """The parameters and buffers of ``gm`` itself, in the order AOTAutograd lifts them
    into its graph's first inputs, with (name, kind) of each as ``input_names`` gives."""
    params = dict(gm.named_parameters(remove_duplicate=False))
    buffers = dict(gm.named_buffers(remove_duplicate=False))
    return ([*params.values(), *buffers.values()],
            [(name, "parameter") for name in params] + [(name, "buffer") for name in buffers])


def frozen_inputs(gm: torch.fx.GraphModule, real_inputs: Sequence[Any],
                  names: Sequence[tuple[str, str]] = ()) -> dict[torch.fx.Node, torch.Tensor]:
    """Placeholders of an inference graph that are parameters/buffers -> real tensors.

    ``names`` (the user's name and kind of each input, ``input_names``) are kept on the
    frozen placeholders as ``meta["arbiter_input"]`` (arbiter/run/freeze.py reads them)."""
    from torch._guards import TracingContext

    ctx = TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if meta is None or len(placeholders) != len(real_inputs):
        log.info("weights stay graph inputs: AOT metadata does not map inputs one to one")
        return {}
    static = set(getattr(meta, "static_input_indices", ()) or ())
    out: dict[torch.fx.Node, torch.Tensor] = {}
    for i in sorted(static):
        real = real_inputs[i]
        node = placeholders[i]
        info = meta.input_info[i] if i < len(meta.input_info) else None
        if not isinstance(real, torch.Tensor) or (info is not None and (
                info.mutates_data or info.mutates_metadata)):
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and tuple(val.shape) == tuple(real.shape) \
                and val.dtype == real.dtype:
            out[node] = real.detach()
            if i < len(names):
                node.meta["arbiter_input"] = names[i]
    return out


def hoist_size_arithmetic(gm: torch.fx.GraphModule) -> int:
    """Move nodes that compute a size from the graph's inputs alone (no tensor math:
    ``s0 * s1``, ``sym_size(x, 0)`` of an input) right after the placeholders, keeping
    their order. Returns how many moved."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if not placeholders:
        return 0
    anchor = placeholders[-1]
    ready = set(placeholders)
    moved = 0
    for n in nodes:
        if n.op != "call_function" or n in ready:
            continue
        val = n.meta.get("val")
        if not isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)) or \
                not all(i in ready for i in n.all_input_nodes):
            continue
        if isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable:
            continue
        if anchor.next is not n:
            anchor.append(n)
            moved += 1
        anchor = n
        ready.add(n)
    if moved:
        gm.graph.lint()
        gm.recompile()
    return moved


_fsdp_warned = False


def _fsdp_weights() -> bool:
    """Whether the model being compiled holds FSDP2-managed (``fully_shard``) weights,
    which are never frozen: FSDP2 frees a module's gathered weights after its forward
    (``storage.resize_(0)``) and gathers them again into the same tensors without a
    version bump (``_unsafe_preserve_version_counter``), so the frozen-weight check
    (run/freeze.py) could not see an optimizer step's change; and the ONNX exporter's
    numpy view of a constant makes its storage unresizable, which FSDP2's free then
    fails on. Warned once per process; the report shows such graphs with 0 constants."""
    global _fsdp_warned
    from .owner import compiling_fsdp_module

    if not compiling_fsdp_module():
        return False
    if not _fsdp_warned:
        _fsdp_warned = True
        log.warning("freeze_weights is off for graphs of FSDP2 (fully_shard) modules: FSDP2 "
                    "re-gathers their weights in place between calls, unseen by the "
                    "frozen-weight check; their weights stay graph inputs")
    return True


def lower(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], compile_graph: CompileOne,
          *, decompositions: dict, freeze_weights: bool) -> Callable:
    """Run AOTAutograd on a Dynamo graph; ``compile_graph`` gets each ATen graph."""
    from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

    if freeze_weights and _fsdp_weights():
        freeze_weights = False
    # AOTAutograd lifts the graph's own parameters and buffers ahead of the inputs: Dynamo
    # makes a module's weights graph attributes under torch._inductor.config.freezing
    # with grad off (the user's setting), and they are weights all the same
    weights, weight_names = lifted_weights(gm)
    real_inputs = [*weights, *example_inputs]
    names = [*weight_names, *input_names(gm)] if freeze_weights else []

    def compiler(kind: str):
        def compile_one(fx_g: torch.fx.GraphModule, _fake_inputs: Sequence[Any]):
            # AOT calls us under its fake and functional modes; we handle real weights.
            from torch.utils._python_dispatch import _disable_current_modes

            with _disable_current_modes():
                return _compile_one(kind, fx_g)
        return compile_one

    def _compile_one(kind: str, fx_g: torch.fx.GraphModule):
        freeze = kind == "inference" and freeze_weights
        constants = frozen_inputs(fx_g, real_inputs, names) if freeze else {}
        return make_boxed_func(compile_graph(fx_g, kind, constants))

    # Dynamo's DDPOptimizer (torch.compile of a DistributedDataParallel model) tells
    # whether a backend ran AOTAutograd on a bucket's subgraph by this counter, as
    # torch's own aot_autograd backends bump it; unbumped, it keeps no forward metadata
    # per bucket and the lazily compiled backward fails ("expected same # of fw and bw
    # compiles")
    from torch._dynamo.utils import counters

    counters["aot_autograd"]["total"] += 1
    return aot_module_simplified(
        gm, example_inputs,
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=decompositions,
        keep_inference_input_mutations=True,
    )
