"""Fault injection: backends that fail to compile, raise at run time, or return wrong
numbers, shapes, dtypes or output counts, at every position of a chain.

Whatever the fault and wherever it sits, the compiled function must return eager's
result, the piece must end on the first healthy backend after the faulty one, and the
report must name the fallback with its stage and reason. Wrong numbers are only visible
to an accuracy check, so those cases run with ``verify: first``.
"""
from __future__ import annotations

import pytest
import torch

import arbiter

OPS = ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"]


def f(x):
    return torch.relu(x) * 2 + x


def _healthy(self, gm, example_inputs):
    return gm


def _compile_error(self, gm, example_inputs):
    raise RuntimeError("injected: compile failed")


def _wrap(transform):
    def compile(self, gm, example_inputs):
        def fn(*args):
            return transform(list(gm(*args)))
        return fn
    return compile


def _raise(outs):
    raise RuntimeError("injected: kernel crashed")


#: fault name -> (compile function, stage recorded, a word the reason must contain)
FAULTS = {
    "compile_error": (_compile_error, "compile", "compile failed"),
    "run_error": (_wrap(_raise), "run", "kernel crashed"),
    "wrong_numbers": (_wrap(lambda o: [o[0] + 0.5] + o[1:]), "verify", "max abs error"),
    "wrong_shape": (_wrap(lambda o: [o[0][:1]] + o[1:]), "run", "shape"),
    "wrong_dtype": (_wrap(lambda o: [o[0].double()] + o[1:]), "run", "dtype"),
    "wrong_count": (_wrap(lambda o: o + [o[0]]), "run", "outputs"),
    "returns_none": (_wrap(lambda o: None), "run", "NoneType"),
}
CHAIN = ["b0", "b1", "b2"]


def _parts(be):
    return [p for g in be.report().graphs for p in g.partitions]


@pytest.mark.parametrize("position", range(len(CHAIN)))
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_at_every_position(make_backend, fresh_dynamo, fault, position):
    """Backends before ``position`` fail to compile (so the call reaches it), the one at
    ``position`` has the fault, those after are healthy; eager ends the chain."""
    bad, stage, word = FAULTS[fault]
    for i, name in enumerate(CHAIN):
        make_backend(name, OPS, compile=_compile_error if i < position
                     else bad if i == position else _healthy)
    be = arbiter.Arbiter({"backends": CHAIN, "min_block_size": 1,
                          "verify": {"mode": "first"}})
    compiled = torch.compile(f, backend=be)
    x = torch.randn(4, 4)
    torch.testing.assert_close(compiled(x), f(x))
    (p,) = _parts(be)
    full = CHAIN + ["eager"]
    assert p.chain == full
    assert (p.planned_backend, p.backend) == ("b0", full[position + 1]), str(be.report())
    expected = [(full[i], full[i + 1], "compile") for i in range(position)]
    expected.append((full[position], full[position + 1], stage))
    assert [(fb.from_backend, fb.to_backend, fb.stage) for fb in p.fallbacks] == expected
    assert word in p.fallbacks[-1].reason, p.fallbacks[-1].reason
    # later calls stay right and do not fall back again
    for _ in range(3):
        x = torch.randn(4, 4)
        torch.testing.assert_close(compiled(x), f(x))
    assert len(_parts(be)[0].fallbacks) == len(expected)


def test_every_fault_in_one_chain(make_backend, fresh_dynamo):
    """A chain of six faulty backends then eager: calls walk down all of it, each call
    right (a run error returns eager's result for that call, which ran to tell the
    backend's error from the user's; the next backend runs from the next call)."""
    names = []
    for fault in ("compile_error", "run_error", "wrong_shape", "wrong_dtype",
                  "wrong_count", "wrong_numbers"):
        make_backend(f"f_{fault}", OPS, compile=FAULTS[fault][0])
        names.append(f"f_{fault}")
    be = arbiter.Arbiter({"backends": names, "min_block_size": 1, "verify": {"mode": "first"}})
    compiled = torch.compile(f, backend=be)
    for _ in range(3):
        x = torch.randn(4, 4)
        torch.testing.assert_close(compiled(x), f(x))
    (p,) = _parts(be)
    assert p.backend == "eager"
    assert [fb.stage for fb in p.fallbacks] == ["compile", "run", "run", "run", "run", "verify"]
    assert [fb.from_backend for fb in p.fallbacks] == names


def test_wrong_numbers_pass_unseen_without_verify(make_backend, fresh_dynamo):
    """What verify is for: with `verify: off`, a backend returning wrong numbers of the
    right shape and dtype is not detected (the report shows it ran, with no checks).
    The default (`unverified`) checks it, since its ops are only declared."""
    make_backend("liar", OPS, compile=FAULTS["wrong_numbers"][0])
    be = arbiter.Arbiter({"backends": ["liar"], "min_block_size": 1,
                          "verify": {"mode": "off"}})
    x = torch.randn(4, 4)
    out = torch.compile(f, backend=be)(x)
    assert not torch.allclose(out, f(x))
    (p,) = _parts(be)
    assert p.backend == "liar" and p.verify_checks == 0
    torch._dynamo.reset()
    checked = arbiter.Arbiter({"backends": ["liar"], "min_block_size": 1})
    torch.testing.assert_close(torch.compile(f, backend=checked)(x), f(x))
    (p,) = _parts(checked)
    assert p.backend == "eager" and p.verify_checks == 1 and p.fallbacks[0].stage == "verify"


def test_fault_in_training_backward(make_backend, fresh_dynamo):
    ops = OPS + ["aten.threshold_backward.default", "aten.le.Scalar",
                 "aten.where.self", "aten.scalar_tensor.default"]
    make_backend("b0", ops, compile=FAULTS["wrong_dtype"][0])
    # the fault machinery, not the timing against eager (which may install eager)
    be = arbiter.Arbiter({"backends": ["b0"], "min_block_size": 1, "against_eager": "off"})
    x = torch.randn(4, 4, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    torch.compile(f, backend=be)(x).sum().backward()
    f(xr).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    kinds = {g.kind for g in be.report().graphs for p in g.partitions if p.fallbacks}
    assert kinds == {"forward", "backward"}, str(be.report())
