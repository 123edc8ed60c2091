"""torch.distributed with gloo, 2 processes on CPU (docs/design.md, "Distributed").

* DDP: `torch.compile(DDP(model), backend=arbiter)`: Dynamo's DDPOptimizer splits the graph
  at bucket boundaries and calls arbiter per bucket; the gradients equal eager DDP's; under
  policy `measure` rank 0 decides and broadcasts, the other rank installs rank 0's decision
  without timing anything (arbiter/measure/).
* A rank whose backend fails to compile a partition falls back locally (the piece moves
  down its chain on that rank alone); the collectives stay outside the partitions, so no
  rank is left waiting; the measure broadcasts still pair up.
* FSDP2 (`fully_shard`): blocks compiled before sharding, or the sharded root after;
  FSDP2's hooks (its collectives) run outside Dynamo's graphs; gradients and outputs equal eager
  FSDP2's, and FSDP2-managed weights are never frozen (arbiter/run/lower.py).
* A collective traced into a graph (`dist.all_reduce` in the compiled code) runs in
  eager between the backends' partitions.
"""
from __future__ import annotations

import copy
import datetime
import json
import logging
import os

import pytest
import torch

WORLD = 2
#: a broken pairing of collectives fails the test instead of hanging it (generous: rank 1
#: waits in a broadcast while rank 0 compiles and times every candidate of a graph)
TIMEOUT = datetime.timedelta(seconds=600)
MEASURE = {"repeats": 1, "max_repeats": 1, "warmup": 1, "refine": False, "progress": False}
FAIL = "injected compile failure on this rank"


def _gloo():
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")


def _spawn(fn, tmp_path, *args) -> list[dict]:
    import torch.multiprocessing as mp

    _gloo()
    mp.spawn(fn, args=(str(tmp_path / "store"), str(tmp_path)) + args, nprocs=WORLD,
             join=True)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]


def _init(rank: int, store: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)  # two ranks on a shared machine
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=WORLD, timeout=TIMEOUT)


def _placements(report) -> list:
    """Per graph: its kind, the placement chosen (measure) and each partition's backend:
    what must agree between ranks."""
    return [(g.kind, g.chosen, [p.backend for p in g.partitions]) for g in report.graphs]


def _fail_tanh_compiles(also_inductor: bool) -> None:
    """This rank's ONNX Runtime (and Inductor) raise when asked to compile a partition
    holding tanh."""
    from arbiter.backends.inductor import Inductor
    from arbiter.backends.onnxruntime import OnnxRuntime

    for cls in (OnnxRuntime, Inductor) if also_inductor else (OnnxRuntime,):
        def failing(self, gm, example_inputs, _compile=cls.compile):
            if any(n.target is torch.ops.aten.tanh.default for n in gm.graph.nodes):
                raise RuntimeError(FAIL)
            return _compile(self, gm, example_inputs)
        cls.compile = failing


def _arbiter(policy: str):
    """``policy``, or ``policy/against_eager`` (``priority/off``: the plan untimed)."""
    import arbiter

    name, _, against = policy.partition("/")
    return arbiter.Arbiter({"backends": ["onnxruntime", "inductor"], "min_block_size": 1,
                            "policy": name, "measure": MEASURE,
                            "against_eager": against or "training",
                            "cache": {"enabled": False}})


def _gather(obj) -> list:
    import torch.distributed as dist

    every = [None] * WORLD
    dist.all_gather_object(every, obj)
    return every


# -- DDP ------------------------------------------------------------------------------
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Linear(16, 512), torch.nn.Linear(512, 512),
                                  torch.nn.Linear(512, 4))

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.relu(self.a(x)))))


