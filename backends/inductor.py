"""TorchInductor: PyTorch's own compiler (C++/OpenMP on CPU, Triton on GPU).

A partition is handed to ``torch._inductor.compile_fx.compile_fx`` with the partition's
real first-call inputs, as Inductor's own torch.compile path does after Dynamo. Wrapping
the ATen partition in ``torch.compile`` instead was tried: Dynamo declined some partition
GraphModules ("found no compiled frames"), so the direct entry is used. A static
partition's kernels are specialized to those shapes.

A partition with symbolic shapes is compiled on the graph's own fake inputs (FakeTensors
with SymInt sizes, and its SymInt inputs), as Inductor does under Dynamo: the kernels take
the sizes as arguments, one compile serves every size. Guards Inductor adds to Dynamo's
ShapeEnv while compiling are checked per call by ``arbiter.run.dynamic``.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Literal, Optional, Union

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

from arbiter.backend import Backend, bounded_threads
from arbiter.errors import require_known, unknown_name
from arbiter.ops import DECLARED_NAMESPACES, dequantizes_constants, nonfinite_validators
from arbiter.registry import register_backend
from arbiter.shapes import graph_is_symbolic, input_values

from ._nonfinite import ExactNonfinite

log = logging.getLogger(__name__)


class InductorOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Optional[Literal["default", "reduce-overhead", "max-autotune",
                           "max-autotune-no-cudagraphs"]] = Field(
        None, description="torch.compile mode (the max-autotune modes turn on "
        "`max_autotune`)")
    exact_nonfinite: Union[StrictBool, Literal["guard"]] = Field(
        True, description="ops whose results differ from eager when an input holds NaN "
        "(measured by `arbiter probe`: grid_sample, multi_margin_loss). true: refused; "
        "`guard`: taken, and a partition holding one checks its floating inputs on every "
        "call and runs a call with NaN or inf in eager; false: taken, unchecked")
    trusted_options: list[str] = Field(
        default_factory=list, description="keys of `options` you allow although they name "
        "programs, paths or flags Inductor runs or loads (one by one: only write this in a "
        "config you wrote yourself)")
    options: dict[str, Any] = Field(
        default_factory=dict, description="torch._inductor.config overrides, checked "
        "against Inductor's config: an unknown key or a value of the wrong type is a "
        "config error. Keys whose values are free text (programs, paths, compiler flags: "
        "`cpp.cxx`, `global_cache_dir`, `cpp.march`...) or code, and Inductor's private and "
        "testing keys, are refused unless listed in `trusted_options`: a config that sets "
        "`cpp.cxx` runs that program")
    freeze_quantized: StrictBool = Field(
        True, description="compile a partition holding int8 weights (a PT2E model's "
        "dequantize of a constant) with Inductor's freezing passes "
        "(`torch._inductor.config.freezing`, the PT2E X86 recipe), which lower the "
        "dequantize and the convolution or linear it feeds to oneDNN's int8 kernels; "
        "false: they run as float compute")
    autocast: Optional[Literal["bf16", "f16"]] = Field(
        None, description="compile the partition as PyTorch's autocast would run it "
        "(matmuls, convolutions, attention in bfloat16 or float16; outputs cast back to "
        "their traced dtypes): faster, not eager-equal. Static shapes only. Offered as a "
        "lower-precision variant under `accuracy:` (docs/precision.md); None: off")

    @field_validator("trusted_options")
    @classmethod
    def _known_trusted(cls, v: list[str]) -> list[str]:
        require_known("torch._inductor.config key", v, _inductor_keys())
        return v

    @field_validator("options")
    @classmethod
    def _checked(cls, v: dict[str, Any], info) -> dict[str, Any]:
        return _check_options(v, info.data.get("trusted_options") or [])


def _inductor_keys() -> list[str]:
    from torch._inductor import config as inductor_config

    return list(inductor_config._config)


def _unsafe(key: str, entry) -> str:
    """Why setting ``key`` from a config could run or load code, or break answers on
    purpose; "" when it cannot (booleans, numbers, fixed choices)."""
    leaf = key.rsplit(".", 1)[-1]
    if leaf.startswith("_") or key.startswith("test_configs.") or "TESTING_ONLY" in key:
        return "a private or testing key of Inductor (some inject wrong answers)"
    kinds = _leaf_types(entry.value_type)
    if any(k == "code" for k in kinds):
        return "its value is code (a callable, a class, a pass)"
    if any(k == "text" for k in kinds):
        return ("its value is free text that Inductor may run, load or put on a compiler "
                "command line (a program, a path, a flag)")
    return ""


def _leaf_types(tp) -> list[str]:
    """'text', 'code' or 'plain' for every type a config value may take."""
    import collections.abc
    import typing

    if tp is str:
        return ["text"]
    if tp in (bool, int, float):
        return ["plain"]
    if tp is type(None):
        return ["plain"]
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return ["plain"]
    if origin is collections.abc.Callable or tp is collections.abc.Callable:
        return ["code"]
    args = typing.get_args(tp)
    if origin is not None and args:
        return [k for a in args if a is not Ellipsis for k in _leaf_types(a)]
    # NoneType-typed entries used as text, classes, forward references: not plain data
    return ["code"] if isinstance(tp, (type, str, typing.ForwardRef)) else ["text"]


def _check_options(options: dict[str, Any], trusted: list[str]) -> dict[str, Any]:
    """``options`` checked against torch._inductor.config (keys, types, trust); values
    converted to Inductor's types (a YAML list to a tuple)."""
    from pydantic import TypeAdapter
    from torch._inductor import config as inductor_config

    entries = inductor_config._config
    out = {}
    for key, value in options.items():
        entry = entries.get(key)
        if entry is None:
            raise ValueError(unknown_name("torch._inductor.config key", key, sorted(entries))
                             .split("; valid:")[0] + " (torch._inductor.config has no such "
                             "key; see torch/_inductor/config.py)")
        why = _unsafe(key, entry)
        if why and key not in trusted:
            raise ValueError(f"{key}: refused, {why}. A config that sets it can run any "
                             f"program. If you wrote this config, allow the key by name: "
                             f"trusted_options: [{key}]")
        if not why or key in trusted:
            try:
                adapter = TypeAdapter(entry.value_type)
            except Exception:  # noqa: BLE001 - a type pydantic cannot check (code)
                adapter = None
            if adapter is not None:
                value = _typed(adapter, key, value, entry.value_type)
        if key == "cpp.threads" and isinstance(value, int) and value > 0:
            value = bounded_threads(value, "inductor cpp.threads")
        out[key] = value
    return out


