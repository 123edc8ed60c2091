"""ONNX Runtime (CPU execution provider by default).

A partition is translated to ONNX by PyTorch's own exporter, with the few translations
and refusals of ``backends/_onnx_export.py`` where onnxscript's ATen library differs from
eager. Weights baked into the partition become ONNX initializers, which ONNX Runtime
folds and prepacks. Tensors cross without copies: inputs are bound by pointer with
IOBinding (made contiguous first: a non-contiguous tensor's pointer silently gives wrong
results) and outputs are written straight into tensors torch allocated
(``OrtRunner``, backends/_ort_runner.py). A partition with symbolic shapes is exported
once with symbolic ONNX dimensions (``backends/_export.py``): one session serves every
size; output shapes are computed per call, and an output whose size depends on data is
allocated by ONNX Runtime and handed over.
"""
from __future__ import annotations

import logging
from typing import Literal, Optional, Union

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

from arbiter.backend import Backend, thread_option
from arbiter.cache import served
from arbiter.errors import require_known
from arbiter.ops import nonfinite_validators, op_name
from arbiter.registry import register_backend
from arbiter.shapes import graph_is_symbolic, input_values

from ._edge_values import POWS, SUMS, integer_pow, integer_reduction
from ._export import check_inputs, outputs_of, range_key
from ._nonfinite import ExactNonfinite
from ._onnx_constants import inline_constants, resolve, session_initializers
from ._onnx_export import EXPORT_REVISION, EXPORT_VALIDATORS, declared_ops, export_onnx
from ._onnx_shared import shared_initializers, strip_shared
from ._ort_precision import NO_CONSTANT_WEIGHTS, to_fp16, to_int8, variant_support
from ._ort_runner import NP_NAMES, OrtRunner

log = logging.getLogger(__name__)

#: What configure_resources set for the whole process: "session_threads" (each session's
#: pool), "env_arena" (sessions use the shared arena).
_PROCESS: dict = {}


class OrtOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = Field(
        "all", description="ONNX Runtime graph optimizations")
    intra_op_num_threads: Optional[StrictInt] = Field(
        None, ge=0, description="threads per session; None: ONNX Runtime's default; at "
        "most the CPUs this process may run on (more is reduced, with a warning)")
    providers: list[str] = Field(default_factory=lambda: ["CPUExecutionProvider"],
                                 description="execution providers, in order: names "
                                 "onnxruntime knows (`onnxruntime.get_all_providers()`; "
                                 "another is a config error); one missing from this build "
                                 "makes the backend unavailable")

    _bounded = thread_option("intra_op_num_threads", "onnxruntime intra_op_num_threads")

    @field_validator("providers")
    @classmethod
    def _known_providers(cls, v: list[str]) -> list[str]:
        try:
            import onnxruntime
        except ImportError:  # the backend is unavailable anyway, and says why
            return v
        require_known("execution provider", v, onnxruntime.get_all_providers())
        return v
    optimize_export: bool = Field(True, description="run onnxscript's optimizer on export")
    exact_nonfinite: Union[StrictBool, Literal["guard"]] = Field(
        True, description="ops whose results differ from eager when an input holds NaN "
        "(measured by `arbiter probe`: sign(NaN) is NaN, clamp_min(NaN, x) is x, "
        "heaviside(NaN, y) is 1...). true: refused; `guard`: taken, and a partition holding "
        "one checks its floating inputs on every call, and the values made inside it by "
        "ops that can make NaN or inf of finite numbers when those ops feed one, and runs "
        "a call with NaN or inf there in eager; false: taken, unchecked")
    allow_spinning: bool = Field(
        False, description="let ONNX Runtime's worker threads spin between a run's ops "
        "(they stop when the run returns: `session.force_spinning_stop`). Off by "
        "default: spinning pools steal the cores torch needs for the partitions between")
    precision: Literal["fp32", "fp16", "int8"] = Field(
        "fp32", description="what the exported model computes in. fp32 (default): the "
        "graph's own dtypes, eager-equal. fp16: the model converted to float16, inputs and "
        "outputs kept float32, ops the providers have no float16 kernel for kept float32 "
        "(onnxruntime.transformers.float16). int8: dynamic quantization of MatMul/Gemm "
        "weights to int8 (onnxruntime.quantization.quantize_dynamic); needs frozen "
        "weights (ONNX initializers), else the compile refuses. Neither is eager-equal: "
        "they are offered as lower-precision variants under `accuracy:` "
        "(docs/precision.md), where they are verified against float32 eager")
    variants: Optional[list[Literal["fp16", "int8"]]] = Field(
        None, description="the lower-precision variants offered under `accuracy:`. None: "
        "those the providers compute natively (int8 where they have MatMulInteger; fp16 "
        "only where they have a float16 MatMul or Gemm kernel: not ONNX Runtime's x86 CPU "
        "provider, where float16 runs float32 kernels between casts: 1.03x float32 on "
        "BERT-base, 0.6x on a small transformer layer); a list: those, where this onnxruntime can build them")
    int8_per_channel: bool = Field(
        True, description="int8: one quantization scale per output channel of each "
        "weight (quantize_dynamic's per_channel) rather than one per tensor")


