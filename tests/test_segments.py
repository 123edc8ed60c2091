"""Segments at module boundaries and the chain dynamic program (arbiter/plan/segments.py),
with made-up module stacks and costs; the end-to-end mixed candidate is in
tests/test_policy.py."""
from __future__ import annotations

import itertools
import math
import random

import pytest

from arbiter.plan.segments import (NodeInfo, Segment, SegmentTimes, best_chain, choose_depth,
                                   pair_kind, probe_layouts, segment, skip_edges)

ROOT = ("m", "Model")


def _layer(i: int, prev: str) -> tuple[list[NodeInfo], str]:
    """A transformer-like layer: attention (3 nodes), then an MLP (2 nodes), each a
    module at depth 4 under Model > Encoder > Layer; a reshape directly in the layer."""
    layer = (f"m.enc.layer.{i}", "Layer")
    attn = layer, (f"m.enc.layer.{i}.attn", "Attention")
    mlp = layer, (f"m.enc.layer.{i}.mlp", "MLP")
    enc = (ROOT, ("m.enc", "Encoder"))
    lin = (f"m.enc.layer.{i}.attn.q", "Linear")
    nodes = [
        NodeInfo(f"q{i}", enc + attn + (lin,), ("addmm", (1, 8)), (prev,)),
        NodeInfo(f"sm{i}", enc + attn, ("softmax", (1, 8)), (f"q{i}", "mask")),
        NodeInfo(f"o{i}", enc + attn, ("add", (1, 8)), (f"sm{i}", prev)),
        NodeInfo(f"v{i}", enc + (layer,), ("view", (8,)), (f"o{i}",)),  # in the layer itself
        NodeInfo(f"up{i}", enc + mlp, ("addmm", (1, 32)), (f"v{i}",)),
        NodeInfo(f"dn{i}", enc + mlp, ("addmm", (1, 8)), (f"up{i}",)),
    ]
    return nodes, f"dn{i}"


def _model(layers: int = 3) -> list[NodeInfo]:
    emb = (ROOT, ("m.emb", "Embeddings"))
    nodes = [NodeInfo("ids", (), ("view", (1,)), ()),  # top-level code first
             NodeInfo("gather", emb + (("m.emb.word", "Embedding"),), ("embedding", (1, 8)),
                      ("ids",)),
             NodeInfo("norm", emb + (("m.emb.norm", "LayerNorm"),), ("layer_norm", (1, 8)),
                      ("gather",)),
             NodeInfo("mask", (ROOT,), ("ones", (1, 8)), ())]  # top level, read by every layer
    prev = "norm"
    for i in range(layers):
        more, prev = _layer(i, prev)
        nodes += more
    return nodes


def test_segments_cut_at_the_modules_of_a_depth_and_repeated_blocks_share_a_kind():
    nodes = _model(3)
    segs = segment(nodes, 4)
    # the embeddings have nothing at depth 4: one unit; top-level code joins its neighbour
    assert [s.path for s in segs] == ["m.emb"] + [f"m.enc.layer.{i}.{b}" for i in range(3)
                                                  for b in ("attn", "mlp")]
    assert segs[0].nodes == ("ids", "gather", "norm", "mask")
    assert segs[1].nodes == ("q0", "sm0", "o0", "v0")  # the layer's own view: glue, before
    assert segs[2].nodes == ("up0", "dn0")
    assert [s.index for s in segs] == list(range(7))
    # every node in exactly one segment, in graph order
    assert [n for s in segs for n in s.nodes] == [n.name for n in nodes]
    kinds = [s.kind for s in segs]
    assert kinds[1] == kinds[3] == kinds[5] and kinds[2] == kinds[4] == kinds[6]
    assert len(set(kinds)) == 3
    # depth 3: one segment per layer; the embeddings' modules are at depth 3 now
    three = segment(nodes, 3)
    assert [s.path for s in three] == ["m.emb.word", "m.emb.norm"] + [f"m.enc.layer.{i}"
                                                                      for i in range(3)]
    assert three[1].nodes == ("norm", "mask")
    with pytest.raises(ValueError, match="at least 1"):
        segment(nodes, 0)