def _ddp_rank(rank: int, store: str, out_dir: str, policy: str, fail_rank: int) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from arbiter.measure.graph import MeasuredGraph

    _init(rank, store)
    try:
        if rank != 0:  # this rank must take rank 0's decisions, never time its own
            def refuse(self, args):
                raise AssertionError("rank 1 measured")
            MeasuredGraph._measure = refuse
        if fail_rank >= 0:
            # rank 0 measures, then picks `priority` (ONNX Runtime first): the decision
            # names the failing backend whatever the timings say
            MeasuredGraph._pick = lambda self, lowered=True: next(
                c for c in self.candidates if c.label == "priority")
        if rank == fail_rank:  # rank 0 measures: one backend left to choose from
            _fail_tanh_compiles(also_inductor=rank != 0)
        torch.manual_seed(0)
        model = Net()
        ref = copy.deepcopy(model)
        # 1 MB buckets (b's weight is 1 MB): DDPOptimizer cuts the graph in subgraphs
        ddp = DDP(model, bucket_cap_mb=1)
        ddp_ref = DDP(ref, bucket_cap_mb=1)
        be = _arbiter(policy)
        compiled = torch.compile(ddp, backend=be)
        worst = 0.0
        for step in range(2):
            torch.manual_seed(100 * step + rank)  # each rank its own data
            x = torch.randn(8, 16)
            compiled(x).pow(2).mean().backward()
            ddp_ref(x).pow(2).mean().backward()
            for p, q in zip(model.parameters(), ref.parameters()):
                worst = max(worst, (p.grad - q.grad).abs().max().item())
                p.grad = q.grad = None
        grads = [p.detach().clone() for p in model.parameters()]
        report = be.report(advice=False)
        chosen = [(g.kind, g.chosen) for g in report.graphs]
        every = _gather(chosen)
        fallbacks = [(f.from_backend, f.to_backend, f.stage, f.reason) for g in report.graphs
                     for p in g.partitions for f in p.fallbacks]
        result = {"worst": worst, "graphs": len(report.graphs), "chosen": chosen,
                  "same_choices": all(c == every[0] for c in every),
                  "placements": _placements(report), "fallbacks": fallbacks,
                  "broadcast": sorted({g.measure_broadcast for g in report.graphs}),
                  "params": [float(g.sum()) for g in grads]}
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["priority", "priority/off", "measure"])
def test_ddp_gradients_equal_eager_ddp_and_ranks_agree(policy, tmp_path):
    """Under `measure`, and `priority` timed against eager (the default), rank 0 decides
    and broadcasts; `priority` untimed decides from the graph alone, on every rank."""
    results = _spawn(_ddp_rank, tmp_path, policy, -1)
    for r in results:
        assert r["worst"] < 1e-5, r
        assert r["graphs"] >= 4  # forward and backward of at least two buckets
        assert r["same_choices"]
        assert not r["fallbacks"], r["fallbacks"]
    assert results[0]["placements"] == results[1]["placements"]
    assert results[0]["params"] == results[1]["params"]  # the ranks stay in step
    if policy != "priority/off":
        assert results[0]["broadcast"] == ["rank 0: broadcast"]
        assert results[1]["broadcast"] == ["from rank 0"]
    else:
        assert results[0]["broadcast"] == results[1]["broadcast"] == [""]


@pytest.mark.slow
@pytest.mark.parametrize("policy,fail_rank", [("priority", 1), ("measure", 1),
                                              ("measure", 0)])