#: What ONNX Runtime's own kernels compute unlike eager at edge values (issue 25;
#: docs/robustness.md "Edge values"), on top of what the export gets wrong
#: (backends/_onnx_export.py, shared with TensorRT).
_RUNTIME_VALIDATORS = {
    **{name: integer_pow("ONNX Runtime computes it through float64 (3**39 is off by 11; "
                         "past the dtype's range it saturates)") for name in POWS},
    **{name: integer_reduction("ONNX Runtime reduces integers through float64 (2**53 + 1 "
                               "sums to 2**53; past int32's range it saturates)")
       for name in SUMS}}
_VALIDATORS = {**EXPORT_VALIDATORS, **_RUNTIME_VALIDATORS}

#: Ops whose results differ from eager when an input holds NaN (onnxruntime 1.32, CPU
#: provider, float32; `arbiter probe onnxruntime --dtypes float32`, 2026-11-23). Refused
#: on floating inputs while `exact_nonfinite` is true (under `guard` taken, inputs checked
#: per call). Differences that need +-inf, -0.0 or huge inputs (gelu(inf) is inf where
#: eager says NaN, group norm, upsampling and fft with inf, signbit(-0.0), logaddexp2 and
#: hardswish of huge values) are reported by the probe, not refused (docs/robustness.md).
_NONFINITE = {
    "aten.sign": "sign(NaN) is NaN (eager: 0)",
    "aten.clamp_min.Tensor": "clamp_min(NaN, x) is x",
    "aten.clamp_max.Tensor": "clamp_max(NaN, x) is x",
    "aten.heaviside": "heaviside(NaN, y) is 1 (eager: 0)",
    "aten.atan2": "atan2 with NaN is 0",
    "aten.angle": "angle(NaN) is 0",
    "aten.grid_sampler_2d": "grid_sample with NaN differs",
}
_NONFINITE_CHECKS = nonfinite_validators(_NONFINITE, "onnxruntime")


