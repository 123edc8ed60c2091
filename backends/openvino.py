"""OpenVINO (CPU plugin).

A partition is converted by OpenVINO's own PyTorch frontend (``_openvino_convert.py``:
its FX decoder, or ``torch.export`` then ``openvino.convert_model``), then
``Core.compile_model`` for the device; no op translations are written here. Precision
is float32 unless the config says otherwise (the CPU plugin picks bf16 by itself on CPUs
that have it: errors of 2e-2 on transformers, 3.0 on ResNet-50 measured). Tensors cross
without copies where OpenVINO allows: inputs as ``ov.Tensor`` over the torch tensor's
memory (made contiguous first: the one copy, counted), outputs torch-allocated and set
as the request's output tensors; one infer request per thread. A symbolic partition is
converted with dynamic dimensions bounded by the symbols' ranges, so one compiled model
serves every size; output shapes are computed per call. docs/design.md ("OpenVINO
backend").
"""
from __future__ import annotations

from typing import Literal, Optional, Union

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

from arbiter.backend import Backend, thread_option
from arbiter.errors import require_known
from arbiter.ops import declared_overloads, nonfinite_validators, reads_floating
from arbiter.registry import register_backend
from arbiter.shapes import graph_is_symbolic, input_values

from ._export import Runner, check_inputs, distinct_outputs, outputs_of
from ._nonfinite import ExactNonfinite
from ._openvino_checks import VALIDATORS
from ._openvino_plugin import properties_for
from ._openvino_convert import convert


_PRECISIONS = {"f32": "f32", "bf16": "bf16", "f16": "f16"}


class OvOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    precision: Literal["f32", "bf16", "f16"] = Field(
        "f32", description="INFERENCE_PRECISION_HINT. f32 by default: the CPU plugin "
        "otherwise picks bf16 on CPUs that have it, which is faster but not eager-equal")
    cache_dir: Optional[str] = Field(
        None, description="OpenVINO's CACHE_DIR (compiled blobs reused across processes); "
        "None: no cache")
    num_threads: Optional[StrictInt] = Field(
        None, ge=0, description="INFERENCE_NUM_THREADS; None: OpenVINO's default; at most "
        "the CPUs this process may run on (more is reduced, with a warning)")
    performance_hint: Literal["LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT"] = Field(
        "LATENCY", description="PERFORMANCE_HINT")
    exact_nonfinite: Union[StrictBool, Literal["guard"]] = Field(
        "guard", description="ops whose results differ from eager when their inputs hold "
        "NaN (measured by `arbiter probe`, which feeds those: relu(NaN) and maximum(NaN, 0) "
        "are 0, exp(NaN) is inf, NaN > x is true, softmax of a row with NaN is 0; eager "
        "says NaN or false). `guard` (default): taken, and a partition holding one checks "
        "its floating inputs on every call, and the values made inside it by ops that can "
        "make NaN or inf of finite numbers (0 / 0, log(-1)) when those ops feed one, and "
        "runs a call with NaN or inf there in eager (a NaN from an overflow of ordinary "
        "arithmetic, or in the weights, is not caught); true: refused (exact, but "
        "ResNet-50 under cpu_all splits into 42 partitions); false: taken, unchecked")
    device: str = Field("CPU", description="OpenVINO device: a name OpenVINO has a plugin "
                        "for (CPU, GPU, NPU, AUTO, HETERO, MULTI, BATCH), optionally `.N` "
                        "or `:DEV,DEV` (`AUTO:GPU,CPU`); another is a config error. One "
                        "this machine lacks (`openvino.Core().available_devices`) makes the "
                        "backend unavailable")

    _bounded = thread_option("num_threads", "openvino num_threads")

    @field_validator("device")
    @classmethod
    def _known_device(cls, v: str) -> str:
        known = _known_devices()
        if known is None:  # openvino is not installed: the backend says so
            return v
        head, _, rest = v.partition(":")
        names = [head] + ([d for d in rest.split(",")] if rest else [])
        require_known("OpenVINO device", [n.split(".", 1)[0] for n in names], known)
        return v


#: Device plugins OpenVINO ships (2026.4); ``_known_devices`` adds what Core registers.
_DEVICE_PLUGINS = ("CPU", "GPU", "NPU", "AUTO", "HETERO", "MULTI", "BATCH")


