"""nn.TransformerEncoder's inference fast path, decomposed (arbiter/decompose/fused.py).

    .venv/bin/python bench/transformer_fastpath.py                 # ~10 min on 2 cores
    .venv/bin/python bench/transformer_fastpath.py --padding       # with a padding mask
    .venv/bin/python bench/transformer_fastpath.py --rounds 2 --iters 2   # a smoke run

Model: ``nn.TransformerEncoder`` (d_model 256, 4 heads, feed-forward 1024, 4 layers,
``batch_first=True``, relu, seeded random weights, eval, float32, ``torch.no_grad``):
each layer is one ``aten._transformer_encoder_layer_fwd`` in eager and in Dynamo's
graph. Batch 4, called in a cycle over sequence lengths 32, 48, 64, 96, 128. With
``--padding`` the model also takes a key-padding mask (the last quarter of every sequence
but the first is padding) and zeroes the padded positions of its output, so every
contender returns the same numbers (eager's encoder runs its layers on a nested tensor
there, skipping the padding; compiled graphs compute it).

Contenders, each in its own process (bench/dynamic_shapes.py's harness: warm-up pass,
then interleaved rounds, median per length): ``eager``; ``inductor``
(``torch.compile(model)``); ``arbiter_default`` and ``arbiter_cpu_all`` (the shipped
configs; inference graphs are not timed against eager); ``arbiter_default_fused``: the
default config with the fused ops left whole, as before this change (all in eager).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dynamic_shapes as harness  # noqa: E402

CONTENDERS = ["eager", "inductor", "arbiter_default", "arbiter_cpu_all",
              "arbiter_default_fused"]
PADDING = "--padding" in sys.argv


def build_model():
    import torch
    from torch import nn

    class Padded(nn.Module):
        """The encoder on ``{"x", "padding"}`` (True where padded), its padded outputs
        zeroed."""

        def __init__(self, encoder):
            super().__init__()
            self.encoder = encoder

        def forward(self, batch):
            out = self.encoder(batch["x"], src_key_padding_mask=batch["padding"])
            return out.masked_fill(batch["padding"].unsqueeze(-1), 0.0)

    torch.manual_seed(0)
    encoder = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True), 4,
        enable_nested_tensor=PADDING).eval()
    model = Padded(encoder).eval() if PADDING else encoder
    g = torch.Generator().manual_seed(1)
    inputs = {}
    for n in harness.LENGTHS:
        x = torch.randn(harness.BATCH, n, 256, generator=g)
        padding = torch.zeros(harness.BATCH, n, dtype=torch.bool)
        padding[1:, n - n // 4:] = True
        inputs[n] = {"x": x, "padding": padding} if PADDING else x
    return model, inputs


def _contender(name, model, inputs, threads):
    if name != "arbiter_default_fused":
        return _ORIGINAL(name, model, inputs, threads)
    import arbiter.arbiter
    from arbiter.decompose import table

    # the lowering table as it was: the config's decompositions only
    arbiter.arbiter.decomposition_table = table
    return _ORIGINAL("arbiter_default", model, inputs, threads)


_ORIGINAL = harness._contender


def _worker(conn, name, threads):
    _patch()
    harness._worker_original(conn, name, threads)


def _patch():
    harness.build_model = build_model
    harness._contender = _contender
    harness.CONTENDERS = CONTENDERS
    harness.SINGLE = ["eager", "inductor"]
    if not hasattr(harness, "_worker_original"):
        harness._worker_original = harness._worker
    harness._worker = _worker


if __name__ == "__main__":
    _patch()
    argv = [a for a in sys.argv[1:] if a != "--padding"]
    sys.exit(harness.main(argv))
