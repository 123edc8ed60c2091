"""How a training step's graphs are partitioned: forward and backward partitions per
backend, nodes left to eager, first-step time, and the gradients checked against eager.

Variants (`--variants`), under a config (default: the shipped `default`, ONNX Runtime
then Inductor): `none`, ONNX Runtime's manifest without its `decompositions:` (what the
backward graphs got before per-backend decompositions, arbiter/decompose/); `whole`,
with them as on 2026-11-23 (each `native_dropout` whole, before
`decompose.split_dropout` drew dropout masks apart from the data, and grouped/transposed
`convolution_backward` whole); `split`, arbiter as shipped. Models: the demo's
GPT-2 (`gpt2_tiny`, 2 layers), a BERT-style encoder (transformers' BertModel, hidden
256, 4 layers; `--seq`, `--batch`), `mobilenet_v2` (96x96, batch 4) and `resnet18` (64x64,
batch 8), all in train mode (dropout on, batch norm with batch statistics).

    .venv/bin/python bench/training_partitions.py [--models gpt2_tiny bert] [--config default]
        [--variants none whole split] [--steps 5]

`--steps N` times N steps after the first (forward and backward) and gives their median.
Each run starts with an empty arbiter cache (``ARBITER_CACHE_DIR``), so first steps are
cold compiles.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import statistics
import time
from unittest import mock

import torch
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import arbiter  # noqa: E402


def bert(seq: int = 128, batch: int = 8):
    """A BERT-style encoder: hidden 256, 4 layers, 4 heads, intermediate 1024."""
    from transformers import BertConfig, BertModel

    from arbiter.cli.examples import _HFWrapper

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=1024, vocab_size=1000, max_position_embeddings=512)
    return _HFWrapper(BertModel(cfg, add_pooling_layer=False)), \
        (torch.randint(0, 1000, (batch, seq)),)


def mobilenet_v2(size: int = 96, batch: int = 4):
    """transformers' MobileNet-v2 (random weights), its last hidden state."""
    from transformers import MobileNetV2Config, MobileNetV2Model

    from arbiter.cli.examples import _HFOutput

    torch.manual_seed(0)
    model = MobileNetV2Model(MobileNetV2Config(image_size=size), add_pooling_layer=False)
    return _HFOutput(model, "pixel_values", "last_hidden_state"), \
        (torch.randn(batch, 3, size, size),)


def resnet18(size: int = 64, batch: int = 8):
    """ResNet-18 (transformers' ResNet, basic blocks 2-2-2-2), its pooled features."""
    from transformers import ResNetConfig, ResNetModel

    from arbiter.cli.examples import _HFOutput

    torch.manual_seed(0)
    cfg = ResNetConfig(depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                       layer_type="basic", embedding_size=64)
    return _HFOutput(ResNetModel(cfg), "pixel_values", "pooler_output"), \
        (torch.randn(batch, 3, size, size),)


def load(name: str, seq: int, batch: int):
    if name == "bert":
        return bert(seq, batch)
    if name == "mobilenet_v2":
        return mobilenet_v2()
    if name == "resnet18":
        return resnet18()
    from arbiter.cli.examples import load_model

    return load_model(name)


def no_decompositions_manifest(tmp: str) -> str:
    from arbiter.registry import get_backend_class

    path = get_backend_class("onnxruntime").manifest_path()
    doc = yaml.safe_load(open(path).read())
    doc["decompositions"] = []
    out = os.path.join(tmp, "onnxruntime_no_decompositions.yaml")
    with open(out, "w") as f:
        yaml.safe_dump(doc, f)
    return out


def step(model, inputs, seed: int):
    torch.manual_seed(seed)
    out = model(*inputs)
    out.float().pow(2).mean().backward()
    return out


