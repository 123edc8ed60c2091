"""How a training step's graphs are partitioned: forward and backward partitions per
backend, nodes left to eager, first-step time, and the gradients checked against eager.

Compares ONNX Runtime's manifest with and without its `decompositions:` (without: what
the backward graphs got before per-backend decompositions, arbiter/decompose.py), and
with them but each `native_dropout` left whole (what the forward graphs got before
`decompose.split_dropout` drew dropout masks apart from the data), under a config
(default: the shipped `default`, ONNX Runtime then Inductor). Models: the demo's
GPT-2 (`gpt2_tiny`, 2 layers), a BERT-style encoder (transformers' BertModel, hidden
256, 4 layers; `--seq`, `--batch`), `mobilenet_v2` (96x96, batch 4) and `resnet18` (64x64,
batch 8), all in train mode (dropout on, batch norm with batch statistics).

    .venv/bin/python bench/training_partitions.py [--models gpt2_tiny bert] [--config default]
        [--variants none whole split]

Each run starts with an empty arbiter cache (``ARBITER_CACHE_DIR``), so first steps are
cold compiles.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
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


def run(name: str, config: dict, seq: int, batch: int, split: bool = True) -> dict:
    # cold compiles: an empty arbiter cache per run (first-step times comparable)
    with tempfile.TemporaryDirectory(prefix="arbiter-bench-") as cache, \
            mock.patch.dict(os.environ, {"ARBITER_CACHE_DIR": cache}):
        if not split:  # dropout left whole: the forward as before split_dropout
            with mock.patch("arbiter.arbiter.split_dropout", lambda gm: 0):
                return _run(name, config, seq, batch)
        return _run(name, config, seq, batch)


def _run(name: str, config: dict, seq: int, batch: int) -> dict:
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
    report = be.report(advice=False)
    row = {"model": name, "first_step_s": first, "max_abs_diff": worst}
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
    ap.add_argument("--variants", nargs="+", default=["none", "whole", "split"],
                    choices=["none", "whole", "split"],
                    help="none: no ONNX Runtime decompositions (dropout left whole); whole: "
                         "the manifest's, dropout left whole; split: the manifest's, dropout "
                         "split (arbiter as shipped)")
    args = ap.parse_args()
    from arbiter.config import load_config

    base = load_config(args.config).model_dump(exclude_defaults=True)
    with tempfile.TemporaryDirectory() as tmp:
        before = {**base, "manifests": {"onnxruntime": no_decompositions_manifest(tmp)}}
        print(f"uptime: {os.getloadavg()}")
        print("| model | ONNX Runtime decompositions, dropout | forward partitions (by backend) | "
              "backward partitions (by backend) | eager nodes fwd/bwd (of) | first step s "
              "| max abs diff vs eager |")
        print("|---|---|---|---|---|---:|---:|")
        for name in args.models:
            for variant, label, config, split in (
                    ("none", "none, dropout whole", before, False),
                    ("whole", "manifest's, dropout whole", base, False),
                    ("split", "manifest's, dropout split", base, True)):
                if variant not in args.variants:
                    continue
                r = run(name, config, args.seq, args.batch, split)
                f, b = r["forward"], r["backward"]
                print(f"| {name} | {label} | {f[0]} {f[1]} | {b[0]} {b[1]} | "
                      f"{f[2]}/{b[2]} (of {f[3]}/{b[3]}) | {r['first_step_s']:.1f} | "
                      f"{r['max_abs_diff']:.2e} |", flush=True)
        print(f"uptime: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
