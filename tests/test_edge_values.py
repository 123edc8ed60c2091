"""Edge values that random programs found computed unlike eager (issue 25, item 5).

Each case runs through arbiter with its backend forced to take the graph
(``min_block_size: 1``, untimed, ``verify`` off) so that nothing but the fix makes the
answer right, and checks where the op ran (or who refused it, and why):

1. integer ``pow`` past overflow: eager wraps; ONNX Runtime computes through float64
   (saturates, and rounds past 2**53), OpenVINO in 32 bits: refused there;
2. ``mean`` (OpenVINO: also ``var``/``std``) over an empty extent: eager NaN, both
   runtimes 0: refused where the extent is empty;
3. floating ``remainder`` of values near 1e8: the ONNX export computed
   ``a - floor(a / b) * b`` (1e8 % 3 was 0): now ATen's fmod and sign fix-up, exact;
   OpenVINO (remainder and fmod through a quotient) refuses it;
4. NaN made inside a partition (0 / 0, log(-1)) reaching an op OpenVINO computes unlike
   eager on NaN (relu(NaN) is 0): the input guard missed it; the made values are now
   checked per call (backends/_nonfinite.py ``taps``) and such a call runs in eager.
"""
from __future__ import annotations

import math

import pytest
import torch

import arbiter
from arbiter.backends._nonfinite import makes_nonfinite, taps

from conftest import trace

NAN = math.nan


def _forced(backend: str, **options) -> arbiter.Arbiter:
    entry = {"name": backend, "options": options} if options else backend
    return arbiter.Arbiter({"backends": [entry], "min_block_size": 1,
                            "against_eager": "off", "verify": {"mode": "off"}})


def _run(backend: str, fn, *args, **options):
    """``fn`` compiled with only ``backend`` (then eager): (result, op -> OpReport)."""
    pytest.importorskip(backend)
    be = _forced(backend, **options)
    with torch.no_grad():
        out = torch.compile(fn, backend=be, dynamic=False)(*args)
    ops = {o.op: o for g in be.report(advice=False).graphs for o in g.ops}
    return out, ops, be


