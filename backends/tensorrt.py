"""TensorRT: an ATen partition -> ONNX -> a TensorRT engine, run on CUDA tensors.

Datacenter TensorRT (``import tensorrt``) or TensorRT for RTX (``import tensorrt_rtx``):
option ``package`` picks one (``auto``: ``tensorrt`` when installed). The partition is
exported as for ONNX Runtime (``_onnx_export.export_onnx``), parsed by ``OnnxParser``
and built by ``build_serialized_network`` into a strongly typed network (precision
follows the graph's dtypes; TF32 only with option ``tf32``; a build whose inputs or
outputs changed dtype, as float64's do, is refused). Building needs no GPU
(``build_only``: ``arbiter probe tensorrt --build-only``); running needs CUDA
(``available()`` says so, ``plannable()`` lets dry runs plan onto it): tensors bound by
address, ``execute_async_v3`` on torch's current stream, device memory from PyTorch's
caching allocator, one execution context per thread. Static shapes only. The GPU path has
not run an engine yet (TensorRT-RTX refused the H100 lent; the refusal is remembered per
GPU): docs/design.md ("TensorRT backend").
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field

from arbiter.backend import Backend
from arbiter.registry import register_backend

from ._export import Runner, check_inputs, outputs_of
from ._onnx_export import EXPORT_REVISION, EXPORT_VALIDATORS, declared_ops, export_onnx

log = logging.getLogger(__name__)

#: torch dtype -> TensorRT DataType name. No float64: TensorRT would run it as float32.
_TRT_NAMES = {
    torch.float32: "FLOAT", torch.float16: "HALF", torch.bfloat16: "BF16",
    torch.int64: "INT64", torch.int32: "INT32", torch.int8: "INT8", torch.uint8: "UINT8",
    torch.bool: "BOOL",
}
_TORCH_OF = {v: k for k, v in _TRT_NAMES.items()}
_PACKAGES = ("tensorrt", "tensorrt_rtx")
_MAGIC = b"ARBITER-TRT-1\n"


class TensorRTOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    package: Literal["auto", "tensorrt", "tensorrt_rtx"] = Field(
        "auto", description="which TensorRT to import: datacenter `tensorrt` or TensorRT "
        "for RTX `tensorrt_rtx`; auto: `tensorrt` when installed, else `tensorrt_rtx`")
    tf32: bool = Field(False, description="allow TF32 for float32 matmuls and "
                       "convolutions (faster, about 1e-3 relative error); off: float32")
    optimization_level: int = Field(3, ge=0, le=5, description="the builder's "
                                    "optimization level (0 fastest build, 5 slowest)")
    workspace_mib: Optional[int] = Field(None, ge=1, description="largest scratch memory "
                                         "a layer may use; None: TensorRT's default")
    compute_capability: Optional[str] = Field(
        None, description="TensorRT-RTX only: build for this GPU architecture (SM75, SM80, "
        "SM86, SM89, SM120) instead of the current GPU")
    optimize_export: bool = Field(True, description="run onnxscript's optimizer on export")


def _import(package: str):
    """The TensorRT module for option ``package`` (ImportError naming what to install)."""
    import importlib

    names = _PACKAGES if package == "auto" else (package,)
    errors = []
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise ImportError("no TensorRT package could be imported (" + "; ".join(errors) + ")")


# -- one logger per process ---------------------------------------------------------------
# TensorRT keeps the first logger a Builder, Runtime or parser is given and ignores later
# ones, and its stock logger prints to stdout. One logger per module forwards to `logging`
# and keeps the errors of the build in progress (builds are serialized by _BUILD_LOCK).
_LOGGERS: dict[str, Any] = {}
_BUILD_LOCK = threading.Lock()


def _logger(trt):
    found = _LOGGERS.get(trt.__name__)
    if found is not None:
        return found

    class _Log(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity, msg):
            if severity <= trt.ILogger.ERROR:
                self.errors.append(str(msg))
                log.info("%s: %s", trt.__name__, msg)
            elif severity <= trt.ILogger.WARNING:
                log.debug("%s: %s", trt.__name__, msg)

    _LOGGERS[trt.__name__] = made = _Log()
    return made


@dataclass
class Engine:
    """A serialized engine with what the runner needs to bind it."""

    plan: bytes
    inputs: list[str]                       # ONNX input names, in the partition's order
    outputs: list[str]                      # ONNX output names, in order
    layers: int = 0
    build_s: float = 0.0
    package: str = ""
    unused_inputs: list[str] = field(default_factory=list)

    def pack(self) -> bytes:
        """The engine as the bytes the persistent cache keeps (a header and the plan)."""
        header = json.dumps({"inputs": self.inputs, "outputs": self.outputs,
                             "layers": self.layers, "package": self.package}).encode()
        return _MAGIC + len(header).to_bytes(4, "little") + header + self.plan

    @classmethod
    def unpack(cls, blob: bytes) -> "Engine":
        if not blob.startswith(_MAGIC):
            raise ValueError("not a TensorRT engine written by arbiter")
        start = len(_MAGIC) + 4
        size = int.from_bytes(blob[len(_MAGIC):start], "little")
        header = json.loads(blob[start:start + size])
        return cls(blob[start + size:], header["inputs"], header["outputs"],
                   header.get("layers", 0), package=header.get("package", ""))


def build_engine(trt, model, in_dtypes: list, out_dtypes: list,
                 options: TensorRTOptions, threads: Optional[int] = None) -> Engine:
    """An ONNX model (``onnx.ModelProto``) -> a serialized engine; no GPU needed.

    ``in_dtypes``/``out_dtypes``: the partition's torch dtypes; a network whose inputs or
    outputs TensorRT typed otherwise (float64 read as float32) is refused. Raises
    RuntimeError with the parser's or builder's errors."""
    logger = _logger(trt)
    with _BUILD_LOCK:
        logger.errors.clear()
        start = time.perf_counter()
        builder = trt.Builder(logger)
        if threads:
            builder.max_threads = threads
        flags = 0
        strongly = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
        if strongly is not None:  # datacenter TensorRT: ask for it; RTX: always so
            flags = 1 << int(strongly)
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse(model.SerializeToString()):
            errs = []
            for i in range(parser.num_errors):
                e = parser.get_error(i)
                errs.append(f"[{e.node_operator() or '?'}] {e.code().name}: {e.desc()}"[:240])
            raise RuntimeError(f"{trt.__name__}'s ONNX parser refused the model: "
                               + "; ".join(errs or logger.errors[-3:] or ["no reason given"]))
        names = [i.name for i in model.graph.input]
        outs = [o.name for o in model.graph.output]
        _check_types(network, names, in_dtypes, outs, out_dtypes)
        config = configure(trt, builder.create_builder_config(), options)
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise RuntimeError(f"{trt.__name__}'s builder failed: "
                               + "; ".join(m[:240] for m in logger.errors[-3:] or
                                           ["no reason given"]))
        unused = [n for n in names if n not in
                  {network.get_input(i).name for i in range(network.num_inputs)}]
        return Engine(bytes(plan), names, outs, network.num_layers,
                      time.perf_counter() - start, trt.__name__, unused)


def configure(trt, config, options: TensorRTOptions):
    """The builder config for ``options``: TF32 off unless asked (TensorRT's default is on),
    the optimization level, the workspace limit, RTX's target architecture."""
    if hasattr(trt.BuilderFlag, "TF32"):
        (config.set_flag if options.tf32 else config.clear_flag)(trt.BuilderFlag.TF32)
    config.builder_optimization_level = options.optimization_level
    if options.workspace_mib is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_mib << 20)
    if options.compute_capability is not None:
        if not hasattr(trt, "ComputeCapability"):
            raise RuntimeError(f"option compute_capability needs TensorRT-RTX; "
                               f"{trt.__name__} builds for the current GPU")
        cc = getattr(trt.ComputeCapability, options.compute_capability.upper(), None)
        if cc is None:
            valid = [n for n in dir(trt.ComputeCapability) if n.startswith("SM")]
            raise RuntimeError(f"compute_capability {options.compute_capability!r} is "
                               f"not one of {', '.join(valid)}")
        config.num_compute_capabilities = 1
        config.set_compute_capability(cc, 0)
    return config