@register_backend
class OnnxRuntime(ExactNonfinite, Backend):
    name = "onnxruntime"
    color = "#4e79a7"  # fixed in every report (arbiter/report/html.py)
    Options = OrtOptions
    install_hint = "pip install 'torch-arbiter[onnxruntime]'"
    own_validators = _VALIDATORS
    nonfinite_checks = _NONFINITE_CHECKS

    def available(self) -> tuple[bool, str]:
        # the exporter's packages are looked for, not imported: onnxscript's import
        # alone is ~0.4 s of every process whose graphs never export (they run elsewhere)
        from importlib.util import find_spec

        for package in ("onnx", "onnxscript"):
            if find_spec(package) is None:
                return False, f"{package} is not installed"
        try:
            import onnxruntime
        except ImportError as exc:
            return False, f"{exc.name or exc} is not installed"
        missing = [p for p in self.options.providers
                   if p not in onnxruntime.get_available_providers()]
        if missing:
            return False, (f"execution provider(s) {', '.join(missing)} not in this "
                           f"onnxruntime build (has {', '.join(onnxruntime.get_available_providers())})")
        return True, ""

    def precision_variants(self) -> dict:
        """``fp16`` and ``int8`` (option ``precision``) where this onnxruntime builds them
        and, unless the option ``variants`` lists them, where the providers compute them
        natively (``_ort_precision.variant_support``); none when the config's precision is not fp32."""
        if self.options.precision != "fp32":
            return {}
        offered = {}
        for label in ("fp16", "int8"):
            if self.options.variants is not None and label not in self.options.variants:
                continue
            why = variant_support(label, self.options.providers,
                                   native=self.options.variants is None)
            if why:
                if self.options.variants is not None:
                    log.warning("onnxruntime: variant %s is not offered: %s", label, why)
                else:
                    log.info("onnxruntime: variant %s is not offered: %s", label, why)
                continue
            offered[label] = {"precision": label}
        return offered

    def version(self) -> str:
        import onnxruntime

        return f"onnxruntime {onnxruntime.__version__}, onnxscript {_dist_version('onnxscript')}"

    def loadable(self) -> tuple[bool, str]:
        """A saved ONNX model needs onnxruntime and the providers, not the exporter."""
        try:
            import onnxruntime
        except ImportError as exc:
            return False, f"{exc.name or exc} is not installed"
        missing = [p for p in self.options.providers
                   if p not in onnxruntime.get_available_providers()]
        if missing:
            return False, (f"execution provider(s) {', '.join(missing)} not in this "
                           f"onnxruntime build")
        return True, ""

    def cache_parts(self) -> dict:
        # a model exported before a change of the export's own translations is not reused
        return {**super().cache_parts(), "export": EXPORT_REVISION}

    def compile(self, gm: torch.fx.GraphModule, example_inputs):
        # under exact_nonfinite guard, NaN made inside the partition is checked too
        return self.with_taps(gm, lambda g: self._compile(g, example_inputs))

    def _compile(self, gm: torch.fx.GraphModule, example_inputs):
        # Export with the inputs' real strides (a `view` in the graph may rely on them);
        # ONNX has no strides, and at run time inputs are bound contiguous.
        dynamic = graph_is_symbolic(gm)
        args = check_inputs(example_inputs, NP_NAMES, ints=dynamic)
        # The export is the slow step (seconds on a transformer): its ONNX bytes are what
        # the persistent cache keeps; session creation from bytes is cheap. A symbolic
        # artifact's key also holds the symbols' ranges.
        key_inputs = [range_key(gm)] if dynamic else list(args)
        kind = "onnx-dynamic" if dynamic else "onnx"

        def export() -> bytes:
            # the weights stay the graph's: the model (and the cache entry) refers to them
            return export_onnx(gm, args, optimize=self.options.optimize_export,
                               dynamic=dynamic, by_reference=True).SerializeToString()

        precision = self.options.precision
        if precision == "int8" and not any(n.op == "get_attr" for n in gm.graph.nodes):
            raise RuntimeError(NO_CONSTANT_WEIGHTS.format(what="partition has no constants"))
        found: dict = {}
        if precision == "fp32":
            model_bytes = self.cached_artifact(gm, key_inputs, export, kind=kind)
            found = resolve(model_bytes, gm)
        else:
            # the float32 export is the float32 backend's own artifact (same key: shared
            # through the cache); the lowered model is this variant's (its key holds the
            # options, so a float32 compile is never served a lowered model)
            f32 = self._float32()

            def lowered() -> bytes:
                # A piece evicts the entries its compile was served when its result fails
                # to verify; a lowered model outside the tolerance says nothing against
                # the float32 export, so that one is looked up outside the piece's record
                with served():
                    source = f32.cached_artifact(gm, key_inputs, export, kind=kind)
                return lower_precision(inline_constants(source, resolve(source, gm)),
                                       self.options)

            model_bytes = self.cached_artifact(gm, key_inputs, lowered,
                                               kind=f"{kind}-{precision}")
        disabled = _unsound_optimizers(gm)
        sess = self.make_session(model_bytes, disabled_optimizers=disabled,
                                 initializers=session_initializers(found))
        runner = OrtRunner(sess, [i.name for i in sess.get_inputs()],
                           [o.name for o in sess.get_outputs()], args, outputs_of(gm),
                           input_values(gm) if dynamic else None)
        runner.model_bytes = model_bytes  # what save_artifact writes, with:
        runner.constants = found  # the weights it refers to, alive with the session
        runner.disabled_optimizers = disabled
        return runner

    # -- saved programs (docs/deploy.md) ----------------------------------------------
    def save_artifact(self, compiled, gm: torch.fx.GraphModule, shared=None):
        """The ONNX model the session was made from (``model.onnx``), and the graph
        optimizers left out for it. Initializers equal to a weight the program holds
        (``shared``: arbiter/deploy/shared.py) are saved as references to it, not again."""
        model_bytes = getattr(compiled, "model_bytes", None)
        if not isinstance(compiled, OrtRunner) or model_bytes is None:
            return None
        model_bytes = inline_constants(model_bytes, getattr(compiled, "constants", {}))
        refs: dict[str, str] = {}
        if shared is not None:
            model_bytes, refs = strip_shared(model_bytes, shared)
        entry = {"format": "onnx", "precision": self.options.precision,
                 "disabled_optimizers": list(compiled.disabled_optimizers)}
        if refs:
            entry["shared_initializers"] = refs
        return entry, {"model.onnx": model_bytes}

    def load_artifact(self, entry: dict, files: dict, gm: torch.fx.GraphModule, shared=None):
        """An ONNX Runtime session (this config's options, threads and arena) on the saved
        ONNX model, its shared initializers given from the program's weights, bound like a
        compiled one."""
        if entry.get("format") != "onnx" or "model.onnx" not in files:
            raise ValueError(f"not an ONNX Runtime artifact: {sorted(entry)}")
        dynamic = graph_is_symbolic(gm)
        values = input_values(gm)
        args = tuple(torch.empty(0, dtype=v.dtype) if isinstance(v, torch.Tensor) else 0
                     for v in values)
        disabled = tuple(str(x) for x in entry.get("disabled_optimizers", ()))
        sess = self.make_session(files["model.onnx"], disabled_optimizers=disabled,
                                 initializers=shared_initializers(
                                     entry.get("shared_initializers"), shared))
        return OrtRunner(sess, [i.name for i in sess.get_inputs()],
                         [o.name for o in sess.get_outputs()], args, outputs_of(gm),
                         values if dynamic else None)

    def _float32(self) -> "OnnxRuntime":
        """This backend at fp32, named and cached as the config's own (its export)."""
        f32 = type(self)(self.options.model_copy(update={"precision": "fp32"}))
        f32.name = self.base_name or type(self).name
        f32.artifact_cache = self.artifact_cache
        return f32

    # -- threads, spinning, arena (arbiter/run/resources.py; docs/resources.md) ------------
    def configure_resources(self, budget) -> dict:
        """Threads, spinning and one arena for the sessions arbiter makes, and none for
        anyone else's.

        Every session gets its own pool of the budget's threads (ONNX Runtime's global
        pool is never set: once it exists, every session in the process must use it,
        and a plain ``InferenceSession`` of the user's, or of another library, fails
        with "use_per_session_threads must be false when using a global thread pool").
        Its workers spin after a run only when this config gives ONNX Runtime the spin
        (``resources: {spin: ...}``; ``auto``: the config's first backend, unless its
        first graph trains): ``session.intra_op.allow_spinning``, which per-session pools
        honour (0.1 ms of CPU after a run with it off, docs/resources.md), so the spin is
        each Arbiter's own (``use_budget``) and a second config never conflicts with the
        first over it. The arena is registered once, before the first session, and used
        only by sessions that ask for it (``session.use_env_allocators``).
        """
        if not budget.coordinate:
            return {"coordinated": False, "pool": "per session (ONNX Runtime's defaults)",
                    "allow_spinning": self.options.allow_spinning, "arena": "per session"}
        import onnxruntime as ort

        settings: dict = {"coordinated": True}
        if "intra_op_num_threads" in self.options.model_fields_set:
            settings["pool"] = (f"per session, {self.options.intra_op_num_threads} "
                                "threads (backend option intra_op_num_threads)")
            settings["allow_spinning"] = self.options.allow_spinning
        else:
            _PROCESS["session_threads"] = budget.threads
            settings["pool"] = (f"per session, {budget.threads} thread(s); spinning where "
                                "the config gives onnxruntime the spin, within each run "
                                "(stopped when it returns)")
        if budget.shared_arena:
            mem = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                    ort.OrtMemType.DEFAULT)
            # OrtArenaCfg(max_mem, arena_extend_strategy, initial_chunk_size_bytes,
            # max_dead_bytes_per_chunk): -1 and 0 mean ORT's defaults.
            ort.create_and_register_allocator(mem, ort.OrtArenaCfg(0, -1, -1, -1))
            _PROCESS["env_arena"] = True
            settings["arena"] = "one, shared by arbiter's sessions (CPU)"
        else:
            settings["arena"] = "per session"
        return settings

    def _spins(self) -> bool:
        """Whether this instance's sessions may spin: the option when its threads are
        set explicitly, else whether its config's budget gives it the spin."""
        if "intra_op_num_threads" in self.options.model_fields_set or self.budget is None:
            return self.options.allow_spinning
        return self.budget.coordinate and self.budget.may_spin(self.base_name or self.name) \
            and self.budget.threads > 1

    def make_session(self, model_bytes: bytes, disabled_optimizers: tuple[str, ...] = (),
                     initializers: tuple[list[str], list] = ([], [])):
        """An InferenceSession with the options and the process's pool and arena, without
        the graph optimizers named (``_unsound_optimizers``); ``initializers``: (names,
        OrtValues) for the model's external-data initializers (``_onnx_shared``)."""
        import onnxruntime as ort

        so = ort.SessionOptions()
        # fatal only: a failed run raises, and its message (node, status) reaches the
        # report and the fallback's log line; logged as well, it printed a red error on
        # the user's stderr for every check arbiter expects may fail (a symbolic
        # artifact tried at a second shape whose symbols the model needs equal)
        so.log_severity_level = 4
        so.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[self.options.graph_optimization_level]
        if self.options.intra_op_num_threads is not None:
            so.intra_op_num_threads = self.options.intra_op_num_threads
        elif "session_threads" in _PROCESS:
            so.intra_op_num_threads = _PROCESS["session_threads"]
        spins = self._spins()
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spins else "0")
        if spins:
            # the workers spin between the run's ops, and stop when the run returns:
            # left spinning, they held the cores for 20-50 ms after it, so what ran next
            # (another backend's partition, eager ops, the user's own code, a candidate
            # being timed) was slower: OpenVINO 52 against 39 ms, eager 74 against 50 ms
            # on DistilBERT, and policy `measure` ranked ONNX Runtime first on models
            # OpenVINO runs 10% faster (docs/resources.md)
            so.add_session_config_entry("session.force_spinning_stop", "1")
        if _PROCESS.get("env_arena"):
            so.add_session_config_entry("session.use_env_allocators", "1")
        if initializers[0]:
            so.add_external_initializers(*initializers)
        return ort.InferenceSession(model_bytes, so, providers=list(self.options.providers),
                                    disabled_optimizers=list(disabled_optimizers))

    @classmethod
    def declared_ops(cls):
        """ATen ops PyTorch's ONNX exporter translates (onnxscript's torchlib)."""
        return declared_ops()