def test_runs_smaller_than_min_nodes_join_their_neighbour():
    nodes = _model(2)
    # at depth 4 each attention has 4 nodes, each MLP 2: with min_nodes 3 the MLPs join
    segs = segment(nodes, 4, min_nodes=3)
    assert [s.path for s in segs] == ["m.emb", "m.enc.layer.0.attn", "m.enc.layer.1.attn"]
    assert segs[1].nodes == ("q0", "sm0", "o0", "v0", "up0", "dn0")
    assert [n for s in segs for n in s.nodes] == [n.name for n in nodes]
    assert segs[1].kind != segment(nodes, 4)[1].kind  # the merged run is its own kind
    # a small first run joins the next one
    first = segment(nodes[1:], 4, min_nodes=3)  # embeddings: gather, norm, mask (3 nodes)
    assert first[0].path == "m.emb" and len(first) == 3
    small = segment(nodes[2:], 4, min_nodes=3)  # embeddings now 2 nodes: into layer 0
    assert small[0].nodes[:2] == ("norm", "mask") and small[0].path == "m.enc.layer.0.attn"
    assert choose_depth(nodes, 48, min_nodes=3) == 5
    assert len(segment(nodes, 5, min_nodes=3)) == 3
    # the depth is judged by the modules' own runs (5 at depths 4 and 5), not the merged
    assert choose_depth(nodes, 4, min_nodes=3) == 3


def test_a_different_shape_or_wiring_is_another_kind():
    nodes = _model(2)
    wider = [NodeInfo(n.name, n.stack, ("addmm", (1, 64)) if n.name == "up1" else n.signature,
                      n.inputs) for n in nodes]
    segs = segment(wider, 4)
    assert segs[1].kind == segs[3].kind and segs[2].kind != segs[4].kind
    rewired = [NodeInfo(n.name, n.stack, n.signature, ("up1",) if n.name == "dn1" else
                        ("v1",) if n.name == "up1" else n.inputs) for n in nodes]
    segs = segment(rewired, 4)
    assert segs[2].kind == segs[4].kind  # same wiring written the same way
    swapped = [NodeInfo(n.name, n.stack, n.signature, ("v1",) if n.name == "dn1" else n.inputs)
               for n in nodes]
    assert segment(swapped, 4)[2].kind != segment(swapped, 4)[4].kind


def test_choose_depth_takes_the_deepest_within_the_limit():
    nodes = _model(3)
    counts = {d: len(segment(nodes, d)) for d in range(1, 6)}
    assert counts == {1: 1, 2: 2, 3: 5, 4: 7, 5: 7}
    assert choose_depth(nodes, 7) == 5
    assert choose_depth(nodes, 6) == 3
    assert choose_depth(nodes, 2) == 2
    assert choose_depth(nodes, 1) is None
    flat = [NodeInfo(f"n{i}", (), ("add", ()), ()) for i in range(5)]  # no modules
    assert choose_depth(flat, 10) is None


def test_skip_edges_count_reads_from_further_back():
    nodes = _model(3)
    segs = segment(nodes, 4)
    # every attention reads the mask (segment 0): layer 0's is adjacent, layers 1 and 2 skip
    assert skip_edges(nodes, segs) == 2


def test_probe_layouts_cover_every_kind_and_pair_without_overlap():
    segs = segment(_model(4), 4)
    layouts = probe_layouts(segs)
    singles = {segs[i].kind for lay in layouts for (i, *more) in lay if not more}
    pairs = {pair_kind(segs, inst[0]) for lay in layouts for inst in lay if len(inst) == 2}
    assert singles == {s.kind for s in segs}
    assert pairs == {pair_kind(segs, i) for i in range(len(segs) - 1)}
    for lay in layouts:
        flat = [i for inst in lay for i in inst]
        assert len(flat) == len(set(flat))
    assert len(layouts) <= 2  # 3 kinds and 3 pair kinds fit in two over 9 segments
    assert all(len(inst) == 1 for lay in probe_layouts(segs, pairs=False) for inst in lay)


def test_best_chain_takes_each_segments_cheapest_when_boundaries_are_free():
    costs = [{"a": 1, "b": 2}, {"a": 5, "b": 1}, {"a": 1, "b": 3}]
    total, path = best_chain(costs, lambda i, a, b: 0.0)
    assert (total, path) == (3, ["a", "b", "a"])


