"""Many architectures through the default config: what ran where, and whether it is right.

    .venv/bin/python bench/arch_sweep.py                      # inference, every model (~4 min)
    .venv/bin/python bench/arch_sweep.py --train              # a training step each (~10 min)
    .venv/bin/python bench/arch_sweep.py --models llama falcon --train

Small random-weight configurations of transformers' models (4 layers, 256 wide where the
architecture allows; nothing downloads), each in its own process, compiled with
``backend=arbiter.Arbiter()`` (the embedded default config) and compared with eager on
the same inputs: inference, the output's largest error; ``--train``, one forward and
backward with every dropout and drop-path probability set to 0, each parameter's gradient
against eager's (the largest error relative to that gradient's largest value, or to a
thousandth of the model's largest gradient where that is more: a parameter whose gradient
is 0 in exact arithmetic, such as a key's bias before a softmax, holds float noise). Speed is eager's median time over arbiter's, 5 calls (3 training steps) each in
turns: a smoke reading, not a benchmark. The zoo (bench/zoo.py) is where speed is measured.

What this sweep is for: decoders with grouped-query attention, key/value caches, SDPA's
math path, convolutional and windowed vision models, an audio encoder: the graphs users
bring, beyond the zoo's seven. A row with fallbacks, eager partitions or a large error
is a finding.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# name -> (transformers class names, config keyword arguments)
DECODERS = {
    "llama": ("LlamaConfig", dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)),
    "mistral": ("MistralConfig", dict(hidden_size=256, intermediate_size=688,
                                      num_hidden_layers=4, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=1000)),
    "qwen2": ("Qwen2Config", dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)),
    "gemma": ("GemmaConfig", dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                  num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                                  vocab_size=1000)),
    "falcon": ("FalconConfig", dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                    vocab_size=1000)),
    "phi": ("PhiConfig", dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                              num_attention_heads=4, vocab_size=1000)),
    "gpt_neox": ("GPTNeoXConfig", dict(hidden_size=256, intermediate_size=1024,
                                       num_hidden_layers=4, num_attention_heads=4,
                                       vocab_size=1000)),
    "bloom": ("BloomConfig", dict(hidden_size=256, n_layer=4, n_head=4, vocab_size=1000)),
    "opt": ("OPTConfig", dict(hidden_size=256, ffn_dim=1024, num_hidden_layers=4,
                              num_attention_heads=4, vocab_size=1000, word_embed_proj_dim=256)),
    "gpt2": ("GPT2Config", dict(n_embd=256, n_layer=4, n_head=4, vocab_size=1000)),
}
ENCODERS = {
    "roberta": ("RobertaConfig", dict(hidden_size=256, intermediate_size=1024,
                                      num_hidden_layers=4, num_attention_heads=4,
                                      vocab_size=1000)),
    "albert": ("AlbertConfig", dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                                    num_attention_heads=4, vocab_size=1000, embedding_size=128)),
    "electra": ("ElectraConfig", dict(hidden_size=256, intermediate_size=1024,
                                      num_hidden_layers=4, num_attention_heads=4,
                                      vocab_size=1000)),
    "deberta": ("DebertaV2Config", dict(hidden_size=256, intermediate_size=1024,
                                        num_hidden_layers=4, num_attention_heads=4,
                                        vocab_size=1000)),
    "mobilebert": ("MobileBertConfig", dict(num_hidden_layers=4, vocab_size=1000)),
}
VISION = {
    "convnext": ("ConvNextModel", "ConvNextConfig", dict(depths=[1, 1, 2, 1],
                                                         hidden_sizes=[32, 64, 128, 256])),
    "swin": ("SwinModel", "SwinConfig", dict(embed_dim=32, depths=[1, 1, 2, 1],
                                             num_heads=[1, 2, 4, 8])),
    "clip_vision": ("CLIPVisionModel", "CLIPVisionConfig", dict(
        hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4)),
    "deit": ("DeiTModel", "DeiTConfig", dict(hidden_size=256, intermediate_size=1024,
                                            num_hidden_layers=4, num_attention_heads=4)),
    "beit": ("BeitModel", "BeitConfig", dict(hidden_size=256, intermediate_size=1024,
                                            num_hidden_layers=4, num_attention_heads=4)),
    "segformer": ("SegformerModel", "SegformerConfig", {}),
    "regnet": ("RegNetModel", "RegNetConfig", {}),
    "poolformer": ("PoolFormerModel", "PoolFormerConfig", {}),
    "levit": ("LevitModel", "LevitConfig", {}),
}
OTHER = ["t5", "bart_encoder", "whisper_encoder"]
MODELS = list(DECODERS) + list(ENCODERS) + list(VISION) + OTHER


def build(name: str):
    """(module returning one tensor, inputs) for ``name``, random weights, eval mode."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (1, 64))
    if name in DECODERS or name in ENCODERS:
        cls, kw = {**DECODERS, **ENCODERS}[name]
        inner, args = tf.AutoModel.from_config(getattr(tf, cls)(**kw)), (ids,)
    elif name in VISION:
        model_cls, cfg_cls, kw = VISION[name]
        inner = getattr(tf, model_cls)(getattr(tf, cfg_cls)(**kw))
        args = (torch.randn(1, 3, 224, 224),)
    elif name == "t5":
        inner = tf.T5Model(tf.T5Config(d_model=256, d_ff=1024, num_layers=3, num_heads=4,
                                       vocab_size=1000, decoder_start_token_id=0))
        args = (ids, torch.randint(0, 1000, (1, 16)))
    elif name == "bart_encoder":
        inner = tf.BartModel(tf.BartConfig(
            d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
            decoder_attention_heads=4, vocab_size=1000, encoder_ffn_dim=1024,
            decoder_ffn_dim=1024)).get_encoder()
        args = (ids,)
    elif name == "whisper_encoder":
        inner = tf.WhisperModel(tf.WhisperConfig(
            d_model=256, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
            num_mel_bins=80)).get_encoder()
        args = (torch.randn(1, 80, 3000),)
    else:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")

    class Hidden(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *a):
            out = self.m(*a) if name != "t5" else self.m(input_ids=a[0], decoder_input_ids=a[1])
            return out[0] if isinstance(out, tuple) else out.last_hidden_state

    return Hidden(inner).eval(), args


