"""The CLI's MODEL argument, without importing torch (``arbiter --help`` stays fast).

The built-in example models' names, one line each (arbiter/cli/examples.py defines them;
tests/test_cli.py keeps the two lists equal), and whether a model is traced for training
or for inference (``--train``, ``--inference``, else the model's own mode).
"""
from __future__ import annotations

import textwrap

#: name -> what it is (examples.EXAMPLES has the same names, in this order)
EXAMPLE_MODELS: dict[str, str] = {
    "mlp": "the seed's MLP: three Linear layers, batch 8 x 32",
    "encoder_block": "a pre-norm transformer encoder block, written out in torch ops",
    "small_cnn": "conv-BN-ReLU x2, pooling, a linear head, 2x3x32x32",
    "gpt2_tiny": "GPT-2, 2 layers, 128 wide, random weights (transformers)",
    "bert_base": "BERT-base, sequence 128 (transformers, random weights)",
    "gpt2_small": "GPT-2 small, sequence 128 (transformers, random weights)",
    "resnet50": "ResNet-50 with its classifier, 224x224 (transformers, random weights)",
    "vit_base": "ViT-base/16, 224x224 (transformers, random weights)",
    "distilbert": "DistilBERT-base, sequence 128 (transformers, random weights)",
    "t5_small_encoder": "T5-small's encoder, sequence 128 (transformers, random weights)",
}

MODEL_ARG = ("a built-in example (below) or path/to/file.py:factory, a function returning "
             "(model, example_inputs)")

MODE_NOTE = ("Training or inference: as the model is (model.training, as torch.compile "
             "would see it; the built-in examples are in eval mode): a model in training "
             "mode is traced with gradients (forward and backward graphs), one in eval mode "
             "for inference (under torch.no_grad). --train or --inference overrides.")


def fill(*paragraphs: str, width: int = 88) -> str:
    """Paragraphs wrapped for a help text drawn as is (RawDescriptionHelpFormatter)."""
    return "\n\n".join(textwrap.fill(p, width) for p in paragraphs)


def models_epilog(width: int = 92) -> str:
    """The built-in models, one line each, for a command's ``--help``."""
    wide = max(map(len, EXAMPLE_MODELS))
    lines = ["built-in models:"]
    for name, what in EXAMPLE_MODELS.items():
        lines += textwrap.wrap(what, width, initial_indent=f"  {name:<{wide}}  ",
                               subsequent_indent=" " * (wide + 4))
    return "\n".join(lines)


def add_mode_arguments(parser) -> None:
    """--train / --inference: override the model's own mode (``choose_mode``)."""
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--train", action="store_true",
                      help="model.train(), traced with gradients: forward and backward graphs")
    mode.add_argument("--inference", action="store_true",
                      help="model.eval(), traced under torch.no_grad(): inference graphs")


def choose_mode(model, args) -> tuple[bool, str]:
    """(True to trace ``model`` for training, False for inference; a line saying which
    and why). ``--train`` or ``--inference`` when given (the model is put in that mode),
    else the model's own ``training`` flag; a function, with none, is traced for
    inference. Commands print the line, so that two commands never differ in silence."""
    own = getattr(model, "training", None)
    train = bool(args.train or (own and not args.inference))
    if args.train or args.inference:
        why = "--train" if args.train else "--inference"
        if own is not None:
            model.train(train)
    elif own is None:
        why = "not a module: no mode of its own; --train to trace a backward"
    else:
        why = (f"the model is in {'training' if own else 'eval'} mode; "
               f"{'--inference' if train else '--train'} for the other")
    return train, f"tracing for {'training' if train else 'inference'} ({why})"
