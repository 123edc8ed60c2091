"""Threads: one compiled model called from 8 threads at once (first call included, so
the lazy compiles race too); two models compiled in two threads at once; a run-time
failure hit by many threads at once demotes the piece exactly once."""
from __future__ import annotations

import threading

import torch

import arbiter

from conftest import TWO

OPS = ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"]


def _run_threads(n: int, target) -> list:
    """Start ``n`` threads at once (behind a barrier); re-raise the first error."""
    barrier = threading.Barrier(n)
    errors: list = []
    results: list = [None] * n

    def body(i):
        try:
            barrier.wait()
            results[i] = target(i)
        except BaseException as exc:  # noqa: BLE001 - collected and re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung (deadlock?)"
    if errors:
        raise errors[0]
    return results


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 8)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.a(x))
        return torch.softmax(self.b(h) * 0.5, dim=-1).cumsum(-1)


def test_one_model_called_from_8_threads(fresh_dynamo):
    torch.manual_seed(0)
    model = Block().eval()
    be = arbiter.Arbiter(dict(TWO, pin={"aten.cumsum": "inductor"}))
    compiled = torch.compile(model, backend=be)
    inputs = [torch.randn(4, 16) for _ in range(8)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]

    def work(i):
        with torch.no_grad():
            for k in range(10):
                j = (i + k) % 8
                torch.testing.assert_close(compiled(inputs[j]), expected[j])
        return True

    assert _run_threads(8, work) == [True] * 8
    parts = [p for g in be.report().graphs for p in g.partitions]
    assert {p.backend for p in parts} >= {"onnxruntime", "inductor"}, str(be.report())
    assert not any(p.fallbacks for p in parts), str(be.report())
    # Dynamo may compile the frame in several of the racing threads (it checks its cache
    # before taking its compile lock): each graph must then be complete and right.
    assert 1 <= len(be.report().graphs) <= 8


def test_two_models_compiled_in_two_threads(fresh_dynamo):
    torch.manual_seed(0)
    models = [Block().eval(), torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(),
                                                  torch.nn.Linear(16, 4)).eval()]
    arbiters = [arbiter.Arbiter(TWO), arbiter.Arbiter({"backends": ["inductor", "onnxruntime"],
                                                       "min_block_size": 1})]
    x = torch.randn(3, 16)

    def work(i):
        with torch.no_grad():
            out = torch.compile(models[i], backend=arbiters[i])(x)
            torch.testing.assert_close(out, models[i](x))
        return out

    _run_threads(2, work)
    for be in arbiters:
        rep = be.report()
        assert len(rep.graphs) == 1
        assert not any(p.fallbacks for g in rep.graphs for p in g.partitions), str(rep)
    # shared state still sound: the registry and a fresh compile work
    assert {"onnxruntime", "inductor", "eager"} <= set(arbiter.backend_names())
    torch._dynamo.reset()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(models[1], backend=arbiter.Arbiter(TWO))(x),
                                   models[1](x))


def test_run_failure_hit_by_8_threads_demotes_once(make_backend, fresh_dynamo):
    gate = threading.Barrier(8, timeout=30)

    def compile(self, gm, example_inputs):
        calls = [0]

        def fn(*args):
            calls[0] += 1
            if calls[0] == 1:
                return gm(*args)  # the warm-up call (single thread) works
            try:
                gate.wait()  # all 8 threads inside the failing backend at once
            except threading.BrokenBarrierError:
                pass
            raise RuntimeError("injected: fails under load")
        return fn

    make_backend("flaky", OPS, compile=compile)
    good = make_backend("good", OPS)
    # run-time failures alone: no first-use check (its second call would fail first)
    be = arbiter.Arbiter({"backends": ["flaky", "good"], "min_block_size": 1,
                          "verify": {"mode": "off"}})
    compiled = torch.compile(lambda x: torch.relu(x) * 2 + x, backend=be)
    warm = torch.randn(4, 4)
    torch.testing.assert_close(compiled(warm), torch.relu(warm) * 2 + warm)
    xs = [torch.randn(4, 4) for _ in range(8)]
    outs = _run_threads(8, lambda i: compiled(xs[i]))
    for x, out in zip(xs, outs):
        torch.testing.assert_close(out, torch.relu(x) * 2 + x)
    (p,) = [p for g in be.report().graphs for p in g.partitions]
    assert p.backend == "good"
    # eight threads failed at once; the piece moved down one step, not eight
    assert [(fb.from_backend, fb.to_backend, fb.stage) for fb in p.fallbacks] == [
        ("flaky", "good", "run")]
    assert len(good.compiled) == 1
