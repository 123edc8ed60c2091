"""`torch.compile(DDP(model), backend=arbiter)` with gloo, 2 processes on CPU: Dynamo's
DDPOptimizer splits the graph at bucket boundaries and calls arbiter per bucket; the
gradients equal eager DDP's; under policy `measure` rank 0 decides and broadcasts, the
other rank installs rank 0's decision without timing anything (arbiter/run/measured.py)."""
from __future__ import annotations

import json
import os

import pytest
import torch

WORLD = 2


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Linear(16, 512), torch.nn.Linear(512, 512),
                                  torch.nn.Linear(512, 4))

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.relu(self.a(x)))))


def _rank(rank: int, store: str, out_dir: str, policy: str) -> None:
    import copy

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import arbiter
    from arbiter.run import measured

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=WORLD)
    try:
        if rank != 0:  # this rank must take rank 0's decisions, never time its own
            def refuse(self, args):
                raise AssertionError("rank 1 measured")
            measured.MeasuredGraph._measure = refuse
        torch.manual_seed(0)
        model = Net()
        ref = copy.deepcopy(model)
        # 1 MB buckets (b's weight is 1 MB): DDPOptimizer cuts the graph in subgraphs
        ddp = DDP(model, bucket_cap_mb=1)
        ddp_ref = DDP(ref, bucket_cap_mb=1)
        be = arbiter.Arbiter({"backends": ["onnxruntime", "inductor"], "min_block_size": 1,
                              "policy": policy,
                              "measure": {"repeats": 1, "max_repeats": 1, "warmup": 1,
                                          "refine": False, "progress": False},
                              "cache": {"enabled": False}})
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
        every = [None] * WORLD
        dist.all_gather_object(every, chosen)
        result = {"worst": worst, "graphs": len(report.graphs), "chosen": chosen,
                  "same_choices": all(c == every[0] for c in every),
                  "broadcast": sorted({g.measure_broadcast for g in report.graphs}),
                  "params": [float(g.sum()) for g in grads]}
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["priority", "measure"])
def test_ddp_gradients_equal_eager_ddp_and_ranks_agree(policy, tmp_path):
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    mp.spawn(_rank, args=(str(tmp_path / "store"), str(tmp_path), policy), nprocs=WORLD,
             join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for r in results:
        assert r["worst"] < 1e-5, r
        assert r["graphs"] >= 4  # forward and backward of at least two buckets
        assert r["same_choices"]
    assert results[0]["params"] == results[1]["params"]  # the ranks stay in step
    if policy == "measure":
        assert results[0]["broadcast"] == ["rank 0: broadcast"]
        assert results[1]["broadcast"] == ["from rank 0"]
    else:
        assert results[0]["broadcast"] == results[1]["broadcast"] == [""]
