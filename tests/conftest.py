"""Shared helpers for the torch-arbiter test suite.

* ``registry`` snapshots and restores ``arbiter.registry._REGISTRY`` around a test, so
  backends registered by a test never leak into another.
* ``make_backend`` builds a Backend subclass with its own manifest in ``tmp_path``.
* ``trace`` gives an ATen FX graph (``meta["val"]`` on every node) via ``make_fx``.
"""
from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import arbiter
import arbiter.registry as registry_mod
from arbiter.ops import is_getitem

#: Policy `calibrated` (the embedded default's) plans with a recorded calibration in the
#: tests (the placement gate's plans must not depend on the machine or its load), and no
#: test process spends a minute measuring one. tests/test_calibrated.py measures its own.
os.environ.setdefault("ARBITER_CALIBRATION",
                      str(Path(__file__).with_name("calibration_reference.json")))

#: A config using two real backends and small partitions, for tiny graphs.
TWO = {"backends": ["onnxruntime", "inductor"], "min_block_size": 1}


def trace(fn: Callable, *args: Any) -> torch.fx.GraphModule:
    """An ATen FX graph of ``fn`` whose nodes carry FakeTensor ``meta["val"]``."""
    return make_fx(fn, tracing_mode="fake")(*args)


def compute_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr")]


def check_plan_invariants(plan, gm: torch.fx.GraphModule) -> None:
    """What every plan must satisfy, whatever the config.

    * every compute node is in exactly one partition;
    * the partitions, in order, are a topological order of the graph (so the partition
      graph is acyclic: each input of a node comes from an earlier partition or earlier
      in the same one);
    * a getitem is in the partition of the tuple it reads;
    * every node's backend is one its support said could run it.
    """
    flat = [n for p in plan.partitions for n in p.nodes]
    expected = compute_nodes(gm)
    assert sorted(n.name for n in flat) == sorted(n.name for n in expected)
    assert len(flat) == len(set(flat)), "a node is in two partitions"
    pos = {n: i for i, n in enumerate(flat)}
    part_of = {n: p.id for p in plan.partitions for n in p.nodes}
    order = {p.id: k for k, p in enumerate(plan.partitions)}
    for n in flat:
        for inp in n.all_input_nodes:
            if inp in pos:
                assert pos[inp] < pos[n], f"{n.name} runs before its input {inp.name}"
                assert order[part_of[inp]] <= order[part_of[n]]
        if is_getitem(n) and n.args[0] in part_of:
            assert part_of[n] == part_of[n.args[0]], f"{n.name} left its producer"
    for p in plan.partitions:
        for n in p.nodes:
            if not is_getitem(n):
                assert p.backend in plan.candidates(n), (n.name, p.backend)


def run_in_plan_order(plan, gm: torch.fx.GraphModule, *args: Any) -> Any:
    """Execute the graph's nodes in the plan's partition order (what the stitched graph
    does); the result must equal ``gm(*args)`` when the order is valid."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    env = dict(zip(placeholders, args))
    for p in plan.partitions:
        for n in p.nodes:
            a = torch.fx.node.map_arg(n.args, lambda v: env[v])
            k = torch.fx.node.map_arg(n.kwargs, lambda v: env[v])
            env[n] = n.target(*a, **k)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return torch.fx.node.map_arg(out.args[0], lambda v: env[v])


def off_where(target, by: float = 0.1) -> Callable:
    """A ``compile`` for ``make_backend``: graphs holding a node of ``target`` come out
    off by ``by`` (every output), the others right."""

    def compile(self, gm, example_inputs):
        wrong = any(n.target is target for n in gm.graph.nodes)

        def fn(*args):
            out = list(gm(*args))
            return [o + by for o in out] if wrong else out
        return fn
    return compile


def run_cli(argv: list[str], capsys) -> tuple[str, str]:
    """``arbiter ARGV`` in this process, Dynamo reset around it: (stdout, stderr); it must
    succeed."""
    from arbiter.cli import main

    torch._dynamo.reset()
    try:
        rc = main(argv)
    finally:
        torch._dynamo.reset()
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out, err


def write_manifest(directory: Path, name: str, ops: list[str], *,
                   dynamic: bool = False, extra: str = "",
                   dtypes: str = "float32, int64, bool") -> Path:
    path = directory / f"{name}.yaml"
    body = "\n".join(f"  {op}: {{}}" for op in ops)
    path.write_text(textwrap.dedent(f"""\
        backend: {name}
        format: 1
        source: written by a test
        defaults:
          dtypes: [{dtypes}]
          devices: [cpu]
          dynamic: {str(dynamic).lower()}
        """) + extra + "ops:\n" + (body or "  {}") + "\n")
    return path


@pytest.fixture(scope="session", autouse=True)
def _arbiter_cache_dir(tmp_path_factory):
    """Every test writes the persistent cache (arbiter/cache/) under a temporary
    directory, never the user's ~/.cache/torch-arbiter."""
    import os

    saved = os.environ.get("ARBITER_CACHE_DIR")
    os.environ["ARBITER_CACHE_DIR"] = str(tmp_path_factory.mktemp("arbiter-cache"))
    yield
    if saved is None:
        os.environ.pop("ARBITER_CACHE_DIR", None)
    else:
        os.environ["ARBITER_CACHE_DIR"] = saved