def test_a_rank_whose_backend_fails_falls_back_alone_and_the_step_completes(
        policy, fail_rank, tmp_path):
    """One rank's backends fail to compile the partition holding tanh (rank 1: ONNX
    Runtime and Inductor, whichever rank 0's decision names; rank 0: ONNX Runtime): that
    rank alone moves the partition down its chain (to eager); both ranks finish both steps
    (DDP's all-reduces are outside the partitions), with gradients equal to eager DDP's,
    and under `measure` the broadcasts still pair up: rank 0's failing piece falls back
    while it measures, and the label it broadcasts is built by rank 1 with rank 1's own
    backends; rank 1 fails after installing rank 0's decision."""
    results = _spawn(_ddp_rank, tmp_path, policy, fail_rank)
    for r in results:
        assert r["worst"] < 1e-5, r
        assert r["same_choices"]  # the decisions agree; what ran can differ
    assert results[0]["params"] == pytest.approx(results[1]["params"], abs=1e-4)
    failed, other = results[fail_rank], results[1 - fail_rank]
    assert not other["fallbacks"], other["fallbacks"]
    assert all(f[2] == "compile" and FAIL in f[3] for f in failed["fallbacks"]), \
        failed["fallbacks"]
    if policy == "measure":
        assert results[0]["broadcast"] == ["rank 0: broadcast"]
        assert results[1]["broadcast"] == ["from rank 0"]
    if fail_rank == 1:  # rank 0's decision named a failing backend: eager on rank 1
        assert any(f[1] == "eager" for f in failed["fallbacks"]), failed["fallbacks"]
        assert failed["placements"] != other["placements"]  # the fallback is local
    else:  # rank 0's piece fell back to Inductor while measuring, and rank 0 chose its
        # candidate; rank 1 built the same candidate and compiled it on ONNX Runtime
        assert failed["fallbacks"] and all(f[1] == "inductor" for f in failed["fallbacks"])
        assert failed["placements"] != other["placements"]


# -- FSDP2 ----------------------------------------------------------------------------
class Block(torch.nn.Module):
    def __init__(self, d: int = 32, h: int = 128):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.fc1, self.fc2 = torch.nn.Linear(d, h), torch.nn.Linear(h, d)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(self.norm(x))))


class Stack(torch.nn.Module):
    def __init__(self, blocks: int = 3):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(blocks))
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _shard(model: Stack, backend=None, how: str = "before") -> Stack:
    """FSDP2 per block, then the root. With ``backend``: ``before``: each block compiled
    before it is sharded; ``after``: the sharded root compiled (returned compiled)."""
    from torch.distributed.fsdp import fully_shard

    for i, block in enumerate(model.blocks):
        if backend is not None and how == "before":
            model.blocks[i] = torch.compile(block, backend=backend)
        fully_shard(model.blocks[i])
    fully_shard(model)
    if backend is not None and how == "after":
        return torch.compile(model, backend=backend)
    return model


