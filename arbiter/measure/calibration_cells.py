"""Measuring this machine's calibration (policy `calibrated`; plan/predict.py reads it).

Per backend, small ATen graphs, one op class each (``CELLS``, most telling first: the
per-call cost, linear layers from tiny to large, two on a single row (what reading
their weights costs), the other classes, a convolution), and
two whole blocks (``BLOCKS``: a transformer encoder layer, a ResNet bottleneck, whose
time over their op-by-op prediction is the backend's factor for that kind) are compiled
with the backend's own ``compile`` and timed: the minimum of a few samples of at least
``SAMPLE_S``, one backend after the other (``time_us`` says why not interleaved). Every
backend gets a cell before the next cell, so a budget that runs out leaves each with the
cells that decide most; what it left untried is tried the next time. A cell a backend
cannot take whole or fails to compile is refused: the static table prices that class
there. docs/policies.md ("`calibrated`") lists the cells and why each is there.
"""
from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import torch
import torch.fx

from .loadavg import load_per_core
from ..ops import is_getitem, register_namespaces
from ..plan.partition import partition_graph
from ..plan.predict import GEMV, BackendCalibration, op_work

log = logging.getLogger(__name__)

#: One timing sample lasts at least this long.
SAMPLE_S = 0.003
#: Samples per cell (the minimum is kept): at least SAMPLES, and up to MAX_SAMPLES until
#: each backend's two fastest are within STABLE of each other (a loaded machine).
SAMPLES = 5
MAX_SAMPLES = 15
STABLE = 0.05
#: A progress line on stderr once calibrating has taken this long.
PROGRESS_AFTER_S = 2.0


def _chain(x):
    for i in range(8):
        x = x * 1.0001 if i % 2 else x + 0.5
    return (x,)


def _linear(m: int, k: int, n: int):
    w, b = torch.randn(n, k) / k ** 0.5, torch.randn(n)
    return (lambda x: (torch.nn.functional.linear(x, w, b),)), (torch.randn(m, k),)


def _conv(c: int, hw: int):
    w, b = torch.randn(c, c, 3, 3) / (9 * c) ** 0.5, torch.randn(c)
    return ((lambda x: (torch.nn.functional.conv2d(x, w, b, padding=1),)),
            (torch.randn(1, c, hw, hw),))


def _quantized():
    """torch's quantize/dequantize ops (``quantized_decomposed``), registered first."""
    register_namespaces()
    return torch.ops.quantized_decomposed


def _int8_weight(w: torch.Tensor):
    """``w`` as PT2E keeps a weight: int8 codes, a scale and zero point per output channel."""
    scales = w.abs().flatten(1).amax(1) / 127.0
    shape = (-1, *[1] * (w.dim() - 1))
    codes = torch.round(w / scales.reshape(shape)).clamp(-128, 127).to(torch.int8)
    return codes, scales, torch.zeros(len(scales), dtype=torch.int64)


def _int8(op: Callable, w: torch.Tensor, b: torch.Tensor, x: torch.Tensor):
    """``op(x, w, b)`` as a model through PT2E's X86InductorQuantizer holds an inner layer:
    the input quantized to uint8 and dequantized, the int8 weight (a constant) dequantized
    per channel, the layer in float between, its output quantized again for the next
    layer (what each backend fuses into its int8 kernel: ONNX Runtime only with that
    last quantize, 1665 against 312 us for the linear here, Inductor 323 and 314)."""
    qd = _quantized()
    codes, scales, zps = _int8_weight(w)
    scale = float(x.abs().max()) / 127.5
    with torch.no_grad():
        out_scale = float(op(x, w, b).abs().max()) / 127.5

    def qdq(t, s):
        q = qd.quantize_per_tensor.default(t, s, 128, 0, 255, torch.uint8)
        return qd.dequantize_per_tensor.default(q, s, 128, 0, 255, torch.uint8)

    def f(x):
        wd = qd.dequantize_per_channel.default(codes, scales, zps, 0, -128, 127, torch.int8)
        return (qdq(op(qdq(x, scale), wd, b), out_scale),)
    return f, (x,)