@pytest.fixture(autouse=True)
def _forget_findings():
    """What a test's first-use checks found (arbiter/plan/findings.py: process-wide, and in
    the session's cache) does not reach the next test, whose backends of the same name
    may compute otherwise."""
    yield
    from arbiter.plan.findings import findings

    findings().forget()


@pytest.fixture
def registry():
    """Snapshot ``arbiter.registry._REGISTRY`` and restore it after the test."""
    arbiter.backend_names()  # discover the built-ins before the snapshot
    saved = dict(registry_mod._REGISTRY)
    try:
        yield registry_mod._REGISTRY
    finally:
        registry_mod._REGISTRY.clear()
        registry_mod._REGISTRY.update(saved)


@pytest.fixture
def make_backend(registry, tmp_path):
    """make_backend(name, ops, compile=..., available=..., register=True) -> class.

    ``compile`` is ``fn(self, gm, example_inputs) -> callable``; the default returns
    the graph module itself (a compiling backend that runs ATen, not inline).
    """

    def make(name: str, ops: list[str], *, compile: Optional[Callable] = None,
             available: Optional[tuple[bool, str]] = None, register: bool = True,
             dynamic: bool = False, dtypes: str = "float32, int64, bool"
             ) -> type[arbiter.Backend]:
        path = write_manifest(tmp_path, name, ops, dynamic=dynamic, dtypes=dtypes)
        compiled: list = []

        def _compile(self, gm, example_inputs):
            compiled.append(gm)
            if compile is not None:
                return compile(self, gm, example_inputs)
            return gm

        attrs = {
            "name": name,
            "manifest_path": classmethod(lambda cls: path),
            "compile": _compile,
            "compiled": compiled,  # every graph handed to compile, in order
        }
        if available is not None:
            attrs["available"] = lambda self: available
        cls = type(f"TestBackend_{name}", (arbiter.Backend,), attrs)
        if register:
            arbiter.register_backend(cls)
        return cls

    return make


@pytest.fixture
def fresh_dynamo():
    """Reset Dynamo's caches before and after a test that compiles."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def tiny_llama(new_tokens: int, **generate_kw):
    """A 1-layer Llama-style decoder (grouped-query attention: 4 query heads over 2
    key/value heads; random weights), a batch of 2 prompts of 8 tokens and greedy
    ``generate()`` keywords: (model, ids, kw). Skips without transformers."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=128, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 128, (2, 8))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
              do_sample=False, pad_token_id=0, **generate_kw)
    return model, ids, kw


def generate_both(model, ids, kw: dict, options: dict):
    """Greedy ``generate()`` in eager, then with the model's forward compiled by arbiter
    under ``options``: (eager's tokens, arbiter's)."""
    with torch.no_grad():
        want = model.generate(ids, **kw)
        model.forward = torch.compile(model.forward, backend="arbiter", options=options)
        got = model.generate(ids, **kw)
    return want, got