def _known_devices() -> Optional[list[str]]:
    """Device names OpenVINO has a plugin for here, present or not; None without
    openvino. Core.get_versions(name) is empty for a name no plugin is registered for,
    and raises for one registered that cannot load here (a GPU plugin without a GPU)."""
    try:
        import openvino
    except ImportError:
        return None
    core = openvino.Core()
    known = []
    for name in (*_DEVICE_PLUGINS, *(d.split(".", 1)[0] for d in core.available_devices)):
        if name in known:
            continue
        try:
            registered = bool(core.get_versions(name))
        except Exception:  # noqa: BLE001 - registered, not loadable on this machine
            registered = True
        if registered:
            known.append(name)
    return known


#: dtypes the PyTorch frontend and the CPU plugin take as inputs/outputs.
_TORCH_TO_OV = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "boolean",
}


#: Ops whose results differ from eager when an input holds NaN (openvino 2026.4, CPU,
#: float32; `arbiter probe openvino --dtypes float32`, which feeds NaN, +-inf, -0.0 and
#: huge values one kind at a time, and single values by hand, 2026-11-23): a NaN vanishes
#: or appears. Refused on floating inputs while `exact_nonfinite` is true (under `guard`,
#: the default, taken with the partition's inputs checked per call). Differences
#: that need +-inf, -0.0 or huge inputs (fmod, remainder, atan2(-0.0, x), logsigmoid of a
#: huge value, bilinear upsampling and batch norm with inf...) are reported by the probe,
#: not refused (docs/robustness.md); float -> integer conversions are undefined there.
_NONFINITE = {
    "aten.relu": "relu(NaN) is 0",
    "aten.hardtanh": "hardtanh(NaN) is the lower bound",
    "aten.clamp": "clamp(NaN) is the lower bound",
    "aten.clamp_min": "clamp_min(NaN) is the bound",
    "aten.clamp_max": "clamp_max(NaN) is the bound",
    "aten.hardsigmoid": "hardsigmoid(NaN) is finite",
    "aten.maximum": "maximum(NaN, 0) is 0",
    "aten.minimum": "minimum(NaN, 0) is 0",
    "aten.max": "max skips NaN",
    "aten.min": "min skips NaN",
    "aten.amax": "amax of a row with NaN is inf",
    "aten.amin": "amin skips NaN",
    "aten.argmin": "argmin skips NaN",
    "aten.max_pool2d_with_indices": "max pooling skips NaN",
    "aten.max_pool3d_with_indices": "max pooling skips NaN",
    "aten._softmax": "softmax of a row with NaN is 0",
    "aten._log_softmax": "log_softmax of a row with NaN is finite",
    "aten.logsumexp": "logsumexp skips NaN",
    "aten.exp": "exp(NaN) is inf",
    "aten.expm1": "expm1(NaN) is inf",
    "aten.gt": "NaN > x is true",
    "aten.ge": "NaN >= x is true",
    "aten.logical_not": "logical_not(NaN) is true",
    "aten.all": "all() of NaN is false",
    "aten.sign": "sign(NaN) is NaN (eager: 0)",
    "aten.sort": "NaN sorts elsewhere",
    "aten.div.Tensor_mode": "rounded division of NaN differs",
}


def _to_bool(node) -> Optional[str]:
    # bool(NaN) is false on OpenVINO; eager (and C) says true
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and val.dtype == torch.bool and reads_floating(node):
        return ("a float -> bool conversion: bool(NaN) is false on openvino (eager: true); "
                "refused while the backend option exact_nonfinite is true")
    return None


_NONFINITE_CHECKS = {**nonfinite_validators(_NONFINITE, "openvino"), "aten._to_copy": _to_bool}