def test_boundary_costs_change_the_choice():
    costs = [{"a": 1, "b": 2}, {"a": 5, "b": 1}, {"a": 1, "b": 3}]
    # a switch costs 1: a-b-a and b-b-a both cost 5; the one with fewer switches wins
    assert best_chain(costs, lambda i, a, b: 1.0) == (5, ["b", "b", "a"])
    assert best_chain(costs, lambda i, a, b: 0.5) == (4, ["a", "b", "a"])
    # a switch costs 3: staying on a (7) beats a-b-a (3 + 6) and b throughout (6)
    assert best_chain(costs, lambda i, a, b: 3.0) == (6, ["b", "b", "b"])
    # boundaries priced per position and direction
    assert best_chain(costs, lambda i, a, b: 10.0 if (i, a) == (1, "b") else 0.0) == \
        (5, ["a", "b", "b"])


def test_best_chain_ties_and_impossible_placements():
    costs = [{"a": 1, "b": 1}, {"a": 1, "b": 1}]
    assert best_chain(costs, lambda i, a, b: 0.0) == (2, ["a", "a"])  # no switch, first
    costs = [{"a": 1, "b": 1}, {"b": 1, "a": 1}]
    assert best_chain(costs, lambda i, a, b: 0.0)[1] == ["b", "b"]
    costs = [{"a": 1, "b": 2}, {"a": math.inf, "b": 2}, {"a": 1}]
    assert best_chain(costs, lambda i, a, b: 0.5) == (5, ["a", "b", "a"])
    with pytest.raises(ValueError, match="segment 1"):
        best_chain([{"a": 1}, {"a": math.inf}], lambda i, a, b: 0.0)
    assert best_chain([], lambda i, a, b: 0.0) == (0.0, [])


def test_best_chain_matches_brute_force():
    rng = random.Random(0)
    for _ in range(200):
        n, backends = rng.randint(1, 6), ["a", "b", "c"][:rng.randint(1, 3)]
        costs = [{b: rng.choice([rng.uniform(0, 5), math.inf]) if k else rng.uniform(0, 5)
                  for k, b in enumerate(backends)} for _ in range(n)]
        table = {(i, a, b): rng.uniform(-0.5, 3) for i in range(n) for a in backends
                 for b in backends}
        total, path = best_chain(costs, lambda i, a, b: table[i, a, b])

        def cost(p):
            return sum(costs[i][b] for i, b in enumerate(p)) + sum(
                table[i, p[i], p[i + 1]] for i in range(n - 1) if p[i] != p[i + 1])

        brute = min(cost(p) for p in itertools.product(backends, repeat=n))
        assert total == pytest.approx(brute) and cost(path) == pytest.approx(total)


def test_segment_times_oracle_is_the_sum_of_each_segments_fastest():
    """SegmentTimes (outcome.mix): the fastest backend per segment by its kind's time,
    each backend's sum, and the oracle, the sum of the fastest; a segment measured on no
    backend leaves the oracle undefined, a backend missing one segment has no sum."""
    segs = tuple(Segment(i, f"m.{i}", cls, (f"n{i}",), cls)
                 for i, cls in enumerate(["Emb", "Attn", "MLP", "Attn", "MLP"]))
    single = {("Emb", "a"): 1.0, ("Emb", "b"): 0.5, ("Attn", "a"): 2.0, ("Attn", "b"): 3.0,
              ("MLP", "a"): 4.0, ("MLP", "b"): 3.5}
    t = SegmentTimes(2, segs, single)
    assert t.on(segs[1]) == {"a": 2.0, "b": 3.0}
    assert t.fastest() == [("b", 0.5), ("a", 2.0), ("b", 3.5), ("a", 2.0), ("b", 3.5)]
    assert t.alone_ms("a") == 13.0 and t.alone_ms("b") == 13.5
    assert t.oracle_ms() == pytest.approx(11.5)
    # the oracle is never above any backend's own sum, and equals the DP without boundaries
    total, _ = best_chain([t.on(s) for s in segs], lambda i, a, b: 0.0)
    assert t.oracle_ms() == pytest.approx(total)
    assert t.oracle_ms() <= min(t.alone_ms("a"), t.alone_ms("b"))
    del single[("Emb", "a")]
    t = SegmentTimes(2, segs, single)
    assert t.alone_ms("a") is None and t.oracle_ms() == pytest.approx(11.5)
    del single[("Emb", "b")]
    t = SegmentTimes(2, segs, single)
    assert t.fastest()[0] is None and t.oracle_ms() is None