def _dist_version(name: str) -> str:
    """An installed distribution's version, read from its metadata (importing onnxscript
    to read ``__version__`` takes seconds; ``arbiter.load`` compares versions)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


#: ATen ops that export to a MatMul with a 1-D operand.
_VECTOR_MATMULS = {"aten.mv.default", "aten.addmv.default", "aten.dot.default",
                   "aten.vdot.default"}


def _unsound_optimizers(gm: torch.fx.GraphModule) -> tuple[str, ...]:
    """ONNX Runtime graph optimizers that compute this partition wrongly.

    ``MatmulTransposeFusion`` folds a Transpose into a MatMul whose other operand is 1-D
    and gets it wrong (onnxruntime 1.31.1 and 1.32.0: ``mv(A.t(), g)``, the gradient of
    ``mv``, off by up to 5 on values of order 1; found by the OpInfo gradient sweep,
    tests/test_onnxruntime.py). It is kept for every other graph (attention's Q @ K^T)."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and op_name(n.target) in _VECTOR_MATMULS:
            return ("MatmulTransposeFusion",)
        if n.op == "call_function" and op_name(n.target) in ("aten.matmul.default",):
            vals = [a.meta.get("val") for a in n.args if isinstance(a, torch.fx.Node)]
            if any(isinstance(v, torch.Tensor) and v.dim() == 1 for v in vals):
                return ("MatmulTransposeFusion",)
    return ()


# -- lower precision (docs/precision.md; backends/_ort_precision.py) ---------------
def lower_precision(model_bytes: bytes, options: OrtOptions) -> bytes:
    """A float32 ONNX model (bytes) at ``options.precision`` (fp16 or int8), inputs and
    outputs unchanged; RuntimeError when there is nothing to lower (int8 without constant
    MatMul/Gemm weights)."""
    import onnx

    model = onnx.ModelProto.FromString(model_bytes)
    if options.precision == "fp16":
        return to_fp16(model, options.providers).SerializeToString()
    if options.precision == "int8":
        return to_int8(model, options.int8_per_channel).SerializeToString()
    raise ValueError(f"precision {options.precision!r}: nothing to lower")
