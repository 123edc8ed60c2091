"""A model to the ATen graph the planner sees, by ``torch.export``.

``torch.export`` (non-strict, under
``no_grad``), then ``run_decompositions`` with PyTorch's CompositeImplicitAutograd
decompositions (what AOTAutograd's tracing applies on the ``torch.compile`` path) and the
lowering's own table (``run.lower.decomposition_table``: the fused inference kernels and
the config's ``decompositions:``). The same graph kind as the compile path's inference
graphs: functional ATen with FakeTensor metadata; weights as lifted placeholders."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.fx

from ..errors import ArbiterError

#: input kinds of an ExportedProgram's signature that hold the program's own tensors
WEIGHT_KINDS = ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")


def decompositions(config_decompositions: list[str]) -> dict:
    """The table ``run_decompositions`` gets (see the module)."""
    from torch._export.utils import _collect_all_valid_cia_ops, _get_decomp_for_cia

    from ..run.lower import decomposition_table

    cia = {op: _get_decomp_for_cia(op) for op in _collect_all_valid_cia_ops()}
    return {**cia, **decomposition_table(config_decompositions)}


def trace(model: Any, args: tuple, kwargs: Optional[dict], dynamic_shapes: Any,
          config_decompositions: list[str]):
    """The decomposed ExportedProgram of ``model`` (see the module); ArbiterError for a
    model in training mode or one that writes its buffers."""
    if (isinstance(model, torch.nn.Module) and model.training
            and not isinstance(model, torch.fx.GraphModule)):
        # a GraphModule's mode is not its graph's: the ops were fixed when it was traced
        # (a PT2E model from convert_pt2e reports training=True even after torchao's
        # move_exported_model_to_eval, and refuses .eval()); a batch-statistics update it
        # holds is a buffer write, refused below
        raise ArbiterError("arbiter.export is for inference: call model.eval() first (a "
                           "module in training mode would export its dropout and batch "
                           "statistics updates)")
    if not isinstance(args, tuple):
        raise ArbiterError(f"arbiter.export: args must be a tuple, got {type(args).__name__}")
    with torch.no_grad():
        try:
            ep = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes,
                                     strict=False)
        except Exception as exc:
            raise ArbiterError(f"torch.export could not export the model: "
                               f"{type(exc).__name__}: {str(exc).strip()[:2000]}") from exc
        with warnings.catch_warnings():
            # torch 2.13's own run_decompositions deep-copies a LeafSpec, which warns
            # "isinstance(treespec, LeafSpec) is deprecated" on every export: torch's
            # internals, nothing the user can act on
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*",
                                    category=FutureWarning)
            ep = ep.run_decompositions(decompositions(config_decompositions))
    _drop_metadata_asserts(ep)
    sig = ep.graph_signature
    mutated = {**sig.buffers_to_mutate, **sig.user_inputs_to_mutate}
    if mutated:
        raise ArbiterError(f"the model writes {', '.join(sorted(set(mutated.values())))} in "
                           "place while it runs; arbiter.export takes inference programs "
                           "that write no buffer or input")
    for name, value in ep.constants.items():
        if not isinstance(value, torch.Tensor):
            raise ArbiterError(f"the exported program holds {name}, a "
                               f"{type(value).__name__}: only tensor constants can be saved")
    return ep


def _drop_metadata_asserts(ep: Any) -> None:
    """Remove ``_assert_tensor_metadata`` nodes (torch.export's check of a ``.to()``'s
    dtype, in place): in a traced program the dtypes are the graph's own, fixed when it
    was traced, so the check can never fail; left in, each is a node only eager runs
    (it returns nothing), and the tensor it checks must leave its backend's partition
    (T5-small: 16 such nodes made its ONNX Runtime partition return 17 tensors, and an
    eager partition). Size assertions (``_assert_scalar``) stay: they check inputs."""
    graph = ep.graph_module.graph
    dropped = 0
    for node in list(graph.nodes):
        if node.op == "call_function" and \
                node.target is torch.ops.aten._assert_tensor_metadata.default and not node.users:
            graph.erase_node(node)
            dropped += 1
    if dropped:
        ep.graph_module.recompile()


@dataclass
class AtenGraph:
    """The planner's copy of an ExportedProgram's graph: ``gm`` (same node names),
    ``constants`` (weight placeholder -> tensor, baked into partitions), ``weights``
    (the tensors the stitched graph takes first, in placeholder order), and its user
    inputs' placeholder names and traced values."""

    gm: torch.fx.GraphModule
    constants: dict[torch.fx.Node, torch.Tensor]
    weights: list[torch.Tensor]
    input_names: list[str]
    input_values: list[Any]


def _lazy_graph_module(graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """A GraphModule whose Python code is generated when it is first run or read, not
    here: the whole program's graph is only read (partitioned, stitched), and generating
    its code took 0.2-0.5 s of a large model's load, twice (after the unused ``getitem``
    nodes are removed). torch's own lazy GraphModule (what Inductor uses), where it has one."""
    try:
        from torch.fx._lazy_graph_module import _make_graph_module, _use_lazy_graph_module
    except ImportError:  # another torch: generated now
        return torch.fx.GraphModule(torch.nn.Module(), graph, class_name="Exported")
    with _use_lazy_graph_module(True):
        return _make_graph_module(torch.nn.Module(), graph, class_name="Exported")


def aten_graph(ep: Any) -> AtenGraph:
    """The planner's copy of ``ep``'s graph; the graph passes are not applied here (the
    compile path applies them, run/passes.py; a load applies the same, deploy/opening.py)."""
    graph = torch.fx.Graph()
    env: dict = {}
    out = graph.graph_copy(ep.graph, env)
    graph.output(out)
    gm = _lazy_graph_module(graph)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    specs = ep.graph_signature.input_specs
    if len(specs) != len(placeholders):
        raise ArbiterError(f"the exported program has {len(placeholders)} inputs and "
                           f"{len(specs)} input specs")
    tensors = {**ep.state_dict, **ep.constants}
    constants, weights, names, values = {}, [], [], []
    seen_user = False
    for node, spec in zip(placeholders, specs):
        kind = spec.kind.name
        if kind in WEIGHT_KINDS:
            if seen_user:
                raise ArbiterError("the exported program takes weights after its inputs; "
                                   "arbiter.export expects them first")
            t = tensors[spec.target].detach()
            constants[node] = t
            weights.append(t)
            node.meta["arbiter_input"] = (spec.target, kind.lower())
        elif kind == "USER_INPUT":
            seen_user = True
            names.append(node.name)
            values.append(node.meta.get("val"))
        else:
            raise ArbiterError(f"input {node.name}: an input of kind {kind}, which "
                               "arbiter.export does not take")
    return AtenGraph(gm, constants, weights, names, values)