def _check_types(network, in_names, in_dtypes, out_names, out_dtypes) -> None:
    """Refuse a network whose inputs or outputs TensorRT typed otherwise than torch."""
    got = {}
    for i in range(network.num_inputs):
        t = network.get_input(i)
        got[t.name] = t.dtype.name
    for i in range(network.num_outputs):
        t = network.get_output(i)
        got[t.name] = t.dtype.name
    for kind, names, dtypes in (("input", in_names, in_dtypes), ("output", out_names, out_dtypes)):
        for name, dtype in zip(names, dtypes):
            if name in got and got[name] != _TRT_NAMES.get(dtype):
                raise RuntimeError(f"TensorRT typed {kind} {name!r} as {got[name]}, the "
                                   f"partition has {dtype} (results would differ)")


def _allocator(trt):
    """An ``IGpuAllocator`` handing out PyTorch's caching allocator's memory, so that
    TensorRT's scratch memory counts in torch's budget and is reused by it."""

    class TorchAllocator(trt.IGpuAllocator):
        def __init__(self):
            trt.IGpuAllocator.__init__(self)
            self.allocations = 0  # counted, for tests

        def allocate(self, size, alignment, flags):  # datacenter TensorRT's sync API
            return self.allocate_async(size, alignment, flags, None)

        def allocate_async(self, size, alignment, flags, stream):
            device = torch.cuda.current_device()
            self.allocations += 1
            ptr = torch.cuda.caching_allocator_alloc(
                size, device, stream if stream else torch.cuda.current_stream(device))
            if alignment and ptr % alignment:
                torch.cuda.caching_allocator_delete(ptr)
                return 0  # TensorRT reports the failed allocation
            return ptr

        def reallocate(self, address, alignment, new_size):
            return 0  # not supported: TensorRT then allocates anew

        def deallocate(self, memory):
            return self.deallocate_async(memory, None)

        def deallocate_async(self, memory, stream):
            torch.cuda.caching_allocator_delete(memory)
            return True

    return TorchAllocator()


