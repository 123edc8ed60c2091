"""Built-in example models: ``name -> factory() -> (model, example_inputs)``.

The small ones need only torch; the transformer models are built from transformers
configs with random weights (nothing is downloaded). Every factory returns its model in
eval mode: the CLI traces a model as it is (``model.training``), so ``arbiter explain`` and
``arbiter report`` plan the built-ins for inference unless told ``--train``.
"""
from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ArbiterError, did_you_mean

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
    return SeedMLP().eval(), (torch.randn(8, 32),)


def encoder_block():
    torch.manual_seed(0)
    return EncoderBlock().eval(), (torch.randn(2, 16, 64),)


def small_cnn():
    torch.manual_seed(0)
    return SmallCNN().eval(), (torch.randn(2, 3, 32, 32),)


def gpt2_tiny():
    """GPT-2 with 2 layers, random weights (transformers)."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=128,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2Model(cfg)
    return _HFWrapper(model).eval(), (torch.randint(0, 1000, (1, 32)),)


class _HFWrapper(nn.Module):
    """Returns the last hidden state as a plain tensor."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state


# -- the bench model zoo: full-size models from transformers configs, random
# weights seeded so every process builds the same model; eval mode, batch 1, float32.

ZOO_SEQ = 128  # tokens per text input


class _HFOutput(nn.Module):
    """Calls a transformers model with one named input; returns one output tensor."""

    def __init__(self, model: nn.Module, input_name: str, output: str):
        super().__init__()
        self.model = model
        self.input_name = input_name
        self.output = output

    def forward(self, x):
        return getattr(self.model(**{self.input_name: x}), self.output)


def _zoo(build: Callable[[], nn.Module], input_name: str, output: str, example: Callable):
    torch.manual_seed(0)
    model = _HFOutput(build(), input_name, output).eval()
    torch.manual_seed(1)
    return model, (example(),)


def _tokens(vocab: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.randint(0, vocab, (1, ZOO_SEQ))


def _image() -> torch.Tensor:
    return torch.randn(1, 3, 224, 224)


def bert_base():
    """BERT-base (12 layers, 768 wide), sequence 128."""
    from transformers import BertConfig, BertModel

    cfg = BertConfig()
    return _zoo(lambda: BertModel(cfg), "input_ids", "last_hidden_state", _tokens(cfg.vocab_size))


def gpt2_small():
    """GPT-2 small (12 layers, 768 wide), sequence 128, no KV cache (the benchmark's
    model; with the cache, OpenVINO's whole-model conversion fails on its empty `cat`)."""
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(use_cache=False)
    return _zoo(lambda: GPT2Model(cfg), "input_ids", "last_hidden_state", _tokens(cfg.vocab_size))


def distilbert():
    """DistilBERT-base (6 layers, 768 wide), sequence 128."""
    from transformers import DistilBertConfig, DistilBertModel

    cfg = DistilBertConfig()
    return _zoo(lambda: DistilBertModel(cfg), "input_ids", "last_hidden_state",
                _tokens(cfg.vocab_size))


def t5_small_encoder():
    """T5-small's encoder (6 layers, 512 wide), sequence 128."""
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config()
    return _zoo(lambda: T5EncoderModel(cfg), "input_ids", "last_hidden_state",
                _tokens(cfg.vocab_size))


def resnet50():
    """ResNet-50 (transformers' ResNet, bottleneck 3-4-6-3) with its classifier, 224x224."""
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(num_labels=1000)
    return _zoo(lambda: ResNetForImageClassification(cfg), "pixel_values", "logits", _image)


def vit_base():
    """ViT-base/16 (12 layers, 768 wide), 224x224."""
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig()
    return _zoo(lambda: ViTModel(cfg, add_pooling_layer=False), "pixel_values",
                "last_hidden_state", _image)


#: The bench zoo (bench/zoo.py): the seed's MLP and the full-size models.
ZOO: dict[str, Factory] = {
    "mlp": mlp,
    "bert_base": bert_base,
    "gpt2_small": gpt2_small,
    "resnet50": resnet50,
    "vit_base": vit_base,
    "distilbert": distilbert,
    "t5_small_encoder": t5_small_encoder,
}

EXAMPLES: dict[str, Factory] = {
    "mlp": mlp,
    "encoder_block": encoder_block,
    "small_cnn": small_cnn,
    "gpt2_tiny": gpt2_tiny,
    **ZOO,
}


def model_and_inputs(got, where: str):
    """``(model, inputs)`` from what a factory returned: ``(model, (x, ...))``, or
    ``(model, x)`` with one tensor (taken as ``(x,)``); anything else is refused, naming
    the factory and what it must return."""
    shape = "(model, (input, ...)): the model and a tuple of its example inputs"
    if not isinstance(got, (tuple, list)):
        raise ArbiterError(f"{where} returned a bare {type(got).__name__}; it must return "
                           f"{shape}")
    if len(got) != 2:
        raise ArbiterError(f"{where} returned a {type(got).__name__} of {len(got)} items; "
                           f"it must return {shape}")
    model, inputs = got
    if not callable(model):
        raise ArbiterError(f"{where} returned a {type(model).__name__} as the model; it must "
                           f"return {shape}")
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)  # one tensor: the only input
    elif isinstance(inputs, list):
        inputs = tuple(inputs)
    elif not isinstance(inputs, tuple):
        raise ArbiterError(f"{where} returned a {type(inputs).__name__} as the inputs; it "
                           f"must return {shape}")
    return model, inputs


@contextlib.contextmanager
def users_errors(model: Any, inputs: tuple, spec: str, train: bool = False):
    """Around the CLI's compile or run of ``model``: an exception other than an
    ``ArbiterError`` is the model's own when eager fails on the same inputs too, and is
    raised as an ``ArbiterError`` that names it (the CLI prints one line); otherwise it
    is arbiter's and goes on with its traceback."""
    try:
        yield
    except ArbiterError:
        raise
    except Exception as exc:
        try:
            with torch.enable_grad() if train else torch.no_grad():
                model(*inputs)
        except Exception as eager:  # noqa: BLE001 - what eager says is the message
            cause = str(eager).strip().splitlines()
            raise ArbiterError(f"{spec}: the model fails in eager on its example inputs, "
                               f"so it cannot be compiled: {type(eager).__name__}: "
                               f"{cause[0][:500] if cause else ''}") from exc
        raise


def load_model(spec: str):
    """``(model, example_inputs)`` for a built-in example's name or
    ``path/to/file.py:factory`` (a function returning them)."""
    if ":" in spec and spec.split(":", 1)[0].endswith(".py"):
        path, func = spec.rsplit(":", 1)
        file = Path(path)
        if not file.is_file():
            raise ArbiterError(f"{path}: no such file")
        mod_spec = importlib.util.spec_from_file_location(file.stem, file)
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
        if not hasattr(module, func):
            names = [n for n in dir(module) if not n.startswith("_")]
            raise ArbiterError(f"{path}: no function {func!r}{did_you_mean(func, names)}")
        factory = getattr(module, func)
        if not callable(factory):
            raise ArbiterError(f"{path}:{func} is a {type(factory).__name__}, not a function "
                               "returning (model, inputs)")
        return model_and_inputs(factory(), f"{path}:{func}")
    if spec not in EXAMPLES:
        raise ArbiterError(f"unknown model {spec!r}{did_you_mean(spec, EXAMPLES)}; built-in: "
                           f"{', '.join(EXAMPLES)}, or path/to/file.py:factory")
    return EXAMPLES[spec]()
