"""An error eager also raises is the user's, not a backend's (arbiter/run/piece.py,
``IndexGuard`` in arbiter/run/checks/calls.py): token ids past the vocabulary raise eager's
``IndexError`` on every path that could demote a partition (run time, compile, verify,
first use, a loaded program), nothing is demoted, no cached artifact evicted, and the
next good call runs on the backend as before. Before, a loaded program fell down four
backends and returned numbers for such ids; an Inductor kernel's bounds check aborted
the process."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import arbiter

OPS = ["aten.index.Tensor", "aten.mul.Tensor", "aten.embedding.default", "aten.add.Tensor",
       "aten.t.default", "aten.addmm.default", "aten.view.default", "aten.relu.default",
       "aten._unsafe_view.default", "aten.mm.default"]


def pick(x, idx):
    return x[idx] * 2  # aten.index.Tensor: no bounds check before the backend


class Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(100, 16)
        self.lin = nn.Linear(16, 8)

    def forward(self, ids):
        return torch.relu(self.lin(self.emb(ids)))


def _partitions(be):
    return [p for g in be.report(advice=False).graphs for p in g.partitions]


def _stayed(be, name: str) -> None:
    """No partition demoted; each one compiled runs on ``name`` (a graph whose only
    call raised compiled nothing)."""
    parts = _partitions(be)
    assert any(p.backend == name for p in parts), str(be.report(advice=False))
    assert all(p.backend in (name, None) and not p.fallbacks for p in parts), \
        str(be.report(advice=False))


def _bad_then_good(compiled, be, name: str, good, bad, fn):
    with torch.no_grad():
        torch.testing.assert_close(compiled(*good), fn(*good))
        with pytest.raises(IndexError):
            fn(*bad)  # eager's own error ...
        with pytest.raises(IndexError):
            compiled(*bad)  # ... is what the user gets
        torch.testing.assert_close(compiled(*good), fn(*good))
    _stayed(be, name)


def _first_call_bad(make_backend, name: str, compile, verify: str) -> None:
    """A first call with an index out of range raises eager's error; a good call then
    runs on ``name``, nothing demoted."""
    make_backend(name, OPS, compile=compile)
    be = arbiter.Arbiter({"backends": [name], "min_block_size": 1,
                          "against_eager": "off", "verify": {"mode": verify}})
    compiled = torch.compile(pick, backend=be)
    x = torch.randn(10, 4)
    with torch.no_grad(), pytest.raises(IndexError):
        compiled(x, torch.tensor([1, 20]))
    torch.testing.assert_close(compiled(x, torch.tensor([1, 2])), pick(x, torch.tensor([1, 2])))
    _stayed(be, name)


def test_run_time_failure_that_eager_shares_demotes_nothing(make_backend, fresh_dynamo):
    """The backend runs ATen: it raises IndexError itself; eager does too."""
    make_backend("ue_run", OPS)
    be = arbiter.Arbiter({"backends": ["ue_run"], "min_block_size": 1,
                          "against_eager": "off", "verify": {"mode": "off"}})
    x = torch.randn(10, 4)
    _bad_then_good(torch.compile(pick, backend=be), be, "ue_run",
                   (x, torch.tensor([1, 2])), (x, torch.tensor([1, 20])), pick)


def test_compile_failure_on_the_users_inputs_demotes_nothing(make_backend, fresh_dynamo):
    """A backend that runs the inputs while compiling (a check of its own) fails on a
    first call with bad ids: eager's error, the compile tried again on the next call."""
    def checks_inputs(self, gm, example_inputs):
        gm(*example_inputs)
        return gm

    _first_call_bad(make_backend, "ue_compile", checks_inputs, "off")


@pytest.mark.parametrize("mode", ["every", "unverified"])
def test_checked_calls_raise_the_users_error(make_backend, fresh_dynamo, mode):
    """A backend that returns numbers for bad ids (clamped, as a garbage row would be):
    verify's reference (or the first-use check's) is eager, which raises."""
    def clamps(self, gm, example_inputs):
        return lambda x, idx: gm(x, idx.clamp(0, x.shape[0] - 1))

    _first_call_bad(make_backend, "ue_verify", clamps, mode)


def test_token_ids_past_the_vocabulary_never_reach_a_backend(make_backend, fresh_dynamo):
    """An embedding reading ids from its inputs is guarded: a backend that would return
    numbers for them (clamping) is never called with them."""
    calls = []

    def counts(self, gm, example_inputs):
        def run(*args):
            calls.append(1)
            return gm(*[a.clamp(0, 99) if a.dtype == torch.long else a for a in args])
        return run

    make_backend("ue_guard", OPS, compile=counts)
    be = arbiter.Arbiter({"backends": ["ue_guard"], "min_block_size": 1,
                          "against_eager": "off", "verify": {"mode": "off"}})
    model = Tokens().eval()
    compiled = torch.compile(model, backend=be)
    good, bad = torch.randint(0, 100, (2, 5)), torch.randint(100, 200, (2, 5))
    _bad_then_good(compiled, be, "ue_guard", (good,), (bad,), model)
    assert len(calls) == 2  # the two good calls


def test_inductor_kernel_never_aborts_the_process(fresh_dynamo):
    """Inductor's generated kernel checks bounds inside a parallel loop, where a failed
    check aborts the process; the guard raises eager's error before it runs."""
    model = Tokens().eval()
    be = arbiter.Arbiter({"backends": ["inductor"], "min_block_size": 1,
                          "against_eager": "off", "verify": {"mode": "off"}})
    compiled = torch.compile(model, backend=be)
    good = torch.randint(0, 100, (4, 64))
    bad = good.clone()
    bad[3, 7] = 150
    _bad_then_good(compiled, be, "inductor", (good,), (bad,), model)