def _typed(adapter, key: str, value: Any, tp) -> Any:
    """``value`` as Inductor's type ``tp``: strict (no bool for an int, no string for a
    bool), YAML lists taken as tuples where a tuple is wanted."""
    from pydantic import ValidationError

    def tuples(v):
        return tuple(tuples(x) for x in v) if isinstance(v, list) else v

    try:
        return adapter.validate_python(value, strict=True)
    except ValidationError as exc:
        try:
            return adapter.validate_python(tuples(value), strict=True)
        except ValidationError:
            pass
        first = exc.errors()[0]["msg"]
        raise ValueError(f"{key}: {first} (got {value!r}; torch._inductor.config "
                         f"declares {_type_name(tp)})") from None


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) if isinstance(tp, type) else str(tp).replace(
        "typing.", "")


#: Ops whose results differ from eager when an input holds NaN (torch 2.13 Inductor,
#: CPU, float32; `arbiter probe inductor --dtypes float32`, 2026-11-23). Refused on
#: floating inputs while `exact_nonfinite` is true (under `guard` taken, inputs checked
#: per call). Differences that need +-inf or huge inputs (gelu, batch and group norm,
#: linear upsampling, remainder with inf; acosh of huge values) are reported by the
#: probe, not refused (docs/robustness.md).
_NONFINITE = {
    "aten.grid_sampler_2d": "grid_sample with NaN differs",
    "aten.multi_margin_loss": "multi_margin_loss with NaN differs",
}
_NONFINITE_CHECKS = nonfinite_validators(_NONFINITE, "inductor")


def _floating_remainder(node: torch.fx.Node) -> Optional[str]:
    """Inductor lowers a floating ``remainder`` as ``a - b * floor(a / b)``, which loses
    the result past 2**24 / b in float32 (1e8 % 3 gave 0, eager 1; -1e8 % 3 gave 8):
    ATen takes ``fmod`` and fixes the sign, exactly (arbiter probe inductor --edges)."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and val.dtype.is_floating_point:
        return ("floating remainder is computed as a - b * floor(a / b) by Inductor: "
                "wrong for large magnitudes (1e8 % 3 gives 0, eager 1)")
    return None


def _integer_truncation_by_a_tensor(node: torch.fx.Node) -> Optional[str]:
    """Inductor's C++ kernel for an integer ``div(a, b, rounding_mode="trunc")`` divides
    by ``b`` unchecked: a zero in ``b`` kills the process (SIGFPE; plain
    ``torch.compile(backend="inductor")`` too), where eager raises ZeroDivisionError.
    Found by a sweep of later calls' values (2026-11-29); floor division checks."""
    mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
    val = node.meta.get("val")
    divisor = node.args[1] if len(node.args) > 1 else None
    if mode == "trunc" and isinstance(divisor, torch.fx.Node) and \
            isinstance(val, torch.Tensor) and not val.dtype.is_floating_point \
            and not val.dtype.is_complex:
        return ("integer division rounding to zero by a tensor: a 0 in it kills the "
                "process in Inductor's kernel (SIGFPE), where eager raises")
    return None