def run(name: str, config: dict, seq: int, batch: int, split: bool = True,
        steps: int = 0) -> dict:
    """``split=False``: as before 2026-11-24: dropout whole, grouped and transposed
    ``convolution_backward`` whole."""
    import arbiter.decompose as decompose

    # cold compiles: an empty arbiter cache per run (first-step times comparable), and
    # the decomposition tables built anew (they are kept per process)
    decompose._BY_NAMES.clear()
    decompose._CACHE.clear()
    full = decompose._convolution_backward

    def plain_only(*args):  # as before 2026-11-24: grouped and transposed ones stay whole
        transposed, groups = args[7], args[9]
        return NotImplemented if transposed or groups != 1 else full(*args)

    with tempfile.TemporaryDirectory(prefix="arbiter-bench-") as cache, \
            mock.patch.dict(os.environ, {"ARBITER_CACHE_DIR": cache}):
        if not split:
            with mock.patch("arbiter.arbiter.split_dropout", lambda gm: 0), \
                    mock.patch.dict(decompose.__dict__, {
                        "_convolution_backward": plain_only}):
                out = _run(name, config, seq, batch, steps)
        else:
            out = _run(name, config, seq, batch, steps)
    decompose._BY_NAMES.clear()
    decompose._CACHE.clear()
    return out


def _run(name: str, config: dict, seq: int, batch: int, steps: int) -> dict:
    torch._dynamo.reset()
    model, inputs = load(name, seq, batch)
    model.train()
    ref = copy.deepcopy(model)
    be = arbiter.Arbiter(config)
    compiled = torch.compile(model, backend=be)
    start = time.perf_counter()
    out = step(compiled, inputs, 0)
    first = time.perf_counter() - start
    want = step(ref, inputs, 0)
    worst = (out - want).abs().max().item()
    for p, q in zip(model.parameters(), ref.parameters()):
        if p.grad is not None or q.grad is not None:
            worst = max(worst, (p.grad - q.grad).abs().max().item())
    times = []
    for k in range(steps):  # later steps (forward and backward, no optimizer)
        model.zero_grad()
        start = time.perf_counter()
        step(compiled, inputs, k + 1)
        times.append(time.perf_counter() - start)
    report = be.report(advice=False)
    row = {"model": name, "first_step_s": first, "max_abs_diff": worst,
           "step_ms": statistics.median(times) * 1e3 if times else None}
    for kind in ("forward", "backward"):
        graphs = [g for g in report.graphs if g.kind == kind]
        parts = [p for g in graphs for p in g.partitions]
        by: dict = {}
        for p in parts:
            by[p.backend] = by.get(p.backend, 0) + 1
        eager = sum(p.nodes for p in parts if p.backend == "eager")
        row[kind] = (len(parts), by, eager, sum(g.nodes for g in graphs))
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["gpt2_tiny", "bert"])
    ap.add_argument("--config", default="default")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=0,
                    help="time this many steps after the first (forward and backward): "
                         "their median")
    ap.add_argument("--variants", nargs="+", default=["none", "whole", "split"],
                    choices=["none", "whole", "split"],
                    help="none: no ONNX Runtime decompositions; whole: the manifest's, "
                         "dropout and grouped/transposed convolution_backward left whole "
                         "(as on 2026-11-23); split: as shipped")
    args = ap.parse_args()
    from arbiter.config import load_config

    base = load_config(args.config).model_dump(exclude_defaults=True)
    with tempfile.TemporaryDirectory() as tmp:
        before = {**base, "manifests": {"onnxruntime": no_decompositions_manifest(tmp)}}
        print(f"uptime: {os.getloadavg()}")
        print("| model | ONNX Runtime decompositions | forward partitions (by backend) | "
              "backward partitions (by backend) | eager nodes fwd/bwd (of) | first step s "
              "| step ms (median) | max abs diff vs eager |")
        print("|---|---|---|---|---|---:|---:|---:|")
        for name in args.models:
            for variant, label, config, split in (
                    ("none", "none", before, False),
                    ("whole", "manifest's, 2026-11-23 (dropout whole)", base, False),
                    ("split", "manifest's, dropout split", base, True)):
                if variant not in args.variants:
                    continue
                r = run(name, config, args.seq, args.batch, split, args.steps)
                f, b = r["forward"], r["backward"]
                step_ms = "-" if r["step_ms"] is None else f"{r['step_ms']:.0f}"
                print(f"| {name} | {label} | {f[0]} {f[1]} | {b[0]} {b[1]} | "
                      f"{f[2]}/{b[2]} (of {f[3]}/{b[3]}) | {r['first_step_s']:.1f} | "
                      f"{step_ms} | {r['max_abs_diff']:.2e} |", flush=True)
        print(f"uptime: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