def test_loaded_program_raises_eagers_error_and_stays_on_its_backend(tmp_path):
    """issue 45's repro: a saved program given ids past the vocabulary raised ONNX
    Runtime's Gather error, fell down the chain and returned numbers."""
    pytest.importorskip("onnxruntime")
    model = Tokens().eval()
    ids = torch.randint(0, 100, (2, 16))
    dims = ({0: torch.export.Dim("b", min=2, max=32), 1: torch.export.Dim("n", min=4, max=64)},)
    program = arbiter.export(model, (ids,), dynamic_shapes=dims,
                             config={"backends": ["onnxruntime"], "against_eager": "off"})
    program.save(tmp_path / "tokens.arbiter")
    loaded = arbiter.load(tmp_path / "tokens.arbiter")
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids), atol=1e-5, rtol=1e-5)
        with pytest.raises(IndexError):
            loaded(torch.randint(100, 200, (2, 16)))
        torch.testing.assert_close(loaded(ids), model(ids), atol=1e-5, rtol=1e-5)
    parts = loaded.report().graphs[0].partitions
    assert any(p.backend == "onnxruntime" for p in parts), str(loaded.report())
    assert all(p.backend == p.planned_backend and not p.fallbacks for p in parts), \
        str(loaded.report())


def _guarded(make_backend, name: str, ops: list, fn, good, bad, dynamic: bool) -> None:
    """``fn`` compiled on a backend counting its calls: the bad calls raise eager's error
    and never reach it (OpenVINO's gather answered with rows of zeros, ONNX Runtime's
    scatter wrapped a negative position); the good ones run on it."""
    calls = []

    def counting(self, gm, example_inputs):
        def run(*args):
            calls.append(1)
            return gm(*args)
        return run

    make_backend(name, ops, compile=counting, dynamic=dynamic)
    be = arbiter.Arbiter({"backends": [name], "min_block_size": 1,
                          "against_eager": "off", "verify": {"mode": "off"}})
    compiled = torch.compile(fn, backend=be, dynamic=dynamic)
    with torch.no_grad():
        for args in good:
            torch.testing.assert_close(compiled(*args), fn(*args))
        before = len(calls)
        for args in bad:
            with pytest.raises((IndexError, RuntimeError)) as eager:
                fn(*args)
            with pytest.raises(type(eager.value)):
                compiled(*args)
        assert len(calls) == before  # the bad calls never reached the backend
        for args in good:  # and it runs the good ones still
            torch.testing.assert_close(compiled(*args), fn(*args))
        assert len(calls) > before
    _stayed(be, name)


@pytest.mark.parametrize("dynamic", [False, True])
def test_positions_of_every_indexing_op_are_guarded(make_backend, fresh_dynamo, dynamic):
    # Before: only embedding, index_select, gather, index_copy and index_add were guarded,
    # and none whose indexed size was symbolic: x[i] with i past the rows came back from
    # OpenVINO as a row of zeros, scatter's -1 from ONNX Runtime wrapped to the last
    # column, an embedding of a weight passed as an input went unchecked with dynamic=True.
    x = torch.arange(40.0).view(10, 4)
    cases = [
        ("ix", ["aten.index.Tensor", "aten.mul.Tensor"], lambda t, i: t[i] * 2,
         [(x, torch.tensor([1, 2, 3])), (x, torch.tensor([-1, -10, 9]))],  # negatives: Python's
         [(x, torch.tensor([9, 10, 0])), (x, torch.tensor([-11, 0, 0]))]),
        ("sc", ["aten.scatter.src"], lambda t, i, s: torch.scatter(t, 1, i, s),
         [(torch.zeros(3, 5), torch.tensor([[0, 1], [2, 3], [1, 4]]), torch.ones(3, 2))],
         [(torch.zeros(3, 5), torch.tensor([[-1, 0], [0, 0], [0, 0]]), torch.ones(3, 2))]),
        ("em", ["aten.embedding.default", "aten.mul.Tensor"],
         lambda i, w: torch.nn.functional.embedding(i, w) * 2,
         [(torch.tensor([[1, 2, 3]]), x), (torch.tensor([[0, 9, 3]]), x)],
         [(torch.tensor([[0, 10, 3]]), x), (torch.tensor([[-1, 2, 3]]), x)]),
    ]
    for tag, ops, fn, good, bad in cases:
        torch._dynamo.reset()
        _guarded(make_backend, f"ue_{tag}_{int(dynamic)}", ops, fn, good, bad, dynamic)


def test_integer_truncating_division_by_zero_is_eagers_error_not_a_dead_process():
    # Inductor's kernel divided unchecked: the process died of SIGFPE (exit 136) where
    # eager raises; the validator keeps the op off Inductor. In a child process, so a
    # regression fails this test rather than killing the run.
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import torch, arbiter
        fn = lambda a, b: torch.div(a, b, rounding_mode="trunc") + 1
        be = arbiter.Arbiter({"backends": ["inductor"], "min_block_size": 1,
                              "against_eager": "off"})
        c = torch.compile(fn, backend=be)
        assert c(torch.tensor([7, 8]), torch.tensor([2, 3])).tolist() == [4, 3]
        try:
            c(torch.tensor([7, 8]), torch.tensor([0, 3]))
        except RuntimeError as exc:
            print("raised", exc)
        (part,) = [p for g in be.report().graphs for p in g.partitions
                   if "aten.div.Tensor_mode" in p.ops]
        print("div on", part.backend)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert "raised ZeroDivisionError" in run.stdout and "div on eager" in run.stdout, \
        run.stdout