@register_backend
class OpenVino(ExactNonfinite, Backend):
    name = "openvino"
    color = "#b07aa1"  # fixed in every report (arbiter/report/html.py)
    Options = OvOptions
    install_hint = "pip install 'torch-arbiter[openvino]'"
    own_validators = VALIDATORS
    nonfinite_checks = _NONFINITE_CHECKS
    # The CPU plugin holds every integer in 32 bits, inputs included: cat, where, add,
    # mul, sum, cumsum and comparisons of int64 values past +-2**31 come back wrong
    # (arbiter probe openvino --edges). Positions into a tensor (gather's index, topk's
    # indices, a loss's class target: ``ops.value_dtypes``) are far smaller, as are an
    # embedding's indices into its table.
    narrow_dtypes = {torch.int64: "openvino's CPU plugin computes int64 in 32 bits "
                                  "(wrong past +-2**31)"}
    # (per-channel quantization's int64 zero points lie within its int8/uint8 range)
    narrow_dtype_ops = frozenset({"aten.embedding.default", "aten._embedding_bag.default",
                                  "aten._embedding_bag_forward_only.default",
                                  "quantized_decomposed.quantize_per_channel.default",
                                  "quantized_decomposed.dequantize_per_channel.default"})

    def available(self) -> tuple[bool, str]:
        try:
            import openvino
        except ImportError as exc:
            return False, f"{exc.name or exc} is not installed"
        devices = openvino.Core().available_devices
        if self.options.device not in devices:
            return False, (f"OpenVINO device {self.options.device!r} is not available "
                           f"(has {', '.join(devices)})")
        return True, ""

    def precision_variants(self) -> dict:
        """The inference precision hints below f32 that the device computes natively
        (``OPTIMIZATION_CAPABILITIES``: BF16 on CPUs with AVX512-BF16 or AMX, FP16 on
        those with AMX-FP16); none when the config already lowers the precision."""
        if self.options.precision != "f32":
            return {}
        try:
            import openvino as ov

            caps = set(ov.Core().get_property(self.options.device.split(":")[0],
                                              "OPTIMIZATION_CAPABILITIES"))
        except Exception:  # noqa: BLE001 - a device that cannot say offers nothing
            return {}
        return {label: {"precision": label}
                for label, cap in (("bf16", "BF16"), ("f16", "FP16")) if cap in caps}

    def version(self) -> str:
        import openvino

        return f"openvino {openvino.__version__}"

    def compile(self, gm: torch.fx.GraphModule, example_inputs):
        # under exact_nonfinite guard, NaN made inside the partition is checked too; a
        # value returned twice (x and detach(x): training forwards) is returned once
        return self.with_taps(gm, lambda g: distinct_outputs(
            g, lambda h: self._compile(h, example_inputs)))

    def _compile(self, gm: torch.fx.GraphModule, example_inputs):
        import openvino as ov

        dynamic = graph_is_symbolic(gm)
        args = check_inputs(example_inputs, _TORCH_TO_OV, ints=dynamic)
        model = convert(gm, args, _TORCH_TO_OV, dynamic=dynamic)
        core = ov.Core()
        passthrough = _passthrough_outputs(model)
        compiled = core.compile_model(model, self.options.device,
                                      properties_for(model, self.properties()))
        runner = OvRunner(compiled, args, outputs_of(gm), passthrough,
                          input_values(gm) if dynamic else None)
        runner.model = model  # what save_artifact writes
        return runner

    # -- saved programs (docs/deploy.md; backends/_openvino_artifact.py) --------------
    def save_artifact(self, compiled, gm: torch.fx.GraphModule):
        """The converted model as OpenVINO IR (``model.xml``, ``model.bin``)."""
        from ._openvino_artifact import save

        return save(compiled) if isinstance(compiled, OvRunner) else None

    def load_artifact(self, entry: dict, files: dict, gm: torch.fx.GraphModule):
        """The saved IR read from memory and compiled with this config's options."""
        from ._openvino_artifact import load

        return load(self, entry, files, gm, OvRunner, _passthrough_outputs)

    _budget_threads = None  # set by configure_resources, process-wide

    def configure_resources(self, budget) -> dict:
        """The budget's threads become INFERENCE_NUM_THREADS of every compiled model
        (a property of each compile_model; the option num_threads overrides it)."""
        if not budget.coordinate:
            return {"coordinated": False, "threads": "OpenVINO's default"}
        type(self)._budget_threads = budget.threads
        threads = self.options.num_threads if self.options.num_threads is not None \
            else budget.threads
        return {"coordinated": True, "INFERENCE_NUM_THREADS": threads}

    def properties(self) -> dict:
        """The compile_model properties the options stand for."""
        o = self.options
        props = {"INFERENCE_PRECISION_HINT": _PRECISIONS[o.precision],
                 "PERFORMANCE_HINT": o.performance_hint}
        if o.num_threads is not None:
            props["INFERENCE_NUM_THREADS"] = o.num_threads
        elif self._budget_threads is not None:  # arbiter.run.resources' budget
            props["INFERENCE_NUM_THREADS"] = self._budget_threads
        if o.cache_dir is not None:
            props["CACHE_DIR"] = o.cache_dir
        return props

    @classmethod
    def declared_ops(cls):
        """Ops in OpenVINO's own torch.compile op-support table
        (``openvino.frontend.pytorch.torchdynamo.op_support``): ATen's, and PT2E's
        quantize/dequantize (its frontend makes them FakeQuantize)."""
        from openvino.frontend.pytorch.torchdynamo.op_support import OperatorSupport

        out = {}
        for key in OperatorSupport(None)._support_dict:
            if not key.startswith("torch.ops."):
                continue
            namespace, _, rest = key[len("torch.ops."):].partition(".")
            base, _, overload = rest.partition(".")
            for op in declared_overloads(namespace, base, overload, every=True):
                out[op] = {}
        return out