_VALIDATORS = {"aten.remainder.Tensor": _floating_remainder,
               "aten.remainder.Scalar": _floating_remainder,
               "aten.remainder.Scalar_Tensor": _floating_remainder,
               "aten.div.Tensor_mode": _integer_truncation_by_a_tensor}


@register_backend
class Inductor(ExactNonfinite, Backend):
    name = "inductor"
    color = "#f28e2b"  # fixed in every report (arbiter/report/html.py)
    Options = InductorOptions
    own_validators = _VALIDATORS
    nonfinite_checks = _NONFINITE_CHECKS
    # its random ops (dropout...) draw on every call with seeds taken from torch's
    # default generator at that call (inductor_seeds), as under torch.compile
    draws_random = True

    def compile(self, gm, example_inputs):
        from torch._inductor import config as inductor_config
        from torch._inductor.compile_fx import compile_fx

        gm = cat_of_one_as_clone(gm)
        # symbolic: the graph's fake inputs, so the kernels take sizes as arguments
        example = input_values(gm) if graph_is_symbolic(gm) else list(example_inputs)
        if self.options.autocast is not None:
            if graph_is_symbolic(gm):
                raise RuntimeError("inductor autocast takes static shapes only")
            gm = autocast_graph(gm, example, _AUTOCAST[self.options.autocast])
        patches = dict(self.options.options)
        if self.options.mode in ("max-autotune", "max-autotune-no-cudagraphs"):
            patches.setdefault("max_autotune", True)
        if self._threads is not None:
            # The OpenMP thread count is baked into the generated C++ kernels at compile
            # time (cpp.threads; -1 would read torch.get_num_threads() then).
            patches.setdefault("cpp.threads", self._threads)
        if self.options.freeze_quantized and dequantizes_constants(gm):
            patches.setdefault("freezing", True)
        elif not any(n.op == "get_attr" for n in gm.graph.nodes):
            # nothing to freeze: a user's global freezing would take the weight inputs
            # for constants (its oneDNN int8 pass fails on them)
            patches.setdefault("freezing", False)
        context, fakes = _cacheable_context(gm, example)
        if patches.get("freezing"):
            # Inductor freezes only what it compiles without grad; its oneDNN int8
            # lowering warns about its own torch.tensor() copy, nothing the user did
            context = _frozen(context)
        if context is not None:
            try:
                with inductor_config.patch(patches), context:
                    return compile_fx(gm, fakes)
            except Exception as exc:  # noqa: BLE001 - retried below without the context
                # Seen on the small CNN's training forward: Inductor's scalar pass looked
                # up a symbol the context's shape env does not know (KeyError). Compile
                # as before, at the price of Inductor's cache for this graph.
                log.info("inductor: compile inside a tracing context failed (%s: %s); "
                         "compiling without it (Inductor's FX graph cache is bypassed)",
                         type(exc).__name__, str(exc)[:200])
        with inductor_config.patch(patches), \
                (_frozen(None) if patches.get("freezing") else contextlib.nullcontext()):
            return compile_fx(gm, example)

    # -- saved programs (docs/deploy.md; backends/_inductor_artifact.py) ---------------
    def save_artifact(self, compiled, gm: torch.fx.GraphModule):
        """An AOTInductor package of the partition (static shapes only): compiled again,
        ahead of time, into a shared library, which loading runs (``native_code``)."""
        from ._inductor_artifact import save

        return save(self, gm)

    def load_artifact(self, entry: dict, files: dict, gm: torch.fx.GraphModule):
        """The AOTInductor package loaded (``torch._inductor.aoti_load_package``)."""
        from ._inductor_artifact import load

        return load(entry, files, gm)

    def precision_variants(self) -> dict:
        """bf16 autocast where the CPU computes bf16 natively (oneDNN's check: AVX512-BF16
        or AMX); none when the config sets autocast already."""
        if self.options.autocast is not None:
            return {}
        try:
            native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except Exception:  # noqa: BLE001 - a torch without the check offers nothing
            native = False
        return {"bf16": {"autocast": "bf16"}} if native else {}

    _threads = None  # set by configure_resources: the budget's threads

    def configure_resources(self, budget) -> dict:
        """Inductor's CPU kernels use torch's OpenMP pool (already sized by
        arbiter.run.resources); the budget's thread count is also baked into its kernels."""
        user = self.options.options.get("cpp.threads")
        if not budget.coordinate:
            return {"coordinated": False, "openmp_threads": "torch.get_num_threads() at compile"}
        if user is None:
            type(self)._threads = budget.threads  # process-wide, like the budget
        return {"coordinated": True,
                "openmp_threads": user if user is not None else budget.threads,
                "spinning": "torch's OpenMP: OMP_WAIT_POLICY at torch's import"}

    @classmethod
    def declared_ops(cls):
        """Ops Inductor lowers or decomposes (its ATen fallback kernels included): ATen's,
        and PT2E's quantize/dequantize."""
        from torch._inductor.decomposition import select_decomp_table
        from torch._inductor.lowering import fallbacks, lowerings

        out = {}
        for table, note in ((lowerings, None), (select_decomp_table(), "decomposed by Inductor")):
            for op in table:
                if isinstance(op, torch._ops.OpOverload) and op.namespace in DECLARED_NAMESPACES:
                    out.setdefault(op, {"note": note} if note else {})
        for op in fallbacks:
            if isinstance(op, torch._ops.OpOverload) and op.namespace in DECLARED_NAMESPACES:
                out[op] = {"note": "runs as an ATen fallback kernel inside Inductor's code"}
        return out


