"""Hugging Face ``generate()`` with the model's forward compiled: eager, Inductor,
OpenVINO's own torch.compile backend, arbiter's `default` and `cpu_all` configs
(docs/generation.md).

Each contender lives in its own process (its compiles and caches its own: fresh arbiter
and Inductor cache folders) and is driven in rounds from here, one round of every
contender after another, so load falls on all alike (interleaved). In its process:

* the first generate (every compile: prefill and decode graphs) is timed alone and its
  tokens are compared with eager's (greedy decoding: they must be equal);
* each round times a generate of 1 new token (time to first token: the prefill and one
  step) and one of ``--new`` tokens; ms per generated token is their difference over
  ``--new - 1`` steps.

``arbiter:CONFIG/copies`` keeps a static cache's functional write and its copy back
into the user's buffer whatever the cache's size (what ran before run/cache_writes.py).

Models (random weights from transformers configs, hidden 256, vocab 1000):
  llama  LlamaForCausalLM, 2 layers, 8 query heads over 2 key/value heads (grouped-query)
  gpt2   GPT2LMHeadModel, 2 layers, 4 heads

    .venv/bin/python bench/generate.py [--models llama gpt2] [--cache static dynamic]
        [--batch 1 4] [--prompt 16] [--new 32] [--rounds 5] [--cache-len N]
        [--contenders eager inductor openvino arbiter:default arbiter:cpu_all]

Prints a markdown table per (model, cache, batch), the load average before and after,
and the CPU model.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CONTENDERS = ["eager", "inductor", "openvino", "arbiter:default", "arbiter:cpu_all"]


def build(name: str):
    import torch
    import transformers

    torch.manual_seed(0)
    if name == "llama":
        cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=688,
                                       num_hidden_layers=2, num_attention_heads=8,
                                       num_key_value_heads=2, vocab_size=1000,
                                       max_position_embeddings=512)
        return transformers.LlamaForCausalLM(cfg).eval()
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_embd=256, n_layer=2, n_head=4, vocab_size=1000,
                                      n_positions=512)
        return transformers.GPT2LMHeadModel(cfg).eval()
    raise SystemExit(f"unknown model {name!r}: llama or gpt2")


def worker(model_name: str, contender: str, cache: str, batch: int, prompt: int,
           new: int, cache_len: int = 0) -> None:
    """One contender: reads a line per round from stdin, answers a JSON line.
    ``cache_len``: a static cache of that many positions (a new one per generate)."""
    import torch

    model = build(model_name)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 1000, (batch, prompt), generator=gen)
    base = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0)
    if cache == "static" and not cache_len:
        base["cache_implementation"] = "static"

    def kw() -> dict:  # with a fresh static cache of cache_len positions per generate
        if cache == "static" and cache_len:
            from transformers import StaticCache

            return {**base, "past_key_values": StaticCache(config=model.config,
                                                           max_cache_len=cache_len)}
        return base
    if contender == "inductor":
        model.forward = torch.compile(model.forward)
    elif contender == "openvino":
        import openvino.torch  # noqa: F401 - registers backend="openvino"

        model.forward = torch.compile(model.forward, backend="openvino")
    elif contender.startswith("arbiter:"):
        import arbiter  # noqa: F401

        config, _, variant = contender.split(":", 1)[1].partition("/")
        if variant == "copies":  # the static cache's functional write kept, as before
            from arbiter.run import cache_writes

            cache_writes.MIN_BYTES = float("inf")
        model.forward = torch.compile(model.forward, backend="arbiter",
                                      options={"config": config})
    for line in sys.stdin:
        what = json.loads(line)
        out: dict = {}
        try:
            with torch.no_grad():
                if what == "first":
                    start = time.perf_counter()
                    tokens = model.generate(ids, max_new_tokens=new, **kw())
                    out = {"first_s": time.perf_counter() - start,
                           "tokens": tokens[:, prompt:].tolist()}
                    if contender.startswith("arbiter:"):
                        import arbiter

                        rep = arbiter.report_for(model.forward)
                        out["ran"] = rep.summary() if rep is not None else ""
                else:
                    start = time.perf_counter()
                    model.generate(ids, max_new_tokens=1, **kw())
                    one = time.perf_counter() - start
                    start = time.perf_counter()
                    model.generate(ids, max_new_tokens=new, **kw())
                    many = time.perf_counter() - start
                    out = {"ttft_ms": one * 1e3, "per_token_ms": (many - one) * 1e3 / (new - 1)}
        except Exception as exc:  # noqa: BLE001 - a contender's failure is a result
            out = {"error": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}
        print(json.dumps(out), flush=True)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def run_case(args, model: str, cache: str, batch: int) -> None:
    procs = {}
    tmp = tempfile.mkdtemp(prefix="arbiter-generate-")
    for c in args.contenders:
        env = {**os.environ, "ARBITER_CACHE_DIR": os.path.join(tmp, c, "arbiter"),
               "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, c, "inductor")}
        procs[c] = subprocess.Popen(
            [sys.executable, __file__, "--worker", model, c, cache, str(batch),
             str(args.prompt), str(args.new), str(args.cache_len)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env=env)

    def ask(c: str, what: str) -> dict:
        p = procs[c]
        if p.poll() is not None:
            return {"error": f"process ended (exit {p.returncode})"}
        p.stdin.write(json.dumps(what) + "\n")
        p.stdin.flush()
        line = p.stdout.readline()
        return json.loads(line) if line else {"error": f"process ended (exit {p.wait()})"}

    first = {c: ask(c, "first") for c in args.contenders}  # one at a time: compiles
    rounds: dict[str, list[dict]] = {c: [] for c in args.contenders}
    for r in range(args.rounds):
        order = args.contenders[r % len(args.contenders):] + \
            args.contenders[:r % len(args.contenders)]
        for c in order:
            if "error" not in first[c]:
                rounds[c].append(ask(c, "round"))
    for p in procs.values():
        p.stdin.close()
        p.wait(timeout=60)
    want = first.get("eager", {}).get("tokens")
    size = f" of {args.cache_len} positions" if cache == "static" and args.cache_len else ""
    print(f"\n#### {model}, {cache} cache{size}, batch {batch}, prompt {args.prompt}, "
          f"{args.new} new tokens\n")
    print("| contender | first generate s | tokens equal eager's | TTFT ms | ms/token | "
          "ms/token vs Inductor | what ran |")
    print("|---|---:|---|---:|---:|---:|---|")
    med = {}
    for c in args.contenders:
        ok = [x for x in rounds[c] if "error" not in x]
        if ok:
            med[c] = (statistics.median(x["ttft_ms"] for x in ok),
                      statistics.median(x["per_token_ms"] for x in ok))
    base = med.get("inductor", (None, None))[1]
    for c in args.contenders:
        f = first[c]
        if "error" in f:
            print(f"| {c} | failed: {f['error'][:160]} | | | | | |")
            continue
        equal = "-" if want is None else ("yes" if f["tokens"] == want else "**no**")
        errors = [x["error"] for x in rounds[c] if "error" in x]
        ttft, per = med.get(c, (float("nan"), float("nan")))
        vs = f"{base / per:.2f}x" if base and c in med else "-"
        note = f"; round errors: {errors[0][:80]}" if errors else ""
        print(f"| {c} | {f['first_s']:.1f} | {equal} | {ttft:.1f} | {per:.2f} | {vs} | "
              f"{f.get('ran', '')}{note} |", flush=True)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _, _, model, c, cache, batch, prompt, new, cache_len = sys.argv
        worker(model, c, cache, int(batch), int(prompt), int(new), int(cache_len))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["llama", "gpt2"])
    ap.add_argument("--cache", nargs="+", default=["static", "dynamic"])
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cache-len", type=int, default=0,
                    help="static caches of this many positions (default: prompt + new)")
    ap.add_argument("--contenders", nargs="+", default=CONTENDERS)
    args = ap.parse_args()
    print(f"{cpu_name()}, {os.cpu_count()} cores; load average at start: "
          f"{os.getloadavg()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for model in args.models:
        for cache in args.cache:
            for batch in args.batch:
                run_case(args, model, cache, batch)
    print(f"\nload average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
