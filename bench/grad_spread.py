"""How far one training step's gradients land from float64 under equally valid float32
evaluations, and under arbiter: a correctness measurement, not a speed one.

A torchvision model (random weights, seed 0, batch 2, train mode, cross-entropy on random
labels) is run once in float64 (the reference) and then in float32: eager as it is, with
the batch's two samples swapped, in channels_last, with oneDNN off, and through
``torch.compile(backend=arbiter.Arbiter(CONFIG))``. Each row: the gradients' distance from
float64 by norm (all parameters together) and at the worst parameter. Then the float64
gradients' move when the input is multiplied by ``1 + s * noise`` for ``s`` of one float32
rounding (6e-8) and 100 times smaller: how smooth the gradient is at float32's resolution.
docs/verify.md ("Gradients of a whole model").

    PYTHONPATH=<torchvision> .venv/bin/python bench/grad_spread.py regnet_y_400mf \
        [--config default] [--size 224]
"""
from __future__ import annotations

import argparse
import copy
import json

import torch


def _torchvision():
    # a torchvision wheel built for CUDA torch loads on torch+cpu without its C ops
    # (models need none): their fake registrations are skipped
    register = torch.library.register_fake
    torch.library.register_fake = lambda *a, **k: (lambda f: f)
    try:
        import torchvision
    finally:
        torch.library.register_fake = register
    return torchvision


def _grads(model, x, y, backend=None, channels_last=False) -> dict:
    m = copy.deepcopy(model)
    if channels_last:
        m = m.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    f = torch.compile(m, backend=backend) if backend is not None else m
    torch.nn.functional.cross_entropy(f(x), y).backward()
    return {n: p.grad.detach().double() for n, p in m.named_parameters()}


def _distance(g: dict, ref: dict) -> str:
    per = {n: float((g[n] - ref[n]).norm() / ref[n].norm()) for n in ref if ref[n].norm() > 0}
    total = float(torch.cat([(g[n] - ref[n]).flatten() for n in ref]).norm()
                  / torch.cat([ref[n].flatten() for n in ref]).norm())
    worst = max(per, key=per.get)
    return f"{total * 100:.3g}% by norm, worst {worst} {per[worst] * 100:.3g}%"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--config", default="default", help="a shipped config or JSON")
    ap.add_argument("--size", type=int, default=224)
    args = ap.parse_args()
    import arbiter

    tv = _torchvision()
    torch.manual_seed(0)
    model = getattr(tv.models, args.model)(weights=None).train()
    x = torch.randn(2, 3, args.size, args.size)
    y = torch.randint(0, 1000, (2,))
    ref = _grads(model.double(), x.double(), y)
    for s in (6e-8, 6e-10):
        moved = _grads(model, x.double() * (1 + s * torch.randn_like(x.double())), y)
        print(f"float64, input x (1 + {s:g} noise): {_distance(moved, ref)}", flush=True)
    model.float()
    print(f"eager: {_distance(_grads(model, x, y), ref)}", flush=True)
    print(f"eager, samples swapped: {_distance(_grads(model, x.flip(0), y.flip(0)), ref)}")
    print(f"eager, channels_last: {_distance(_grads(model, x, y, channels_last=True), ref)}")
    with torch.backends.mkldnn.flags(enabled=False):
        print(f"eager, oneDNN off: {_distance(_grads(model, x, y), ref)}", flush=True)
    config = json.loads(args.config) if args.config.startswith("{") else args.config
    be = arbiter.Arbiter(config)
    print(f"arbiter {args.config}: {_distance(_grads(model, x, y, backend=be), ref)}")
    for g in be.report(advice=False).graphs:
        print(f"  {g.kind}: " + ", ".join(
            f"{p.backend} ({'; '.join(c.result for c in p.first_use) or 'unchecked'})"
            for p in g.partitions))


if __name__ == "__main__":
    main()