@register_backend
class TensorRT(Backend):
    name = "tensorrt"
    Options = TensorRTOptions
    install_hint = ("pip install 'torch-arbiter[tensorrt-build]' (TensorRT for RTX; "
                    "or `pip install tensorrt` on a datacenter GPU)")
    # the same ONNX export as ONNX Runtime, so the same exporter defects (ONNX Runtime's
    # non-finite refusals are its runtime's, not TensorRT's: never probed here)
    validators = dict(EXPORT_VALIDATORS)
    _threads: Optional[int] = None
    _gpu_allocator: Any = None
    #: GPU (name and compute capability) -> why this TensorRT package cannot run engines on
    #: it (TensorRT-RTX refuses data-centre GPUs such as the H100, sm 9.0): learned from
    #: the first engine refused, so that no other partition builds one for nothing
    _gpu_refused: dict = {}

    def _trt(self):
        return _import(self.options.package)

    def plannable(self) -> tuple[bool, str]:
        try:
            self._trt()
            import onnxscript  # noqa: F401
        except ImportError as exc:
            return False, str(exc)
        return True, ""

    def available(self) -> tuple[bool, str]:
        ok, why = self.plannable()
        if not ok:
            return ok, why
        if not torch.cuda.is_available():
            trt = self._trt()
            return False, (f"no CUDA device (torch {torch.__version__}): {trt.__name__} "
                           f"{trt.__version__} builds engines here (dry runs, `arbiter probe "
                           f"tensorrt --build-only`) but runs them only on an NVIDIA GPU")
        refused = self._gpu_refused.get(_gpu_key())
        if refused:
            return False, refused
        return True, ""

    def version(self) -> str:
        import onnxscript

        trt = self._trt()
        return f"{trt.__name__} {trt.__version__}, onnxscript {onnxscript.__version__}"

    def cache_parts(self) -> dict:
        parts = {**super().cache_parts(), "export": EXPORT_REVISION}
        if torch.cuda.is_available():  # an engine is built for one GPU architecture
            i = torch.cuda.current_device()
            parts["device"] = f"{torch.cuda.get_device_name(i)} sm{torch.cuda.get_device_capability(i)}"
        return parts

    @classmethod
    def declared_ops(cls):
        """What PyTorch's ONNX exporter translates (the ONNX Runtime backend's list too); what
        TensorRT's parser and builder accept of it is for `arbiter probe --build-only`."""
        return declared_ops()

    def configure_resources(self, budget) -> dict:
        if not budget.coordinate:
            return {"coordinated": False}
        self._threads = budget.threads
        return {"coordinated": True, "builder_threads": budget.threads,
                "gpu_memory": "PyTorch's caching allocator (IGpuAllocator)"}

    def _build(self, gm, args) -> Engine:
        trt = self._trt()
        outs = outputs_of(gm)
        model = export_onnx(gm, args, optimize=self.options.optimize_export)
        return build_engine(trt, model, [a.dtype for a in args],
                            [o.dtype for o in outs if isinstance(o, torch.Tensor)],
                            self.options, self._threads)

    def build_only(self, gm, example_inputs) -> str:
        args = check_inputs(example_inputs, _TRT_NAMES)
        for i, v in enumerate(outputs_of(gm)):
            if not isinstance(v, torch.Tensor) or v.dtype not in _TRT_NAMES:
                raise TypeError(f"output {i}: {getattr(v, 'dtype', type(v).__name__)} is "
                                "not a dtype TensorRT runs")
        e = self._build(gm, args)
        return (f"{e.package}: {e.layers} layers, {len(e.plan)} bytes, built in "
                f"{e.build_s:.2f} s (not run)")

    def compile(self, gm, example_inputs):
        args = check_inputs(example_inputs, _TRT_NAMES)
        off = [i for i, a in enumerate(args) if a.device.type != "cuda"]
        if off:
            raise TypeError(f"TensorRT runs CUDA tensors; input {off[0]} is on "
                            f"{args[off[0]].device}")
        refused = self._gpu_refused.get(_gpu_key(args[0].device))
        if refused:
            raise RuntimeError(refused)
        blob = self.cached_artifact(gm, args, lambda: self._build(gm, args).pack(),
                                    kind="tensorrt-engine")
        trt = self._trt()
        if self._gpu_allocator is None:
            TensorRT._gpu_allocator = _allocator(trt)
        try:
            return TrtRunner(trt, Engine.unpack(blob), outputs_of(gm), args,
                             self._gpu_allocator)
        except RuntimeError as exc:
            if "cannot run on this GPU" in str(exc):
                key = _gpu_key(args[0].device)
                TensorRT._gpu_refused[key] = f"{trt.__name__} {trt.__version__} cannot run " \
                    f"engines on {key}: {exc}"
            raise


