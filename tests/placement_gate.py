"""The placement gate's models and what it records of their plans.

For each small model of the zoo's families (BERT, GPT-2, T5 encoder, ViT, ResNet,
DistilBERT: transformers configs, seeded random weights), an ``nn.TransformerEncoder`` and
a CNN quantized with PyTorch's PT2E flow (static inference only): in inference with
static shapes, inference with symbolic shapes (``dynamic=True``) and one training step,
under the shipped ``default`` and ``cpu_all`` configs, the plan (``arbiter.explain``:
traced by Dynamo and AOTAutograd, planned, nothing compiled), per graph kind, as the
number of partitions and the compute nodes each backend holds. Compute nodes are ATen
and prims ops and PT2E's quantize/dequantize ops; size arithmetic on symbolic ints
(``operator.mul``, ``sym_size``) is not counted.

tests/test_placement_gate.py compares these with tests/placement_expected.json. A change
that moves work on purpose updates the file in the same commit, with the reason:

    .venv/bin/python tests/placement_gate.py --update "why the plans moved"
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn

EXPECTED = Path(__file__).with_name("placement_expected.json")
CONFIGS = ("default", "cpu_all")
MODES = ("static", "symbolic", "training")


class _Out(nn.Module):
    """A transformers model called with one input, returning one tensor."""

    def __init__(self, model: nn.Module, name: str, output: str):
        super().__init__()
        self.model, self.name, self.output = model, name, output

    def forward(self, x):
        return getattr(self.model(**{self.name: x}), self.output)


def _bert():
    from transformers import BertConfig, BertModel

    return _Out(BertModel(BertConfig(hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64,
                                     vocab_size=100)), "input_ids", "last_hidden_state"), "tokens"


def _gpt2():
    from transformers import GPT2Config, GPT2Model

    return _Out(GPT2Model(GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100,
                                     n_positions=64, use_cache=False, bos_token_id=0,
                                     eos_token_id=0)),
                "input_ids", "last_hidden_state"), "tokens"


def _t5_encoder():
    from transformers import T5Config, T5EncoderModel

    return _Out(T5EncoderModel(T5Config(d_model=32, d_kv=16, d_ff=64, num_layers=2,
                                        num_heads=2, vocab_size=100)),
                "input_ids", "last_hidden_state"), "tokens"


def _distilbert():
    from transformers import DistilBertConfig, DistilBertModel

    return _Out(DistilBertModel(DistilBertConfig(dim=32, n_layers=2, n_heads=2,
                                                 hidden_dim=64, vocab_size=100)),
                "input_ids", "last_hidden_state"), "tokens"


def _vit():
    from transformers import ViTConfig, ViTModel

    return _Out(ViTModel(ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, image_size=32, patch_size=8),
                         add_pooling_layer=False), "pixel_values", "last_hidden_state"), "image"


def _resnet():
    from transformers import ResNetConfig, ResNetForImageClassification

    return _Out(ResNetForImageClassification(ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=10)),
        "pixel_values", "logits"), "image"


def _transformer_encoder():
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64,
                                       batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False), "features"


def _pt2e_cnn():
    """A small CNN (conv-relu x2, pool, linear) through PyTorch's own int8 flow: torchao's
    prepare_pt2e / convert_pt2e with X86InductorQuantizer, calibrated on two batches."""
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).eval()
    x = _input("image", 16)
    quantizer = xiq.X86InductorQuantizer()
    quantizer.set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    for seed in (1, 2):
        prepared(torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)))
    return convert_pt2e(prepared), "image"


MODELS: dict[str, Callable] = {
    "bert": _bert, "gpt2": _gpt2, "t5_encoder": _t5_encoder, "distilbert": _distilbert,
    "vit": _vit, "resnet": _resnet, "transformer_encoder": _transformer_encoder,
    "pt2e_cnn": _pt2e_cnn,
}
#: models planned in fewer modes than MODES: a converted PT2E model is for inference at
#: the shapes it was exported with
ONLY_MODES = {"pt2e_cnn": ("static",)}


def _input(kind: str, size: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(size)
    if kind == "tokens":
        return torch.randint(0, 100, (2, size), generator=gen)
    if kind == "image":
        return torch.randn(2, 3, 32, 32, generator=gen)
    return torch.randn(2, size, 32, generator=gen)


def plans(model_name: str, mode: str, config: str) -> dict:
    """{graph kind: {"partitions": n, "nodes": {backend: compute nodes}}} of one plan."""
    import arbiter

    torch.manual_seed(0)
    model, kind = MODELS[model_name]()
    x = _input(kind, 16)
    torch._dynamo.reset()
    if mode == "training":
        model.train()  # (not called for ONLY_MODES' inference-only models)
        for m in model.modules():  # dropout's masks are planned like any op; p 0 keeps
            if isinstance(m, nn.Dropout):  # the plan free of random-mask cuts per size
                m.p = 0.0
        report = arbiter.explain(model, x, config=config, breaks=False)
    else:
        if not isinstance(model, torch.fx.GraphModule):  # convert_pt2e's refuses .eval()
            model.eval()
        with torch.no_grad():
            report = arbiter.explain(model, x, config=config, backward=False, breaks=False,
                                     dynamic=mode == "symbolic")
    out: dict = {}
    for g in report.graphs:
        got = out.setdefault(g.kind, {"partitions": 0, "nodes": {}})
        got["partitions"] += len(g.partitions)
        for p in g.partitions:
            n = sum(c for op, c in p.ops.items() if _compute(op))
            if n:
                got["nodes"][p.planned_backend] = got["nodes"].get(p.planned_backend, 0) + n
    for got in out.values():
        got["nodes"] = dict(sorted(got["nodes"].items()))
    return out


def _compute(op: str) -> bool:
    """Whether a node of ``op`` computes tensors (ATen, prims and quantize/dequantize
    ops); size arithmetic (``_operator.mul``, ``aten.sym_size``) does not."""
    return (op.split(".", 1)[0] in ("aten", "prims", "quantized_decomposed")
            and not op.startswith("aten.sym_"))


def cases() -> list[tuple[str, str, str]]:
    return [(m, mode, c) for m in MODELS for mode in ONLY_MODES.get(m, MODES)
            for c in CONFIGS]


def key(model: str, mode: str, config: str) -> str:
    return f"{model}/{mode}/{config}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="record the placement gate's expected plans")
    ap.add_argument("--update", metavar="REASON", required=True,
                    help="why the plans moved (kept in the file)")
    args = ap.parse_args(argv)
    old = json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}
    plans_now = {}
    for case in cases():
        plans_now[key(*case)] = plans(*case)
        print(key(*case), plans_now[key(*case)], file=sys.stderr, flush=True)
    reasons = list(old.get("reasons", [])) + [args.update]
    EXPECTED.write_text(json.dumps({"reasons": reasons, "plans": plans_now}, indent=1,
                                   sort_keys=True) + "\n")
    print(f"wrote {EXPECTED}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    # the calibration the suite plans with (tests/conftest.py), not this machine's
    import os
    os.environ.setdefault("ARBITER_CALIBRATION", str(EXPECTED.with_name(
        "calibration_reference.json")))
    sys.exit(main())
