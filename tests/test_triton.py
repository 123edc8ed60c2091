"""The Triton backend: each pattern kernel against eager, through arbiter.

On a machine without a GPU the kernels run only in Triton's interpreter, and its mode is
the process's, fixed when triton is first imported (Inductor imports it, even on CPU;
backends/_triton_kernels.py). So ``test_kernels_in_the_interpreter`` runs this file again
in a child process with ``TRITON_INTERPRET=1``, where the tests marked ``interp`` run:
tiny shapes (the interpreter is 500-5000x slower than eager), float32 and float16, inputs
other than the ones compiled with. On a machine with CUDA (and no ``TRITON_INTERPRET``) the
same tests run compiled kernels on the GPU (``-m "interp or gpu"``); tests marked ``gpu``
also call the launchers directly there.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import arbiter

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
# the kernels' tests run in the interpreter (CPU tensors) or compiled on a CUDA device
DEVICE = "cpu" if INTERPRETER or not torch.cuda.is_available() else "cuda"
interp = pytest.mark.skipif(not INTERPRETER and DEVICE == "cpu", reason="runs in the child "
                            "process with TRITON_INTERPRET=1 "
                            "(test_kernels_in_the_interpreter), or on a CUDA device")
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3)}


def _triton():
    try:
        import triton  # noqa: F401
    except ImportError:
        pytest.skip("triton is not installed (pip install 'torch-arbiter[triton]')")


# -- in this process ------------------------------------------------------------------------
@pytest.mark.skipif(INTERPRETER, reason="this is the child")
def test_kernels_in_the_interpreter():
    _triton()
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "interp",
         str(Path(__file__))], env=env, capture_output=True, text=True, timeout=900,
        cwd=Path(__file__).parent.parent)
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail and "skipped" not in tail, tail


@pytest.mark.skipif(INTERPRETER or torch.cuda.is_available(),
                    reason="checks the behaviour without a GPU and without the interpreter")
def test_without_gpu_or_interpreter_it_is_unavailable_with_the_reason():
    _triton()
    from arbiter.backends.triton import Triton

    ok, why = Triton().available()
    assert not ok and "no GPU driver" in why and "TRITON_INTERPRET=1" in why
    assert "triton" in arbiter.Arbiter({"backends": ["triton"]}).unavailable


def test_kernels_are_defined_lazily():
    code = ("import sys, arbiter; arbiter.backend_names(); "
            "import arbiter.backends.triton; print('triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=Path(__file__).parent.parent)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_the_manifest_claims_patterns_with_kernels_only():
    from arbiter.backends._triton_kernels import LAUNCHERS
    from arbiter.backends.triton import Triton
    from arbiter.plan.pattern_library import PATTERNS

    m = Triton.manifest()
    assert m.ops == {}
    assert set(m.patterns) == set(LAUNCHERS) <= set(PATTERNS)
    assert m.defaults.dtypes == ["float32", "float16"]


# -- in the interpreter (the child) -------------------------------------------------------------
class RMS(torch.nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.norm = torch.nn.RMSNorm(cols, eps=1e-5)
        torch.nn.init.normal_(self.norm.weight)

    def forward(self, x):
        return torch.relu(self.norm(x))


class AddLN(torch.nn.Module):
    def __init__(self, cols, affine=True):
        super().__init__()
        self.norm = torch.nn.LayerNorm(cols, elementwise_affine=affine)
        if affine:
            torch.nn.init.normal_(self.norm.weight)
            torch.nn.init.normal_(self.norm.bias)

    def forward(self, x, r):
        s = x + r
        return torch.relu(self.norm(s)), s * 2


class BiasGelu(torch.nn.Module):
    def __init__(self, cols, approximate):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(cols))
        self.approximate = approximate

    def forward(self, x):
        return torch.tanh(F.gelu(x + self.bias, approximate=self.approximate))


class Softmax(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x, mask):
        return torch.softmax(x * self.scale + mask, -1)


def _inputs(shapes, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=gen).to(DEVICE, dtype) for s in shapes]


CASES = [
    # (id, module, input shapes, pattern)
    ("rms_norm", lambda: RMS(24), [(3, 5, 24)], "rms_norm"),
    ("add_layer_norm", lambda: AddLN(24), [(3, 5, 24), (3, 5, 24)], "add_layer_norm"),
    ("add_layer_norm_no_affine", lambda: AddLN(24, affine=False), [(2, 24), (2, 24)],
     "add_layer_norm"),
    ("bias_gelu", lambda: BiasGelu(1030, "none"), [(2, 1030)], "bias_gelu"),
    ("bias_gelu_tanh", lambda: BiasGelu(40, "tanh"), [(3, 2, 40)], "bias_gelu"),
    ("softmax_4d_padding_mask", lambda: Softmax(0.125), [(2, 3, 4, 20), (2, 1, 1, 20)],
     "scale_mask_softmax"),
    ("softmax_causal_mask", lambda: Softmax(0.3), [(2, 6, 6), (6, 6)], "scale_mask_softmax"),
]


@pytest.mark.interp
@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_pattern_kernel_matches_eager(case, dtype, fresh_dynamo):
    _, make, shapes, pattern = case
    torch.manual_seed(0)
    model = make().to(DEVICE, dtype).eval()
    be = arbiter.Arbiter({"backends": ["triton"], "min_block_size": 1})
    compiled = torch.compile(model, backend=be)
    with torch.no_grad():
        compiled(*_inputs(shapes, dtype, seed=1))  # compiles with these
        fresh = _inputs(shapes, dtype, seed=2)      # checked on others
        got, want = compiled(*fresh), model(*fresh)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, **TOL[dtype])
    report = be.report()
    (m,) = [m for g in report.graphs for m in g.patterns]
    assert (m.pattern, m.backend, m.whole, m.compiled) == (pattern, "triton", True, True)
    parts = [p for g in report.graphs for p in g.partitions if p.backend == "triton"]
    assert parts and not any(p.fallbacks for p in parts)


@pytest.mark.interp
@interp
def test_backend_arbiter_builds_its_planner_inside_dynamo(fresh_dynamo):
    # backend="arbiter" makes the Arbiter (and traces the patterns) inside Dynamo's call
    model = BiasGelu(16, "none").to(DEVICE).eval()
    x = torch.randn(2, 16, device=DEVICE)
    config = {"backends": ["triton"], "min_block_size": 1}
    with torch.no_grad():
        got = torch.compile(model, backend="arbiter", options={"config": config})(x)
        torch.testing.assert_close(got, model(x))
    (m,) = [m for g in arbiter.last_report().graphs for m in g.patterns]
    assert (m.pattern, m.backend, m.compiled) == ("bias_gelu", "triton", True)


@pytest.mark.interp
@interp
def test_rows_wider_than_a_block_are_refused_with_the_reason():
    from conftest import trace

    x, mask = torch.randn(2, 20000, device=DEVICE), torch.randn(2, 20000, device=DEVICE)
    gm = trace(lambda x, m: torch.softmax(x * 0.5 + m, -1), x, mask)
    plan = arbiter.partition(gm, {"backends": ["triton"], "min_block_size": 1})
    (g,) = plan.patterns
    assert g.claimed_by == ()
    assert g.support.refusals["triton"] == ("pattern scale_mask_softmax: rows of 20000 "
                                            "elements exceed the kernel's 16384")


@pytest.mark.interp
@interp
def test_a_partition_with_other_ops_is_refused_and_falls_back(fresh_dynamo):
    from arbiter.backends.triton import Triton
    from conftest import trace

    x, b = torch.randn(2, 8, device=DEVICE), torch.randn(8, device=DEVICE)
    gm = trace(lambda x, b: (torch.relu(F.gelu(x + b)),), x, b)
    with pytest.raises(TypeError, match=r"triton runs pattern kernels only; relu"):
        Triton().compile(gm, [x, b])
    gm = trace(lambda x, b: (F.gelu(x + b),), x, b)
    (got,) = Triton().compile(gm, [x, b])(x, b)
    torch.testing.assert_close(got, F.gelu(x + b))


# -- on a GPU ----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_launchers_on_cuda(dtype):
    _triton()
    from arbiter.backends import _triton_kernels as K

    tol = TOL.get(dtype) or dict(atol=2e-2, rtol=2e-2)  # bfloat16: not in TOL
    x, r = torch.randn(4, 7, 300, device="cuda", dtype=dtype), torch.randn(
        4, 7, 300, device="cuda", dtype=dtype)
    w, b = torch.randn(300, device="cuda", dtype=dtype), torch.randn(300, device="cuda",
                                                                     dtype=dtype)
    (y,) = K.launch_rms_norm(x, w, eps=1e-6, out_dtype=dtype)
    torch.testing.assert_close(y, F.rms_norm(x, (300,), w, 1e-6), **tol)
    y, s = K.launch_add_layer_norm(x, r, w, b, eps=1e-5)
    torch.testing.assert_close(s, x + r, **tol)
    torch.testing.assert_close(y, F.layer_norm(x + r, (300,), w, b), **tol)
    for approx in ("none", "tanh"):
        (y,) = K.launch_bias_gelu(x, b, approximate=approx, bias_first=False)
        torch.testing.assert_close(y, F.gelu(x + b, approximate=approx), **tol)
    mask = torch.randn(4, 1, 300, device="cuda", dtype=dtype)
    (y,) = K.launch_scale_mask_softmax(x, mask, scale=0.2)
    torch.testing.assert_close(y, torch.softmax(x * 0.2 + mask, -1), **tol)