_AUTOCAST = {"bf16": torch.bfloat16, "f16": torch.float16}


def cat_of_one_as_clone(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm``, or a copy whose ``aten.cat`` nodes that concatenate one tensor with only
    legacy empty ones (shape ``(0,)``, or size 0 on the cat dimension) and were traced
    contiguous are ``aten.clone(x, memory_format=torch.contiguous_format)``.

    Eager's ``cat`` returns such a tensor contiguous (a non-dense input: GPT-2's first
    attention step concatenates an empty key cache and a transposed slice of the fused
    QKV projection); Inductor's decomposition of it is ``x.clone()``, which keeps ``x``'s
    transposed layout, so the ``view`` traced after it fails inside Inductor's own trace
    ("Cannot view a tensor with shape ... and strides ...": Inductor did not compile
    GPT-2's training forward at all) and, where the cat is a partition's output, the
    nodes after the partition got that layout (issue 17). The clone asks for eager's
    layout; values and dtype are the same (a dtype promotion is left to Inductor)."""
    def is_empty(v: Any, dim: int) -> bool:
        shape = tuple(v.shape)
        if len(shape) == 1 and isinstance(shape[0], int) and shape[0] == 0:
            return True
        return dim < len(shape) and isinstance(shape[dim], int) and shape[dim] == 0

    found = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is not torch.ops.aten.cat.default:
            continue
        out = n.meta.get("val")
        parts = n.args[0] if n.args else n.kwargs.get("tensors", ())
        dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
        vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in parts]
        if not isinstance(out, torch.Tensor) or not all(isinstance(v, torch.Tensor)
                                                       for v in vals):
            continue
        dim = dim + out.dim() if dim < 0 else dim
        kept = [a for a, v in zip(parts, vals) if not is_empty(v, dim)]
        if len(kept) == 1 and len(parts) > 1 and kept[0].meta["val"].dtype == out.dtype \
                and out.is_contiguous():
            found.append((n, kept[0]))
    if not found:
        return gm
    graph = torch.fx.Graph()  # a copy: the next backends and eager get gm as it is
    env: dict = {}
    for n in gm.graph.nodes:
        env[n] = graph.node_copy(n, lambda a: env[a])
    for n, x in found:
        old = env[n]
        with graph.inserting_before(old):
            new = graph.call_function(torch.ops.aten.clone.default, (env[x],),
                                      {"memory_format": torch.contiguous_format})
        new.meta = dict(old.meta)
        old.replace_all_uses_with(new)
        graph.erase_node(old)
    graph.lint()
    log.debug("inductor: %d cat(s) of one tensor compiled as contiguous clones", len(found))
    return torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)


def autocast_graph(gm: torch.fx.GraphModule, example: list,
                   dtype: torch.dtype) -> torch.fx.GraphModule:
    """``gm`` retraced (make_fx, on the real inputs) under ``torch.autocast`` to
    ``dtype``: PyTorch's own autocast policy inserts the casts around the ops it lowers
    (mm, addmm, bmm, convolution, attention...), and every output is cast back to the
    dtype it was traced with, so the partition's contract (output dtypes) holds."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from arbiter.ops import output_values

    dtypes = [v.dtype if isinstance(v, torch.Tensor) else None
              for v in (output_values(gm) or ())]
    device = next((t.device.type for t in example if isinstance(t, torch.Tensor)), "cpu")

    def run(*args):
        outs = gm(*args)
        if len(dtypes) != len(outs):  # outputs traced without metadata: left as they are
            return tuple(outs)
        return tuple(o.to(d) if d is not None and isinstance(o, torch.Tensor)
                     and o.dtype != d else o for o, d in zip(outs, dtypes))

    with torch.autocast(device, dtype=dtype), torch.no_grad():
        return make_fx(run, tracing_mode="real")(*example)


def _cacheable_context(gm: torch.fx.GraphModule, example: list):
    """(a tracing context around ``compile_fx``, with the fake mode and shape env the
    graph was traced with; the example inputs to compile with inside it).

    Pieces compile on their first call, outside Dynamo's and AOTAutograd's tracing
    context; without one, Inductor's own FX graph cache bypasses every graph ("No shape
    env") and a second process recompiles everything (measured on gpt2_tiny: 12.6 s warm
    vs 40 s cold, all three pieces bypassed; with this context they hit). The graph's
    own fake mode is used, not a fresh one.

    Inside that context AOTAutograd turns each *real* example input into a fake one with
    *symbolic* sizes (the shape env is there), so a static partition was compiled with
    size symbols wherever its guards did not pin them: the PT2E CNN's convolutions took
    ``(8, 3, s18, s18)``, with kernels that read their sizes at run time. So a static
    graph's real inputs are handed over as fake tensors of their own sizes and strides
    (``static_shapes=True``), as Dynamo hands Inductor its static graphs; a symbolic
    graph's ``example`` are its fake values already. Returns (None, ``example``) where no
    context is needed or possible (one is active already: a caller tracing; or the graph
    has no fake mode)."""
    from torch._guards import TracingContext, detect_fake_mode, tracing

    if TracingContext.try_get() is not None:
        return None, example
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    vals = [n.meta.get("val") for n in placeholders]
    try:
        fake_mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    except AssertionError as exc:
        # inputs traced under two fake modes (seen with two BERT-style models compiled in
        # one process: dropout masks inlined from the first graph's trace, since made in
        # each graph's own mode by decompose/tracing.py), which compile_fx refuses with or
        # without a context: a static graph's inputs get values of one mode, the first
        # input's, from the real example
        fake_mode = _one_fake_mode(gm, placeholders, example)
        if fake_mode is None:
            raise
        log.info("inductor: the partition's inputs carried more than one fake mode (%s); "
                 "given the first input's", str(exc).splitlines()[0][:200])
    if fake_mode is None or fake_mode.shape_env is None:
        return None, example  # nothing to key on: Inductor bypasses its cache
    from torch._subclasses.fake_tensor import FakeTensor

    fakes = [fake_mode.from_tensor(t, static_shapes=True)
             if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor) else t
             for t in example]
    return tracing(TracingContext(fake_mode)), fakes


def _one_fake_mode(gm: torch.fx.GraphModule, placeholders: list, example: list):
    """The fake mode of ``gm``'s first fake input, with every input's value made a fake
    of that mode from its real example (static sizes); None where that cannot be done (a
    symbolic graph, whose example inputs are the fake values themselves)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if graph_is_symbolic(gm) or len(placeholders) != len(example):
        return None
    mode = next((v.fake_mode for v in (p.meta.get("val") for p in placeholders)
                 if isinstance(v, FakeTensor)), None)
    if mode is None:
        return None
    for p, real in zip(placeholders, example):
        if isinstance(p.meta.get("val"), FakeTensor) and isinstance(real, torch.Tensor) \
                and not isinstance(real, FakeTensor):
            p.meta["val"] = mode.from_tensor(real, static_shapes=True)
    return mode


@contextlib.contextmanager
def _frozen(context):
    """``context`` (or nothing) under ``torch.no_grad``, with the UserWarning Inductor's
    oneDNN int8 lowering gives for its own ``torch.tensor(tensor)`` silenced."""
    import warnings

    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message=r"To copy construct from a tensor",
                                category=UserWarning, module=r"torch\._inductor\..*")
        if context is not None:
            stack.enter_context(context)
        yield