def _attention():
    q, k, v = (torch.randn(1, 12, 128, 64) for _ in range(3))
    return (lambda q, k, v: (torch.nn.functional.scaled_dot_product_attention(q, k, v),),
            (q, k, v))


def _elementwise():
    def f(x):
        y = torch.nn.functional.gelu(x * 0.5 + 0.1)
        return ((torch.tanh(y) - x) * y + 1.0,)
    return f, (torch.randn(128, 3072),)


def _norm():
    w, b = torch.randn(768), torch.randn(768)
    return ((lambda x: (torch.nn.functional.layer_norm(x, (768,), w, b),)),
            (torch.randn(128, 768),))


def _reduction():
    return ((lambda x: (torch.softmax(x, -1), x.sum(-1))), (torch.randn(12, 128, 128),))


def _encoder_layer(seq: int = 128, d: int = 768, heads: int = 12):
    """A post-norm transformer encoder layer (BERT's), written out in torch ops."""
    def p(*shape):
        return torch.randn(*shape) / shape[-1] ** 0.5
    wqkv, bqkv, wo, bo = p(3 * d, d), p(3 * d), p(d, d), p(d)
    w1, b1, w2, b2 = p(4 * d, d), p(4 * d), p(d, 4 * d), p(d)
    g1, g2, z1, z2 = torch.ones(d), torch.ones(d), torch.zeros(d), torch.zeros(d)
    F = torch.nn.functional

    def f(x):
        q, k, v = F.linear(x, wqkv, bqkv).split(d, -1)
        q, k, v = (t.view(1, seq, heads, d // heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, seq, d)
        x = F.layer_norm(x + F.linear(a, wo, bo), (d,), g1, z1)
        h = F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
        return (F.layer_norm(x + h, (d,), g2, z2),)
    return f, (torch.randn(1, seq, d),)


def _bottleneck(c: int = 256, mid: int = 64, hw: int = 28):
    """A ResNet bottleneck (1x1, 3x3, 1x1 convolutions, each with batch norm in
    inference), as ResNet-50's layer 1 holds them."""
    def conv(co, ci, k):
        return torch.randn(co, ci, k, k) / (ci * k * k) ** 0.5
    ws = (conv(mid, c, 1), conv(mid, mid, 3), conv(c, mid, 1))
    stats = [(torch.randn(n).abs() + 0.5, torch.randn(n), torch.ones(n), torch.zeros(n))
             for n in (mid, mid, c)]
    F = torch.nn.functional

    def f(x):
        y = x
        for i, (w, (var, mean, g, b)) in enumerate(zip(ws, stats)):
            y = F.batch_norm(F.conv2d(y, w, padding=1 if i == 1 else 0), mean, var, g, b)
            y = F.relu(y) if i < 2 else F.relu(y + x)
        return (y,)
    return f, (torch.randn(1, c, hw, hw),)


#: Whole blocks (cell name -> kind of ``predict.KINDS``): timed after the op cells, their
#: time over the op-by-op prediction is the backend's factor for the kind.
BLOCKS = {"block: encoder layer 128x768": "matmul", "block: bottleneck 256ch 28x28": "conv"}

#: (cell name, op class, builder of (function, inputs)), most telling first.
CELLS: list[tuple[str, str, Callable[[], tuple[Callable, tuple]]]] = [
    ("call", "call", lambda: (_chain, (torch.randn(8),))),
    ("linear 8x64x64", "linear", lambda: _linear(8, 64, 64)),
    ("linear 16x256x256", "linear", lambda: _linear(16, 256, 256)),
    ("linear 128x768x768", "linear", lambda: _linear(128, 768, 768)),
    # one row through 256 KiB and 4 MiB of weights: what a linear layer costs to read
    # its operands (a decode step's layers), the floor of every linear's time
    # (predict.GEMV); two sizes, since a backend's fixed cost per product is not its
    # rate (Inductor, eager: ~25 us, then 38 GB/s; ONNX Runtime ~0, then 15 GB/s)
    ("gemv 1x256x256", "gemv", lambda: _linear(1, 256, 256)),
    ("gemv 1x1024x1024", "gemv", lambda: _linear(1, 1024, 1024)),
    ("conv 64ch 56x56", "conv", lambda: _conv(64, 56)),
    ("attention 12x128x64", "attention", _attention),
    ("elementwise 128x3072", "elementwise", _elementwise),
    ("layer_norm 128x768", "norm", _norm),
    ("softmax+sum 12x128x128", "reduction", _reduction),
    ("conv 16ch 28x28", "conv", lambda: _conv(16, 28)),
    # int8 layers as PT2E's convert_pt2e leaves them (a user's quantized model): a
    # backend's int8 kernel, or its float layer with the dequantizes before it
    ("int8 linear 128x768x768", "qlinear",
     lambda: _int8(torch.nn.functional.linear, torch.randn(768, 768) / 768 ** 0.5,
                   torch.randn(768), torch.randn(128, 768))),
    ("int8 conv 64ch 56x56", "qconv",
     lambda: _int8(lambda x, w, b: torch.nn.functional.conv2d(x, w, b, padding=1),
                   torch.randn(64, 64, 3, 3) / 24.0, torch.randn(64),
                   torch.randn(1, 64, 56, 56))),
    ("block: encoder layer 128x768", "block", _encoder_layer),
    ("block: bottleneck 256ch 28x28", "block", _bottleneck),
]


@dataclass
class Measured:
    """What one backend's calibration holds so far (the cache keeps it as JSON)."""

    times_us: dict[str, float]  # cell name -> microseconds per call
    work: dict[str, float]  # cell name -> its class's work (FLOPs or bytes)
    refused: dict[str, str]  # cell name -> why not measured
    seconds: float = 0.0  # spent measuring, compiles included
    load: Optional[float] = None  # load average per core when measuring began
    # block cell name -> its graph's nodes as (op class, work, work is FLOPs)
    nodes: dict[str, list] = field(default_factory=dict)
    taken: Optional[str] = None  # when (UTC, ISO seconds) measuring began

    def tried(self) -> set[str]:
        return set(self.times_us) | set(self.refused)

    def complete(self) -> bool:
        return self.tried() >= {name for name, _, _ in CELLS}

    def calibration(self, inline: bool) -> Optional[BackendCalibration]:
        """The prediction's view; None until the per-call cell is measured."""
        call = self.times_us.get("call")
        if call is None:
            return None
        # the chain is 8 tiny nodes: in place (eager) it is 8 dispatches, compiled one call
        call_us, node_us = (0.0, call / 8) if inline else (call, 0.0)
        cells: dict[str, list] = {}
        for name, cls, _ in CELLS:
            if cls in ("call", "block") or name not in self.times_us or \
                    not self.work.get(name):
                continue
            us = self.times_us[name] - call_us  # the call's own cost is not the class's
            cells.setdefault(cls, []).append((self.work[name], max(us, 1e-3)))
        ops = BackendCalibration(round(call_us, 3), round(node_us, 3),
                                 {k: tuple(sorted(v)) for k, v in cells.items()})
        factors = {}
        for name, kind in BLOCKS.items():
            parts = [ops.op_us(str(c), float(w), bool(f)) for c, w, f in self.nodes.get(name, [])]
            if name in self.times_us and parts and None not in parts:
                got = self.times_us[name] - call_us
                factors[kind] = round(min(FACTOR_RANGE[1], max(FACTOR_RANGE[0],
                                                               got / sum(parts))), 4)
        return replace(ops, factors=factors)

    def to_json(self) -> dict:
        return {"times_us": self.times_us, "work": self.work, "refused": self.refused,
                "seconds": round(self.seconds, 2), "load": self.load, "nodes": self.nodes,
                "taken": self.taken}

    @classmethod
    def from_json(cls, raw: Any) -> Optional["Measured"]:
        if not isinstance(raw, dict):
            return None
        try:
            return cls({str(k): float(v) for k, v in raw.get("times_us", {}).items()},
                       {str(k): float(v) for k, v in raw.get("work", {}).items()},
                       {str(k): str(v) for k, v in raw.get("refused", {}).items()},
                       float(raw.get("seconds", 0.0)),
                       None if raw.get("load") is None else float(raw["load"]),
                       {str(k): [[str(c), float(w), bool(f)] for c, w, f in v]
                        for k, v in (raw.get("nodes") or {}).items() if k in BLOCKS},
                       None if raw.get("taken") is None else str(raw["taken"])[:40])
        except (TypeError, ValueError, AttributeError):
            return None


#: A block's factor is kept within this range (a wild one is a broken measurement).
FACTOR_RANGE = (0.1, 10.0)


def block_nodes(gm: torch.fx.GraphModule) -> list:
    """A block cell's compute nodes as [op class, work, work is FLOPs] (what the op-by-op
    prediction of the block needs, kept with its time)."""
    works = (op_work(n) for n in gm.graph.nodes
             if n.op == "call_function" and not is_getitem(n))
    return [[cls, flops if flops else moved, bool(flops)] for cls, flops, moved in works]


def cell_work(gm: torch.fx.GraphModule, cls: str) -> float:
    """The work of the class's nodes in a cell's graph (FLOPs, else bytes moved; for
    ``gemv``, the bytes of its linear nodes' operands)."""
    works = (op_work(n) for n in gm.graph.nodes if n.op == "call_function")
    if cls == GEMV:
        return sum((moved for c, _, moved in works if c == "linear"), 0.0)
    return sum((flops if flops else moved for c, flops, moved in works if c == cls), 0.0)


#: A calibration begun above this load average per core is said to be noisy.
LOADED = 1.5


def calls_per_sample(fn: Callable, args: tuple) -> int:
    """How many calls of ``fn`` one sample takes (at least SAMPLE_S); warms it up."""
    fn(*args)
    n, t = 1, 0.0
    while t < SAMPLE_S:
        n *= 2
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*args)
        t = time.perf_counter() - t0
    return n


def time_us(fns: dict[str, Callable], args: tuple) -> dict[str, float]:
    """Microseconds per call of each of ``fns``, one backend after the other: SAMPLES
    samples, then more up to MAX_SAMPLES while its two fastest differ by more than STABLE;
    the minimum kept (on a shared machine noise only adds). Not interleaved: a backend
    whose thread pool was just left spinning by another's call ran its small cells up to
    50x slower (eager's 16x256x256 linear: 4980 us interleaved with ONNX Runtime and
    OpenVINO, 97 us on its own), which is not what a model on one backend sees."""
    out = {}
    for k, f in fns.items():
        n = calls_per_sample(f, args)  # also its warm-up after the previous backend
        samples: list[float] = []
        while len(samples) < MAX_SAMPLES and (len(samples) < SAMPLES or not _stable(samples)):
            t0 = time.perf_counter()
            for _ in range(n):
                f(*args)
            samples.append((time.perf_counter() - t0) / n * 1e6)
        out[k] = min(samples)
    return out


def _stable(xs: list[float]) -> bool:
    a, b = sorted(xs)[:2]
    return b <= a * (1 + STABLE)


class Calibrator:
    """Measures cells for some backends within a time budget, with progress on stderr.

    ``planner``: the config's (its backends with their options; ``table_for`` and
    ``plan`` say whether a backend takes a cell's graph whole). ``progress``: print a line
    on stderr once past PROGRESS_AFTER_S."""

    def __init__(self, planner: Any, budget_s: Optional[float], progress: bool = True):
        self._planner = planner
        self._budget_s = budget_s
        self._progress = progress
        self._start = time.perf_counter()
        self._shown_at = 0.0

    def run(self, names: list[str], have: dict[str, Measured]) -> dict[str, Measured]:
        """Complete ``have`` (backend -> what is measured so far) for ``names``: every
        cell not tried yet, cell by cell across the backends, until the budget is spent."""
        from torch.fx.experimental.proxy_tensor import make_fx

        out = {n: have.get(n) or Measured({}, {}, {}) for n in names}
        load = load_per_core()
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for m in out.values():
            m.load = load if m.load is None else max(m.load, load)
            m.taken = m.taken or now
        if load > LOADED:
            log.warning("calibrating at a load average of %.1f per core: other work shares "
                        "this machine, and the calibration will describe that load (here, "
                        "on a shared 2-core machine, it was off by up to 3.5x on whole "
                        "models); run `arbiter calibrate --again` when it is quiet", load)
        for name, cls, build in CELLS:
            todo = [b for b in names if name not in out[b].tried()]
            if not todo:
                continue
            with torch.no_grad():
                fn, args = build()
                gm = make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*args)
            work = cell_work(gm, cls) if cls not in ("call", "block") else 0.0
            fns: dict[str, Callable] = {}
            for b in todo:
                if self._spent():
                    log.info("calibration: budget of %.0f s spent; the rest is measured "
                             "when next needed", self._budget_s)
                    break
                self._show(f"calibrating {b}: {name} ({self._elapsed():.0f} s so far)")
                t0 = time.perf_counter()
                got = self._compiled(b, gm, args)
                out[b].seconds += time.perf_counter() - t0
                if isinstance(got, str):
                    out[b].refused[name] = got
                    log.info("calibration: %s %s not measured: %s", b, name, got)
                else:
                    fns[b] = got
            if not fns:
                continue
            t0 = time.perf_counter()
            try:
                with torch.no_grad():
                    times = time_us(fns, args)
            except Exception as exc:  # noqa: BLE001 - one failing run: each alone
                log.info("calibration: %s failed to run together (%s); each alone", name, exc)
                times = {}
                for b, f in fns.items():
                    try:
                        with torch.no_grad():
                            times.update(time_us({b: f}, args))
                    except Exception as e:  # noqa: BLE001 - priced statically
                        out[b].refused[name] = f"{type(e).__name__}: {str(e)[:200]}"
            spent = (time.perf_counter() - t0) / max(1, len(fns))
            for b, us in times.items():
                out[b].times_us[name], out[b].work[name] = round(us, 3), work
                if cls == "block":
                    out[b].nodes[name] = block_nodes(gm)
                out[b].seconds += spent
                log.info("calibration: %s %s %.1f us", b, name, us)
            if self._spent():
                return out
        return out

    def _compiled(self, name: str, gm: torch.fx.GraphModule, args: tuple):
        """``gm`` compiled by backend ``name`` (called once), or why not."""
        planner = self._planner
        backend = planner.backends[name]
        if not backend.inline_aten:
            fallback = planner.backends[planner.fallback_name]
            plan = partition_graph(gm, planner.table_for([backend, fallback]), 1)
            if [p.backend for p in plan.partitions] != [name]:
                return "its manifest does not take this graph whole"
        try:
            with torch.no_grad():
                fn = gm if backend.inline_aten else backend.compile(gm, list(args))
                fn(*args)
                return fn
        except Exception as exc:  # noqa: BLE001 - a backend failing a cell prices it statically
            return f"{type(exc).__name__}: {str(exc)[:200]}"

    def _elapsed(self) -> float:
        return time.perf_counter() - self._start

    def _spent(self) -> bool:
        return self._budget_s is not None and self._elapsed() > self._budget_s

    def _show(self, msg: str) -> None:
        log.info(msg)
        elapsed = self._elapsed()
        if self._progress and elapsed > PROGRESS_AFTER_S \
                and elapsed - self._shown_at >= PROGRESS_AFTER_S:
            print(f"arbiter: {msg} (once per machine; `arbiter calibrate` does it ahead)",
                  file=sys.stderr, flush=True)
            self._shown_at = elapsed