def _gpu_key(device: Any = None) -> str:
    i = torch.cuda.current_device() if device is None or device.index is None else device.index
    major, minor = torch.cuda.get_device_capability(i)
    return f"{torch.cuda.get_device_name(i)} (compute capability {major}.{minor})"


class TrtRunner(Runner):
    """Runs one engine on torch's current CUDA stream; inputs and outputs are bound by
    address (inputs made contiguous first, counted), one execution context per thread."""

    def __init__(self, trt, engine: Engine, out_vals: list, example_args: tuple, allocator):
        super().__init__(out_vals, _TRT_NAMES, len(engine.outputs))
        if len(engine.inputs) != len(example_args):
            raise RuntimeError(f"engine has {len(engine.inputs)} inputs, partition has "
                               f"{len(example_args)}")
        self.trt = trt
        logger = _logger(trt)
        logger.errors.clear()
        self.runtime = trt.Runtime(logger)
        self.runtime.gpu_allocator = allocator
        self.engine = self.runtime.deserialize_cuda_engine(engine.plan)
        if self.engine is None:
            raise RuntimeError(f"{trt.__name__} could not load the engine: "
                               + "; ".join(logger.errors[-2:] or ["no reason given"]))
        io = {self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)}
        # inputs the graph does not read are not engine tensors: they are not bound
        self.inputs = [(n, n in io) for n in engine.inputs]
        self.outputs = list(engine.outputs)
        for name, (_, dtype) in zip(self.outputs, self.out_specs):
            got = _TORCH_OF.get(self.engine.get_tensor_dtype(name).name)
            if got != dtype:
                raise RuntimeError(f"engine output {name!r} is {got}, partition wants {dtype}")

    def new_handle(self):
        if hasattr(self.engine, "create_runtime_config"):  # TensorRT-RTX
            ctx = self.engine.create_execution_context(self.engine.create_runtime_config())
        else:
            ctx = self.engine.create_execution_context()
        if ctx is None:
            raise RuntimeError("TensorRT could not create an execution context")
        return ctx

    def __call__(self, *args: torch.Tensor):
        ctx = self.handle()
        device = args[0].device if args else torch.device("cuda", torch.cuda.current_device())
        stream = torch.cuda.current_stream(device)
        keep = []  # contiguous copies live until the call returns; the stream orders them
        for (name, bound), t in zip(self.inputs, args):
            if not bound:
                continue
            t = self.contiguous(t)
            keep.append(t)
            ctx.set_input_shape(name, tuple(t.shape))
            ctx.set_tensor_address(name, t.data_ptr())
        outs = []
        for name, (shape, dtype) in zip(self.outputs, self.out_specs):
            o = torch.empty(shape, dtype=dtype, device=device)
            ctx.set_tensor_address(name, o.data_ptr())
            outs.append(o)
        if not ctx.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT's execute_async_v3 failed")
        return outs