def _passthrough_outputs(model) -> dict[int, int]:
    """output index -> input index, for outputs that are a model input as it is.

    The CPU plugin does not write such an output into a buffer bound with
    ``set_output_tensor``: the buffer keeps whatever it held (found by ``arbiter probe``:
    ``clone`` and ``alias_copy`` returned uninitialized memory, errors up to 1.7e22).
    The runner copies the input in torch instead. Reshapes of an input are not affected:
    they are a node of their own."""
    by_node = {p.get_friendly_name(): i for i, p in enumerate(model.get_parameters())}
    found = {}
    for k, out in enumerate(model.outputs):
        src = out.get_node().input_value(0).get_node()
        if src.get_type_name() == "Parameter":
            found[k] = by_node[src.get_friendly_name()]
    return found


class OvRunner(Runner):
    """Runs one compiled model: inputs and outputs share memory with torch tensors.
    Int inputs (a symbolic partition's sizes) are fed as int64 scalars."""

    def __init__(self, compiled, example_args: tuple, out_vals: list,
                 passthrough: Optional[dict[int, int]] = None, in_vals: Optional[list] = None):
        n_in = len(compiled.inputs)
        if n_in != len(example_args):
            raise RuntimeError(f"converted model has {n_in} inputs, partition has "
                               f"{len(example_args)}")
        super().__init__(out_vals, _TORCH_TO_OV, len(compiled.outputs), in_vals)
        for i, (shape, _) in enumerate(self.out_specs):
            if shape is None:
                continue  # symbolic: computed per call
            ov_shape = tuple(compiled.outputs[i].get_partial_shape().to_shape())
            if ov_shape != shape:
                raise RuntimeError(f"output {i}: OpenVINO gives shape {ov_shape}, the "
                                   f"partition {shape}")
        self.compiled = compiled
        self.passthrough = dict(passthrough or {})  # output -> input it is (copied in torch)

    def new_handle(self):
        return self.compiled.create_infer_request()

    def __call__(self, *args: torch.Tensor):
        import numpy as np
        import openvino as ov

        req = self.handle()
        keep = []  # contiguous copies live until the request is done
        for i, t in enumerate(args):
            if isinstance(t, torch.Tensor):
                t = self.contiguous(t)
                keep.append(t)
                req.set_input_tensor(i, ov.Tensor(_as_numpy(t), shared_memory=True))
            else:
                req.set_input_tensor(i, ov.Tensor(np.array(t, dtype=np.int64)))
        outs = []
        shapes = self.output_shapes(args)
        for i, (shape, (_, dtype)) in enumerate(zip(shapes, self.out_specs)):
            j = self.passthrough.get(i)
            if j is not None:
                outs.append(args[j].clone())  # the plugin would leave a bound buffer unwritten
                continue
            if shape is None:  # a size that depends on data: the plugin allocates it
                outs.append(None)
                continue
            o = torch.empty(shape, dtype=dtype)
            req.set_output_tensor(i, ov.Tensor(_as_numpy(o), shared_memory=True))
            outs.append(o)
        req.infer()
        if any(o is None for o in outs):
            outs = [torch.from_numpy(req.get_output_tensor(k).data.copy()) if o is None else o
                    for k, o in enumerate(outs)]
        return outs


def _as_numpy(t: torch.Tensor):
    return t.detach().numpy()  # a view of the tensor's memory, not a copy