def _no_dropout(model) -> None:
    """Every dropout and drop-path probability 0: modules, float attributes (SDPA's
    ``dropout_p`` arguments and stochastic depth's ``drop_prob`` read them) and configs.
    Left on, eager and the compiled model drop different blocks of Swin, SegFormer and
    BEiT in training mode (each draws its own), and whole blocks' gradients differ."""
    import torch

    for mod in model.modules():
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0
        for obj in (mod, getattr(mod, "config", None)):
            for k, v in list(vars(obj).items()) if obj is not None else ():
                if "drop" in k.lower() and isinstance(v, float):
                    setattr(obj, k, 0.0)


def _median(xs):
    return sorted(xs)[len(xs) // 2]


def worker(name: str, train: bool) -> dict:
    import torch

    import arbiter

    warnings.simplefilter("ignore")
    torch.set_num_threads(2)
    model, args = build(name)
    out = {"model": name}
    be = arbiter.Arbiter()
    try:
        if not train:
            with torch.no_grad():
                ref = model(*args)
                compiled = torch.compile(model, backend=be)
                t0 = time.perf_counter()
                got = compiled(*args)
                out["first_s"] = time.perf_counter() - t0
                out["error"] = f"{(got - ref).abs().max().item():.1e}"
                te, ta = [], []
                for _ in range(5):
                    t0 = time.perf_counter()
                    model(*args)
                    te.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    compiled(*args)
                    ta.append(time.perf_counter() - t0)
        else:
            model.train()
            _no_dropout(model)
            ref = copy.deepcopy(model)
            compiled = torch.compile(model, backend=be)
            t0 = time.perf_counter()
            got = compiled(*args)
            r = torch.randn(got.shape, generator=torch.Generator().manual_seed(1))
            (got * r).sum().backward()
            out["first_s"] = time.perf_counter() - t0
            (ref(*args) * r).sum().backward()
            # relative to the gradient's own largest value, or to a thousandth of the
            # model's largest where the gradient is ~0 in exact arithmetic (a key's bias
            # before a softmax): float noise there is not an error
            grads = [q.grad.abs().max().item() for q in ref.parameters() if q.grad is not None]
            floor = 1e-3 * max(grads, default=1.0)
            worst, where = 0.0, ""
            for (pname, p), q in zip(model.named_parameters(), ref.parameters()):
                if q.grad is None or p.grad is None:
                    continue
                rel = (p.grad - q.grad).abs().max().item() / max(q.grad.abs().max().item(),
                                                                 floor)
                if rel > worst:
                    worst, where = rel, pname
            out["error"] = f"{worst:.1e} ({where})" if where else "0"
            te, ta = [], []
            for _ in range(3):
                model.zero_grad()
                ref.zero_grad()
                t0 = time.perf_counter()
                (compiled(*args) * r).sum().backward()
                ta.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                (ref(*args) * r).sum().backward()
                te.append(time.perf_counter() - t0)
        out["speed"] = _median(te) / _median(ta)
        out["summary"] = be.report().summary()
    except Exception as exc:  # noqa: BLE001 - a failure is a row of the table
        out["failed"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    p.add_argument("--train", action="store_true", help="a training step instead of inference")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per model")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        print("RESULT " + json.dumps(worker(a.worker, a.train)))
        return 0
    load0 = os.getloadavg()
    print(f"# arch_sweep {'training step' if a.train else 'inference'}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{load0[0]:.2f} at the start\n")
    what = "largest gradient error (relative, parameter)" if a.train else "max abs error"
    print(f"| model | first call s | {what} | eager / arbiter | report |")
    print("|---|---:|---|---:|---|")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in a.models:
        cmd = [sys.executable, __file__, "--worker", name] + (["--train"] if a.train else [])
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout,
                                  env=env)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")),
                        None)
            row = json.loads(line[7:]) if line else {
                "failed": (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]}
        except subprocess.TimeoutExpired:
            row = {"failed": f"past {a.timeout:.0f} s"}
        if "failed" in row:
            print(f"| {name} | - | - | - | failed: {row['failed']} |", flush=True)
            continue
        print(f"| {name} | {row['first_s']:.1f} | {row['error']} | {row['speed']:.2f}x | "
              f"{row['summary']} |", flush=True)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
