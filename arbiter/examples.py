"""Built-in example models: ``name -> factory() -> (model, example_inputs)``.

The small ones need only torch; the transformer models are built from transformers
configs with random weights (nothing is downloaded).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Factory = Callable[[], tuple[nn.Module, tuple[Any, ...]]]


class SeedMLP(nn.Module):
    """The seed's MLP: batch 8, 32 features, two hidden layers."""

    def __init__(self, d: int = 32, hidden: int = 64):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.nn.functional.gelu(self.fc1(x)))))


class EncoderBlock(nn.Module):
    """A pre-norm transformer encoder block: attention + MLP, written out in torch ops."""

    def __init__(self, d: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        h = self.ln1(x)
        q, k, v = self.qkv(h).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        h = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(h)
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))


class SmallCNN(nn.Module):
    """Conv-BN-ReLU x2, pooling, a linear head."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def mlp():
    torch.manual_seed(0)
    return SeedMLP(), (torch.randn(8, 32),)


def encoder_block():
    torch.manual_seed(0)
    return EncoderBlock(), (torch.randn(2, 16, 64),)


def small_cnn():
    torch.manual_seed(0)
    return SmallCNN(), (torch.randn(2, 3, 32, 32),)


def gpt2_tiny():
    """GPT-2 with 2 layers, random weights (transformers)."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=128,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2Model(cfg)
    return _HFWrapper(model), (torch.randint(0, 1000, (1, 32)),)


class _HFWrapper(nn.Module):
    """Returns the last hidden state as a plain tensor."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state


EXAMPLES: dict[str, Factory] = {
    "mlp": mlp,
    "encoder_block": encoder_block,
    "small_cnn": small_cnn,
    "gpt2_tiny": gpt2_tiny,
}