def _fsdp_rank(rank: int, store: str, out_dir: str, policy: str, how: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    _init(rank, store)
    try:
        torch.manual_seed(0)
        model = Stack()
        ref = copy.deepcopy(model)
        be = _arbiter(policy)
        run = _shard(model, be, how)
        _shard(ref)
        sharded = all(isinstance(p, DTensor) for p in model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        worst_grad = worst_out = 0.0
        for step in range(2):
            torch.manual_seed(100 * step + rank)  # each rank its own data
            x = torch.randn(8, 32)
            with torch.no_grad():  # an inference graph, before and after a step
                worst_out = max(worst_out, (run(x) - ref(x)).abs().max().item())
            run(x).pow(2).mean().backward()
            ref(x).pow(2).mean().backward()
            for p, q in zip(model.parameters(), ref.parameters()):  # sharded: gathered
                worst_grad = max(worst_grad,
                                 (p.grad.full_tensor() - q.grad.full_tensor()).abs().max().item())
            opt.step()
            opt_ref.step()
            opt.zero_grad()
            opt_ref.zero_grad()
        worst_param = max((p.full_tensor() - q.full_tensor()).abs().max().item()
                          for p, q in zip(model.parameters(), ref.parameters()))
        report = be.report(advice=False)
        placements = _placements(report)
        every = _gather(placements)
        result = {"worst_grad": worst_grad, "worst_out": worst_out,
                  "worst_param": worst_param, "sharded": sharded,
                  "kinds": sorted({g.kind for g in report.graphs}),
                  "ops": sorted({op for g in report.graphs for p in g.partitions
                                 for op in p.ops}),
                  "constants": sum(g.constants for g in report.graphs),
                  "on_backends": sorted({p.backend for g in report.graphs
                                         for p in g.partitions}),
                  "same_placements": all(p == every[0] for p in every),
                  "broadcast": sorted({g.measure_broadcast for g in report.graphs})}
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("policy,how", [("priority", "before"), ("measure", "before"),
                                        ("priority", "after")])
def test_fsdp2_blocks_compiled_equal_eager_fsdp2_and_ranks_agree(policy, how, tmp_path):
    """Blocks compiled before `fully_shard`, or the sharded root compiled after it: either
    way Dynamo breaks the graph at FSDP2's hooks (`torch._dynamo.disable` in torch 2.13),
    so each block's forward is a graph of its own with no collective in it, and the
    all-gathers and reduce-scatters run in eager between graphs (compiled after, the
    root's loop over blocks is skipped whole: its head runs in eager)."""
    results = _spawn(_fsdp_rank, tmp_path, policy, how)
    for r in results:
        assert r["sharded"]
        assert r["worst_grad"] < 1e-5, r
        assert r["worst_out"] < 1e-5, r
        assert r["worst_param"] < 1e-5, r
        assert r["kinds"] == ["backward", "forward", "inference"]
        assert "aten.tanh.default" in r["ops"]
        assert not [op for op in r["ops"] if "c10d" in op], r["ops"]
        assert r["constants"] == 0  # FSDP2's weights are never frozen
        assert r["same_placements"]
        if policy == "priority":  # compiled, not all eager (measure may pick eager)
            assert "onnxruntime" in r["on_backends"]
    if policy == "measure":
        assert results[0]["broadcast"] == ["rank 0: broadcast"]
        assert results[1]["broadcast"] == ["from rank 0"]


# -- a collective inside a graph --------------------------------------------------------
def _collective_rank(rank: int, store: str, out_dir: str) -> None:
    import torch.distributed as dist

    _init(rank, store)
    try:
        torch.manual_seed(0)
        lin = torch.nn.Linear(8, 8)

        def f(x):
            y = torch.tanh(lin(x))
            dist.all_reduce(y)  # traced by Dynamo as _c10d_functional.all_reduce + wait
            return y * 2

        be = _arbiter("priority")
        x = torch.randn(4, 8) + rank
        with torch.no_grad():
            out = torch.compile(f, backend=be)(x)
            ref = f(x)
        parts = [(p.backend, sorted(p.ops)) for g in be.report(advice=False).graphs
                 for p in g.partitions]
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f_:
            json.dump({"worst": (out - ref).abs().max().item(), "parts": parts}, f_)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_collective_inside_a_graph_runs_in_eager_between_backends(tmp_path):
    """No manifest lists a collective (`_c10d_functional.*`), so one traced into a graph
    runs in eager ATen between the backends' partitions, on every rank alike."""
    results = _spawn(_collective_rank, tmp_path)
    assert results[0]["parts"] == results[1]["parts"]
    for r in results:
        assert r["worst"] < 1e-5, r
        for backend, ops in r["parts"]:
            if any("c10d" in op for op in ops):
                assert backend == "eager", r["parts"]
        assert any(backend == "onnxruntime" for backend, _ in r["parts"])
        assert any(any("all_reduce" in op for op in ops) for _, ops in r["parts"])


# -- not distributed: FSDP2-managed weights are not frozen ------------------------------
def test_fsdp_managed_weights_are_not_frozen(caplog):
    """A module marked as FSDP2 marks the modules it manages (`_is_fsdp_managed_module`):
    its inference graphs take their weights as inputs, with a warning; unmarked, the
    same module's weights are frozen."""
    import importlib

    lower = importlib.import_module("arbiter.run.lower")
    def constants(marked: bool) -> int:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
        if marked:
            model[0]._is_fsdp_managed_module = True  # as fully_shard marks them
            model[0]._fsdp_use_orig_params = True
        be = _arbiter("priority")
        x = torch.randn(2, 8)
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(model, backend=be)(x), model(x))
        graphs = be.report(advice=False).graphs
        assert [g.kind for g in graphs] == ["inference"]
        return graphs[0].constants

    lower._fsdp_warned = False
    with caplog.at_level(logging.WARNING, logger="arbiter.run.lower"):
        assert constants(marked=False) == 2
        assert not caplog.records
        assert constants(marked=True) == 0
    assert "FSDP2" in caplog.text
    torch._dynamo.reset()
