"""How long planning takes as graphs grow: arbiter's partitioner vs. PyTorch's
``CapabilityBasedPartitioner``.

Synthetic ATen FX graphs, chain with branches: node ``i`` reads node ``i-1`` and, every
other node, also node ``i-3`` or a graph input. Every node carries a FakeTensor in
``meta["val"]`` (one shared FakeTensor, cpu, float32, shape (8, 16): building stays cheap
and capability checks see real metadata). In each block of 50 nodes:

* 10 nodes are ``aten.sigmoid``, pinned to inductor by the config,
* 1 node is ``aten.tanh``, excluded by the config (only eager runs it),
* the other 39 are ``aten.add`` / ``aten.mul`` / ``aten.relu``, which go to onnxruntime,

so all three backends share every graph. The config is
``{"backends": ["onnxruntime", "inductor"], "pin": {"aten.sigmoid": "inductor"},
"exclude_ops": ["aten.tanh"], "min_block_size": 3}``.

Timed: ``Arbiter(config, dry_run=True).plan(gm)`` (what ``arbiter.partition`` runs), median
of 5 runs after one warm-up, wall clock and CPU (process) time. The capability cache
lives in the ``Arbiter``, so a fresh ``Arbiter`` is made per run and every run starts
cold (construction, which loads the manifests, is not timed). PyTorch's partitioner is timed once
(one backend: supports everything but ``aten.tanh``) at 1,000 and 5,000 nodes only: it is
superlinear.

Checked (asserts, every size): every compute node is in exactly one partition, each
partition's backend can run its nodes, and the partition graph is acyclic.

    .venv/bin/python bench/partition_scaling.py [--sizes 1000 5000 20000 100000] [--no-torch]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.fx  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import arbiter  # noqa: E402

aten = torch.ops.aten

CONFIG = {
    "backends": ["onnxruntime", "inductor"],
    "pin": {"aten.sigmoid": "inductor"},
    "exclude_ops": ["aten.tanh"],
    "min_block_size": 3,
}
BLOCK = 50
INDUCTOR = range(20, 30)   # positions in a block that are sigmoid (inductor)
EAGER = BLOCK - 1          # the position in a block that is tanh (eager only)


class _Light:
    """Just enough of a GraphModule for the partitioner (it only reads ``.graph``):
    building the real GraphModule of a 100,000 node graph means generating its Python
    code, which is not what is measured here."""

    def __init__(self, graph: torch.fx.Graph):
        self.graph = graph


def build_graph(n: int, fake: torch.Tensor) -> torch.fx.Graph:
    g = torch.fx.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y")
    x.meta["val"] = fake
    y.meta["val"] = fake
    made = []
    for i in range(n):
        pos = i % BLOCK
        prev = made[-1] if made else x
        if pos == EAGER:
            node = g.call_function(aten.tanh.default, (prev,))
        elif pos in INDUCTOR:
            node = g.call_function(aten.sigmoid.default, (prev,))
        elif i % 2:
            other = made[-3] if len(made) >= 3 else y
            target = aten.add.Tensor if i % 4 == 1 else aten.mul.Tensor
            node = g.call_function(target, (prev, other))
        else:
            node = g.call_function(aten.relu.default, (prev,))
        node.meta["val"] = fake
        made.append(node)
    g.output((made[-1],))
    return g


def check_plan(plan, graph: torch.fx.Graph, support) -> dict:
    """Every compute node once; each backend able to run its nodes; acyclic."""
    compute = [n for n in graph.nodes if n.op == "call_function"]
    part_of = {}
    for p in plan.partitions:
        for node in p.nodes:
            assert node not in part_of, f"{node.name} in two partitions"
            part_of[node] = p.id
            assert p.backend in support[node].candidates, (node.name, p.backend)
    assert len(part_of) == len(compute), (len(part_of), len(compute))
    # Partition graph: edge p -> q when a node of q reads a node of p. Acyclic iff the
    # DFS below finds no back edge (iterative: 100,000 node graphs give deep chains).
    edges: dict[int, set] = {p.id: set() for p in plan.partitions}
    for node in compute:
        q = part_of[node]
        for inp in node.all_input_nodes:
            p = part_of.get(inp)
            if p is not None and p != q:
                edges[p].add(q)
    color = dict.fromkeys(edges, 0)
    for root in edges:
        if color[root]:
            continue
        stack = [(root, iter(edges[root]))]
        color[root] = 1
        while stack:
            v, it = stack[-1]
            for w in it:
                assert color[w] != 1, "partition graph has a cycle"
                if color[w] == 0:
                    color[w] = 1
                    stack.append((w, iter(edges[w])))
                    break
            else:
                color[v] = 2
                stack.pop()
    counts: dict[str, int] = {}
    for p in plan.partitions:
        counts[p.backend] = counts.get(p.backend, 0) + 1
    return counts


def time_arbiter(gm, repeats: int) -> tuple[float, float, object]:
    """Median wall and CPU (process) seconds of ``plan``; CPU time shows what the planner
    costs when other processes share the machine."""
    runs, cpu = [], []
    plan = None
    for k in range(repeats + 1):  # the first is the warm-up
        be = arbiter.Arbiter(CONFIG, dry_run=True)
        start, start_cpu = time.perf_counter(), time.process_time()
        plan = be.plan(gm)
        elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        if k:
            runs.append(elapsed)
            cpu.append(elapsed_cpu)
    return statistics.median(runs), statistics.median(cpu), plan


def time_torch(gm) -> tuple[float, int]:
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupport

    class NotTanh(OperatorSupport):
        def is_node_supported(self, submodules, node):
            return node.op == "call_function" and node.target is not aten.tanh.default

    start = time.perf_counter()
    parts = CapabilityBasedPartitioner(gm, NotTanh(), allows_single_node_partition=True
                                       ).propose_partitions()
    return time.perf_counter() - start, len(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 20000, 100000])
    ap.add_argument("--torch-sizes", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch's partitioner")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(2)

    with FakeTensorMode():
        fake = torch.empty(8, 16)
    print(f"torch {torch.__version__}; load average {os.getloadavg()[0]:.2f} "
          f"{os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}; {os.cpu_count()} cpus")
    print(f"{'nodes':>8} {'partitions (onnxruntime/inductor/eager)':>40} "
          f"{'arbiter ms':>11} {'cpu ms':>7} {'us/node':>8} {'torch CBP ms':>13} {'ratio':>7}")
    for n in args.sizes:
        graph = build_graph(n, fake)
        light = _Light(graph)
        t, t_cpu, plan = time_arbiter(light, args.repeats)
        counts = check_plan(plan, graph, plan.support)
        split = "/".join(str(counts.get(b, 0)) for b in ("onnxruntime", "inductor", "eager"))
        torch_col = ratio = "-"
        if not args.no_torch and n in args.torch_sizes:
            gm = torch.fx.GraphModule(torch.nn.Module(), graph)
            tt, _ = time_torch(gm)
            torch_col, ratio = f"{tt * 1e3:.0f}", f"{tt / t:.0f}x"
        print(f"{n:>8} {len(plan.partitions):>7} ({split:>30}) {t * 1e3:>11.1f} {t_cpu * 1e3:>7.1f} "
              f"{t / n * 1e6:>8.2f} {torch_col:>13} {ratio:>7}", flush=True)
        if n >= 100000:
            verdict = "met" if t < 1.0 else "MISSED"
            print(f"target (100,000 nodes, 3 backends, < 1 s): {verdict} ({t:.3f} s)")


if __name__ == "__main__":
    main()