def _same(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == expected.dtype
    if expected.is_floating_point():
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    else:
        assert torch.equal(got, expected), (got, expected)


# -- 1. integer pow -------------------------------------------------------------------------
BASES = torch.tensor([3, 7, -5, 12, 2, 100], dtype=torch.int64)
POWS = {
    "int64_overflow": (lambda x: torch.pow(x, 40), (BASES,), "aten.pow.Tensor_Scalar"),
    "int64_past_2_53": (lambda x: torch.pow(x, 39), (torch.tensor([3, -3]),),
                        "aten.pow.Tensor_Scalar"),
    "int64_tensor_exponent": (lambda x, e: torch.pow(x, e),
                              (BASES, torch.full((6,), 40, dtype=torch.int64)),
                              "aten.pow.Tensor_Tensor"),
    "int32_overflow": (lambda x: torch.pow(x, 25), (BASES.int(),), "aten.pow.Tensor_Scalar"),
}


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
@pytest.mark.parametrize("case", sorted(POWS))
def test_integer_pow_wraps_like_eager(case, backend, fresh_dynamo):
    """Before: ONNX Runtime's 3**40 was -9223372036854775807 (eager
    -6289078614652622814), its 3**39 off by 11; OpenVINO's 3**39 was -2147483647."""
    fn, args, op = POWS[case]
    out, ops, _ = _run(backend, fn, *args)
    _same(out, fn(*args))
    # OpenVINO refuses int64 nodes whatever the op (32-bit integers): its int32 case
    # shows the pow rule
    why = ops[op].refused[backend]
    assert "integer pow" in why or (backend == "openvino" and "32 bits" in why), ops[op]
    assert ops[op].placed == {"eager": 1}


INTEGER_ARITHMETIC = {
    "sum_past_2_53": (lambda x: x.sum(), (torch.tensor([2 ** 53 + 1, 0]),), "aten.sum.default",
                      "integer sum"),
    "sum_dim_past_2_53": (lambda x: x.sum(1), (torch.tensor([[2 ** 62, 5], [3 ** 39, 7]]),),
                          "aten.sum.dim_IntList", "integer sum"),
    "int32_sum_overflow": (lambda x: x.sum(0, dtype=torch.int32),
                           (torch.tensor([2 ** 30] * 3, dtype=torch.int32),),
                           "aten.sum.dim_IntList", "integer sum"),
    "prod_past_2_53": (lambda x: x.prod(), (torch.tensor([3 ** 20, 3 ** 19]),),
                       "aten.prod.default", "integer prod"),
    "floor_division_past_2_24": (lambda x: torch.div(x, 3, rounding_mode="floor"),
                                 (torch.tensor([2 ** 53 + 1, -(2 ** 62) - 1, 2 ** 24 + 1]),),
                                 "aten.div.Tensor_mode", "divides in float32"),
    "trunc_division_past_2_24": (lambda x, y: torch.div(x, y, rounding_mode="trunc"),
                                 (torch.tensor([2 ** 53 + 1, -(2 ** 40) - 1]),
                                  torch.tensor([3, 7])),
                                 "aten.div.Tensor_mode", "divides in float32"),
}


@pytest.mark.parametrize("case", sorted(INTEGER_ARITHMETIC))
def test_onnx_runtime_integer_arithmetic_through_floats_is_refused(case, fresh_dynamo):
    """The cause of item 1 reaches further: ONNX Runtime reduces integers through
    float64 ((2**53 + 1) sums to 2**53; an int32 sum past its range saturates) and the
    export divides integers with a rounding mode in float32 ((2**53 + 1) // 3 off by
    9e7). Refused; integer add, mul, cumsum and floor_divide were measured exact there."""
    fn, args, op, why = INTEGER_ARITHMETIC[case]
    out, ops, _ = _run("onnxruntime", fn, *args)
    _same(out, fn(*args))
    assert why in ops[op].refused["onnxruntime"], ops[op]


def test_onnx_runtime_counts_booleans(fresh_dynamo):
    """A sum of booleans (a count: exact through float64) stays on ONNX Runtime."""
    fn = lambda x: (x > 0).sum(1) + 1  # noqa: E731
    x = torch.randn(4, 6)
    out, ops, _ = _run("onnxruntime", fn, x)
    _same(out, fn(x))
    assert ops["aten.sum.dim_IntList"].placed == {"onnxruntime": 1}, ops["aten.sum.dim_IntList"]


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_float_pow_stays(backend, fresh_dynamo):
    fn = lambda x: torch.pow(x, 3.0) + 1.0  # noqa: E731
    x = torch.randn(4, 5)
    out, ops, _ = _run(backend, fn, x)
    torch.testing.assert_close(out, fn(x))
    assert ops["aten.pow.Tensor_Scalar"].placed == {backend: 1}


# -- 2. mean over an empty extent --------------------------------------------------------
EMPTY = {
    "mean_dim": (lambda x: torch.mean(x, dim=1) + 1.0, torch.randn(3, 0), "aten.mean.dim"),
    "mean_all": (lambda x: torch.mean(x) + 1.0, torch.randn(3, 0), "aten.mean.default"),
    "mean_dims_keepdim": (lambda x: torch.mean(x, dim=(0, 1), keepdim=True) + 1.0,
                          torch.randn(0, 4), "aten.mean.dim"),
}
OV_EMPTY = {
    "var_correction_0": (lambda x: torch.var(x, dim=1, correction=0) + 1.0, torch.randn(3, 0),
                         "aten.var.correction"),
    "std": (lambda x: torch.std(x, dim=1) + 1.0, torch.randn(3, 0), "aten.std.correction"),
    "var_mean": (lambda x: torch.var_mean(x, dim=1)[1] + 1.0, torch.randn(3, 0),
                 "aten.var_mean.correction"),
}


@pytest.mark.parametrize("backend,case", [(b, c) for b in ("onnxruntime", "openvino")
                                          for c in sorted(EMPTY)]
                         + [("openvino", c) for c in sorted(OV_EMPTY)])
def test_mean_over_nothing_is_nan(backend, case, fresh_dynamo):
    """Before: 0 on both (so 1.0 here), eager NaN."""
    fn, x, op = {**EMPTY, **OV_EMPTY}[case]
    out, ops, _ = _run(backend, fn, x)
    _same(out, fn(x))
    assert out.isnan().all()
    assert "empty extent" in ops[op].refused[backend], ops[op]


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_mean_over_something_stays(backend, fresh_dynamo):
    """An empty tensor reduced over its non-empty dimension, and an ordinary mean."""
    fn = lambda x, y: (torch.mean(x, dim=1) + 1.0, torch.mean(y, dim=1) * 2.0)  # noqa: E731
    x, y = torch.randn(0, 4), torch.randn(3, 5)
    out, ops, _ = _run(backend, fn, x, y)
    for o, e in zip(out, fn(x, y)):
        torch.testing.assert_close(o, e)
    assert ops["aten.mean.dim"].placed == {backend: 2}, ops["aten.mean.dim"]


# -- 3. remainder of huge values ----------------------------------------------------------
A = torch.tensor([1e8, -1e8, 123456789.0, 99999999.0, 16777217.0, 7.5, -7.5, 0.0, -0.0,
                  5.0, -5.0, math.inf, 3.0, -3.0, NAN])
B = torch.tensor([3.0, 3.0, 7.0, -3.0, 3.0, 2.0, 2.0, -2.0, 2.0, 0.0, math.inf, 2.0,
                  -math.inf, math.inf, 1.0])
REMAINDERS = {
    "tensor": (lambda a, b: torch.remainder(a, b), (A, B), "aten.remainder.Tensor"),
    "scalar": (lambda a: torch.remainder(a, 3.0), (A,), "aten.remainder.Scalar"),
    "negative_scalar": (lambda a: torch.remainder(a, -0.7), (A,), "aten.remainder.Scalar"),
    "float16": (lambda a, b: torch.remainder(a, b), (A.half(), B.half()),
                "aten.remainder.Tensor"),
    "random": (lambda a, b: torch.remainder(a, b),
               (torch.randn(4000, generator=torch.Generator().manual_seed(0))
                * torch.logspace(0, 9, 4000),
                torch.randn(4000, generator=torch.Generator().manual_seed(1)) * 5),
               "aten.remainder.Tensor"),
}


@pytest.mark.parametrize("case", sorted(REMAINDERS))
def test_onnx_runtime_remainder_is_eagers(case, fresh_dynamo):
    """Before: 1e8 % 3 was 0 (eager 1), -1e8 % 3 was 0 (eager 2). Now ONNX Runtime runs
    ATen's formula (exact fmod, then the sign): bit-equal to eager, NaN and inf
    included."""
    fn, args, op = REMAINDERS[case]
    out, ops, _ = _run("onnxruntime", fn, *args)
    _same(out, fn(*args))
    assert ops[op].placed == {"onnxruntime": 1}, ops[op]


def test_onnx_runtime_integer_remainder_is_unchanged(fresh_dynamo):
    fn = lambda a, b: torch.remainder(a, b)  # noqa: E731
    a, b = torch.tensor([7, -7, 7, -7, 0]), torch.tensor([3, 3, -3, -3, 5])
    out, ops, _ = _run("onnxruntime", fn, a, b)
    _same(out, fn(a, b))
    assert ops["aten.remainder.Tensor"].placed == {"onnxruntime": 1}


@pytest.mark.parametrize("fn,op", [
    (lambda a, b: torch.remainder(a, b), "aten.remainder.Tensor"),
    (lambda a, b: torch.fmod(a, b), "aten.fmod.Tensor"),
], ids=["remainder", "fmod"])
def test_openvino_refuses_floating_remainder(fn, op, fresh_dynamo):
    """Before: OpenVINO's 1e8 % 3 was 0 and its fmod(-1e8, 3) 0 (eager 2 and -1)."""
    out, ops, _ = _run("openvino", fn, A, B)
    _same(out, fn(A, B))
    assert "through a quotient" in ops[op].refused["openvino"], ops[op]


@pytest.mark.parametrize("case", ["tensor", "scalar"])
def test_inductor_refuses_floating_remainder(case, fresh_dynamo):
    """Before: Inductor's 1e8 % 3 was 0 and -1e8 % 3 was 8 (a - b * floor(a / b));
    refused, eager's fmod-and-fix-the-sign runs it. Integer remainder stays."""
    fn, args, op = REMAINDERS[case]
    be = _forced("inductor")
    with torch.no_grad():
        out = torch.compile(fn, backend=be, dynamic=False)(*args)
    _same(out, fn(*args))
    ops = {o.op: o for g in be.report(advice=False).graphs for o in g.ops}
    assert "floor(a / b)" in ops[op].refused["inductor"], ops[op]
    torch._dynamo.reset()
    ints = _forced("inductor")
    a, b = torch.tensor([7, -7, 100]), torch.tensor([3, 3, -9])
    with torch.no_grad():
        _same(torch.compile(lambda a, b: torch.remainder(a, b) * 2, backend=ints,
                            dynamic=False)(a, b), torch.remainder(a, b) * 2)
    ops = {o.op: o for g in ints.report(advice=False).graphs for o in g.ops}
    assert ops["aten.remainder.Tensor"].placed == {"inductor": 1}


# -- 4. NaN made inside a partition ------------------------------------------------------------
X = torch.tensor([[0.0, 1.0, -1.0, 2.0], [0.5, -4.0, -0.0, 3.0]])
Y = torch.tensor([[0.0, 2.0, -1.0, 0.5], [1.0, 0.0, 0.0, -2.0]])
MADE_INSIDE = {
    "relu_of_0_over_0": (lambda x, y: torch.relu(x / y) * 2.0, "aten.relu.default"),
    "exp_of_log_negative": (lambda x, y: torch.exp(torch.log(y - 0.75)) * 2.0,
                            "aten.exp.default"),
    "softmax_of_sqrt_negative": (lambda x, y: torch.softmax(torch.sqrt(y - 0.75), 1) * 2.0,
                                 "aten._softmax.default"),
    "bool_of_0_over_0": (lambda x, y: (x / y).bool().float() * 2.0, "aten._to_copy.default"),
    "maximum_of_log": (lambda x, y: torch.maximum(torch.log(y - 0.75), x) * 2.0,
                       "aten.maximum.default"),
    "gt_of_itself": (lambda x, y: (lambda v: torch.where(v > v, 1.0, 0.0) + x)(x / y),
                     "aten.gt.Tensor"),
}


@pytest.mark.parametrize("case", sorted(MADE_INSIDE))
def test_openvino_guard_sees_nan_made_inside(case, fresh_dynamo):
    """OpenVINO's default `exact_nonfinite: guard` checked only the partition's inputs:
    relu(0 / 0) came back 0, exp(log(-0.25)) inf, softmax of a row with sqrt(-0.75) had
    zeros, bool(0 / 0) was false (eager: NaN, NaN, NaN, true). The whole function still
    runs on OpenVINO; a call where a value made inside holds NaN runs in eager, counted;
    a finite call stays on OpenVINO. (OpenVINO's `gt(NaN, NaN)` was right on this CPU, an
    AMD EPYC: `gt` is in its table from an earlier probe, and guarded the same way.)"""
    fn, op = MADE_INSIDE[case]
    pytest.importorskip("openvino")
    be = _forced("openvino")
    compiled = torch.compile(fn, backend=be, dynamic=False)
    with torch.no_grad():
        _same(compiled(X, Y), fn(X, Y))
        finite_x, finite_y = X.abs() + 1.0, Y.abs() + 1.0
        torch.testing.assert_close(compiled(finite_x, finite_y), fn(finite_x, finite_y))
    [part] = [p for g in be.report(advice=False).graphs for p in g.partitions]
    assert part.backend == "openvino" and op in part.nonfinite_guard, part
    assert part.nonfinite_eager_calls == 1  # the NaN call only


def test_onnx_runtime_guard_sees_nan_made_inside(fresh_dynamo):
    """ONNX Runtime under `exact_nonfinite: guard` (not its default): sign(0 / 0) was NaN
    there, eager 0."""
    fn = lambda x, y: torch.sign(x / y) * 2.0  # noqa: E731
    out, ops, be = _run("onnxruntime", fn, X, Y, exact_nonfinite="guard")
    _same(out, fn(X, Y))
    [part] = [p for g in be.report(advice=False).graphs for p in g.partitions]
    assert part.backend == "onnxruntime" and part.nonfinite_eager_calls == 1


def _taps(fn, *args):
    from arbiter.backends.openvino import _NONFINITE_CHECKS

    return [n.name for n in taps(trace(fn, *args), _NONFINITE_CHECKS)]


def test_taps_are_the_ops_that_make_nan_upstream_of_a_guarded_op():
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    # the division's output, seen through a multiplication, feeds relu
    assert _taps(lambda x, y: (torch.relu((x / y) * 3.0),), x, y) == ["div"]
    # relu reads nothing made inside: nothing to check beyond the inputs
    assert _taps(lambda x, y: (torch.relu(x * 3.0 + y),), x, y) == []
    # a division by a non-zero number, a square, a mean over something: no source
    assert _taps(lambda x: (torch.relu(x / 8.0 + x ** 2 + x.mean(1, keepdim=True)),), x) == []
    # a source that feeds no guarded op is not checked
    assert _taps(lambda x, y: (torch.log(x) * y,), x, y) == []
    # a guarded comparison reads it; a NaN is not followed through a boolean (lt is
    # computed like eager on NaN: only what it makes of it matters)
    assert _taps(lambda x, y: (((x / y) > 0).float(),), x, y) == ["div"]
    assert _taps(lambda x, y: (torch.relu(((x / y) < 0).float()),), x, y) == []


def test_which_ops_make_nan():
    x = torch.randn(3, 4)
    gm = trace(lambda x: (x / 2.0, x / x, x ** 2, x ** 0.5, x.mean(), torch.exp(x),
                          torch.var(x[:, :1], dim=1), torch.var(x, dim=1), x + 1.0,
                          x / torch.full((), 8.0)), x)
    made = {n.name: makes_nonfinite(n) for n in gm.graph.nodes if n.op == "call_function"
            and n.name not in ("full", "slice_1", "slice_2")}
    assert made == {"div": False, "div_1": True, "pow_1": False, "pow_2": True, "mean": False,
                    "exp": True, "var": True, "var_1": False, "add": False, "div_2": False}, made


def test_a_norms_root_of_a_positive_value_is_no_source():
    """``rsqrt(mean(x ** 2) + eps)`` (T5's and LLaMA's RMSNorm) is finite for every finite
    ``x``: no tap, so the norm stays fused in the backend (a tap made T5-small's encoder
    4% slower on OpenVINO). Where the argument can be 0 or negative, it still is one."""
    x = torch.randn(4, 8)
    eps = 1e-6
    assert _taps(lambda x: (torch.relu(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)),),
                 x) == []
    assert _taps(lambda x: (torch.relu(x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)),),
                 x) == []
    assert _taps(lambda x: (torch.relu(x * torch.rsqrt(x.var(-1, keepdim=True) + eps)),),
                 x) == []
    # the variance of one value is NaN: the variance is tapped, not the root
    assert _taps(lambda x: (torch.relu(x * torch.rsqrt(x[:, :1].var(-1, keepdim=True) + eps)),),
                 x) == ["var"]
    # can be 0, or negative: still sources
    assert _taps(lambda x: (torch.relu(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))),),
                 x) == ["rsqrt"]
    assert _taps(lambda x: (torch.relu(x * torch.rsqrt(x.mean(-1, keepdim=True) + eps)),),
                 x) == ["rsqrt"]
    assert _taps(lambda x: (torch.relu(x * torch.rsqrt(x.pow(3).mean(-1, keepdim=True) + eps)),),
                 x) == ["rsqrt"]
    assert _taps(lambda x: (torch.relu(torch.log(x.pow(2) + eps) - torch.log(x.pow(2) - eps)),),
                 x) == ["log_1"]
    assert _taps(lambda x: (torch.relu(x / (x.abs() + torch.clamp_min(x, 0.5))),), x) == []
    assert _taps(lambda x: (torch.relu(x / (x + 0.5)),), x) == ["div"]
    # a clamp whose upper bound lies below its lower one is that upper bound everywhere
    assert _taps(lambda x: (torch.relu(x / torch.clamp(x, 0.5, -1.0)),), x) == ["div"]
    assert _taps(lambda x: (torch.relu(x / torch.clamp(x, 0.5, 2.0)),), x) == []
    # in float16, an eps of 1e-6 is subnormal (flushed to zero where denormals are)
    h = x.half()
    assert _taps(lambda x: (torch.relu(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)),),
                 h) == ["rsqrt"]
    assert _taps(lambda x: (torch.relu(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-3)),),
                 h) == []


# -- 5. OpenVINO's 32-bit integers ---------------------------------------------------------
def test_openvino_refuses_int64_but_embedding_indices(fresh_dynamo):
    """OpenVINO's CPU plugin holds int64 in 32 bits (3e9 + 1 came back wrong): every node
    reading or writing int64 is refused there, except an embedding's indices."""
    big = torch.tensor([3_000_000_000, -3_000_000_001, 5], dtype=torch.int64)
    out, ops, _ = _run("openvino", lambda x: (x + 1) * 2, big)
    _same(out, (big + 1) * 2)
    assert "32 bits" in ops["aten.add.Tensor"].refused["openvino"]
    torch._dynamo.reset()
    table = torch.randn(10, 4)
    idx = torch.tensor([[1, 2], [9, 0]])
    out, ops, _ = _run("openvino", lambda i, w: torch.nn.functional.embedding(i, w) * 2,
                       idx, table)
    torch.testing.assert_close(out, torch.nn.functional.embedding(idx, table) * 2)
    assert ops["aten.embedding.default"].placed == {"openvino": 1}
