"""Checked before trusted (verify mode `unverified`, the default; arbiter/run/checks/first_use.py).

A partition holding an (op, dtype) that no probe verified is compared with eager on its
first call on a backend; a difference demotes it, is traced to the op and output that
differ, and is kept (arbiter/plan/findings.py) so that the planner refuses it from then on, in
this process and in the next. A probed op alone is not checked; several ops compiled
together are, whatever their probes said. Test backends here declare
their ops (``verified: declared``) unless a manifest says otherwise.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import arbiter
from conftest import write_manifest

OPS = ["aten.mul.Tensor", "aten.add.Tensor", "aten.sin.default"]


def f(x):
    return torch.sin(x * 2) + x


def _lies_about_sin(self, gm, example_inputs):
    """A backend that computes every op right except sin (off by 0.5)."""
    wrong = any(n.target is torch.ops.aten.sin.default for n in gm.graph.nodes)

    def run(*args):
        out = list(gm(*args))
        return [o + 0.5 for o in out] if wrong else out
    return run


def _parts(be):
    return [p for g in be.report().graphs for p in g.partitions]


def test_declared_op_is_checked_at_first_use_and_refused_after(make_backend, fresh_dynamo):
    liar = make_backend("liar", OPS, compile=_lies_about_sin)
    be = arbiter.Arbiter({"backends": ["liar"], "min_block_size": 1})
    assert be.config.verify.mode == "unverified"  # the default
    x = torch.randn(4, 4)
    torch.testing.assert_close(torch.compile(f, backend=be)(x), f(x))
    (p,) = _parts(be)
    (fb,) = p.fallbacks
    assert (fb.from_backend, fb.to_backend, fb.stage) == ("liar", "eager", "verify")
    (check,) = p.first_use
    assert check.backend == "liar" and check.result == "failed"
    assert "aten.sin.default float32 (verified: declared)" in check.unverified
    assert check.findings == ["aten.sin.default float32"]  # traced to the op alone
    assert "first-use checks: 1 (1 failed)" in be.report().summary()
    # the planner now refuses sin on liar, with the finding as its reason; mul and add stay
    torch._dynamo.reset()
    again = arbiter.Arbiter({"backends": ["liar"], "min_block_size": 1})
    seen = len(liar.compiled)
    torch.testing.assert_close(torch.compile(f, backend=again)(x), f(x))
    (g,) = again.report().graphs
    sin = next(o for o in g.ops if o.op == "aten.sin.default")
    assert "differed from eager at first use" in sin.refused["liar"]
    assert not any(n.target is torch.ops.aten.sin.default
                   for gm in liar.compiled[seen:] for n in gm.graph.nodes)
    assert any(p.backend == "liar" for p in g.partitions)


def test_a_probed_op_alone_is_trusted_and_probed_ops_together_are_checked(
        make_backend, fresh_dynamo, tmp_path):
    """A partition of one probed op is what its probe ran: trusted, unchecked (here the
    backend lies about it and is believed: the probe is the evidence). Several probed ops
    compiled together are a composition no probe ran: the first call is checked, the lie
    caught, the partition's own finding kept."""
    cls = make_backend("trusted", OPS, compile=_lies_about_sin)
    path = tmp_path / "trusted_probed.yaml"
    path.write_text(textwrap.dedent("""\
        backend: trusted
        format: 1
        source: written by a test
        defaults: {dtypes: [float32], devices: [cpu]}
        ops:
          aten.mul.Tensor: {verified: probed, probed_dtypes: [float32]}
          aten.add.Tensor: {verified: probed, probed_dtypes: [float32]}
          aten.sin.default: {verified: probed, probed_dtypes: [float32]}
        """))
    cls.manifest_path = classmethod(lambda c: path)
    be = arbiter.Arbiter({"backends": ["trusted"], "min_block_size": 1})
    x = torch.randn(4, 4)
    out = torch.compile(torch.sin, backend=be)(x)
    (p,) = _parts(be)
    # one probed op: the manifest's evidence is trusted, no check, the answer stands
    assert p.backend == "trusted" and not p.first_use and p.verify_checks == 0
    assert torch.allclose(out, torch.sin(x) + 0.5)
    torch._dynamo.reset()
    be = arbiter.Arbiter({"backends": ["trusted"], "min_block_size": 1})
    out = torch.compile(f, backend=be)(x)
    (p,) = _parts(be)
    (check,) = p.first_use
    assert check.unverified == ["3 ops compiled together (the probes ran each op alone; counted as the backend got them, its decompositions applied)"]
    assert check.result == "failed" and check.findings == ["the partition as a whole"], \
        (check.result, check.findings)
    torch.testing.assert_close(out, f(x))


@pytest.mark.parametrize("probe, why", [
    ({}, None),  # the probe ran with this torch, this backend version, on this device
    ({"torch": "2.1.0"}, "probed with torch 2.1.0, this is " + torch.__version__),
    ({"backend_version": "0.0.1"}, "probed with 0.0.1, this is " + torch.__version__),
    ({"device": "cuda"}, "probed on cuda, this runs on cpu"),
], ids=["same", "other torch", "other backend version", "other device"])
def test_evidence_from_other_software_or_device_is_checked_again(
        make_backend, fresh_dynamo, tmp_path, probe, why):
    cls = make_backend("trusted", OPS, compile=_lies_about_sin)
    info = {"date": "2026-11-26", "torch": torch.__version__,
            "backend_version": torch.__version__, **probe}  # a test backend's version()
    path = tmp_path / "trusted_probed.yaml"
    path.write_text(textwrap.dedent(f"""\
        backend: trusted
        defaults: {{dtypes: [float32], devices: [cpu]}}
        ops:
          aten.mul.Tensor: {{verified: probed, probed_dtypes: [float32]}}
          aten.add.Tensor: {{verified: probed, probed_dtypes: [float32]}}
          aten.sin.default: {{verified: probed, probed_dtypes: [float32]}}
        probe: {json.dumps(info)}
        """))
    cls.manifest_path = classmethod(lambda c: path)
    be = arbiter.Arbiter({"backends": ["trusted"], "min_block_size": 1})
    x = torch.randn(4, 4)
    out = torch.compile(f, backend=be)(x)
    (p,) = _parts(be)
    (check,) = p.first_use  # the three ops together are checked whatever the probe said
    assert check.result == "failed"
    assert "3 ops compiled together (the probes ran each op alone; counted as the backend got them, its decompositions applied)" in check.unverified
    sin = [u for u in check.unverified if u.startswith("aten.sin.default")]
    assert sin == ([] if why is None else [f"aten.sin.default float32 ({why})"])
    torch.testing.assert_close(out, f(x))


def _chain(x):
    for _ in range(200):  # float16 eager rounds at every step: 0.04 off at the end
        x = x * 0.999 + 0.01
    return x


def _computes_in_float64(scale):
    """A backend that computes the graph in float64 and rounds once (then scales)."""
    def compile(self, gm, example_inputs):
        from arbiter.run.checks.reference import float64_outputs

        def run(*args):
            return [(o * scale).to(a.dtype) for o, a in zip(float64_outputs(gm, args), args)]
        return run
    return compile


@pytest.mark.parametrize("scale, passes", [(1.0, True), (1.1, False)],
                         ids=["more accurate than eager", "10% off"])
def test_a_float16_difference_is_judged_against_a_float64_reference(
        make_backend, fresh_dynamo, tmp_path, scale, passes):
    cls = make_backend("precise", OPS, compile=_computes_in_float64(scale))
    path = tmp_path / "precise.yaml"
    path.write_text("backend: precise\ndefaults: {dtypes: [float16], devices: [cpu]}\n"
                    "ops: {aten.mul.Tensor: {}, aten.add.Tensor: {}}\n")
    cls.manifest_path = classmethod(lambda c: path)
    be = arbiter.Arbiter({"backends": ["precise"], "min_block_size": 1})
    x = torch.rand(64, dtype=torch.float16)
    out = torch.compile(_chain, backend=be)(x)
    exact = _chain(x.double())
    assert not torch.allclose(_chain(x), exact.half(), rtol=1e-2, atol=1e-3)  # eager's error
    (p,) = _parts(be)
    (check,) = p.first_use
    if passes:  # differs from eager beyond float16's tolerance, but towards the true value
        assert check.result == "passed" and p.backend == "precise" and not p.fallbacks
        torch.testing.assert_close(out, exact.half())
    else:
        assert check.result == "failed" and p.backend == "eager"
        assert "against a float64 reference its error is RMS" in p.fallbacks[0].reason
        torch.testing.assert_close(out, _chain(x))


def test_verify_off_trusts_declarations(make_backend, fresh_dynamo):
    make_backend("liar", OPS, compile=_lies_about_sin)
    be = arbiter.Arbiter({"backends": ["liar"], "min_block_size": 1,
                          "verify": {"mode": "off"}})
    x = torch.randn(4, 4)
    assert torch.allclose(torch.compile(f, backend=be)(x), f(x) + 0.5)
    assert not _parts(be)[0].first_use


def _second_output_wrong(self, gm, example_inputs):
    """A backend whose max.dim returns wrong indices (output 1), right values."""
    def run(*args):
        out = list(gm(*args))
        for k, n in enumerate(_outputs(gm)):
            if n.target is __import__("operator").getitem and n.args[1] == 1 \
                    and n.args[0].target is torch.ops.aten.max.dim:
                out[k] = out[k] + 1
        return out
    return run


def _outputs(gm):
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return list(out.args[0])


def test_a_wrong_output_refuses_only_the_nodes_that_read_it(make_backend, fresh_dynamo):
    make_backend("idx", ["aten.max.dim", "aten.add.Tensor"], compile=_second_output_wrong)
    be = arbiter.Arbiter({"backends": ["idx"], "min_block_size": 1})

    def both(x):
        v, i = torch.max(x, 1)
        return v + 1, i

    x = torch.randn(4, 5)
    for got, want in zip(torch.compile(both, backend=be)(x), both(x)):
        torch.testing.assert_close(got, want)
    (check,) = _parts(be)[0].first_use
    assert check.result == "failed" and check.findings == ["aten.max.dim float32 output 1"]
    # a graph that reads only the values still runs max on the backend
    torch._dynamo.reset()
    values = arbiter.Arbiter({"backends": ["idx"], "min_block_size": 1})
    torch.testing.assert_close(torch.compile(lambda x: torch.max(x, 1)[0] + 1,
                                             backend=values)(x), torch.max(x, 1)[0] + 1)
    (p,) = _parts(values)
    assert p.backend == "idx" and p.ops.get("aten.max.dim") == 1


def _wrong_together(self, gm, example_inputs):
    """Right on any graph of one op, wrong on a graph of several."""
    several = sum(n.op == "call_function" for n in gm.graph.nodes) > 1

    def run(*args):
        out = list(gm(*args))
        return [o * 3 for o in out] if several else out
    return run


def test_a_difference_no_node_shows_alone_is_the_partition_s(make_backend, fresh_dynamo):
    make_backend("pair", OPS, compile=_wrong_together)
    x = torch.randn(4, 4)
    be = arbiter.Arbiter({"backends": ["pair"], "min_block_size": 1})
    torch.testing.assert_close(torch.compile(f, backend=be)(x), f(x))
    (check,) = _parts(be)[0].first_use
    assert check.result == "failed" and check.findings == ["the partition as a whole"]
    # the same partition on the same backend is skipped from then on, before compiling
    torch._dynamo.reset()
    again = arbiter.Arbiter({"backends": ["pair"], "min_block_size": 1})
    torch.testing.assert_close(torch.compile(f, backend=again)(x), f(x))
    (p,) = _parts(again)
    (fb,) = p.fallbacks
    assert fb.stage == "verify" and "this partition" in fb.reason and p.backend == "eager"


_SECOND_PROCESS = '''
import json, sys, torch, arbiter

class Liar(arbiter.Backend):
    name = "liar"
    compiled = []

    @classmethod
    def manifest_path(cls):
        return {manifest!r}

    def compile(self, gm, example_inputs):
        Liar.compiled.append(sorted(str(n.target) for n in gm.graph.nodes
                                    if n.op == "call_function"))
        wrong = any(n.target is torch.ops.aten.sin.default for n in gm.graph.nodes)
        def run(*args):
            out = list(gm(*args))
            return [o + 0.5 for o in out] if wrong else out
        return run

arbiter.register_backend(Liar)
be = arbiter.Arbiter({{"backends": ["liar"], "min_block_size": 1}})
f = lambda x: torch.sin(x * 2) + x
x = torch.randn(4, 4)
ok = torch.allclose(torch.compile(f, backend=be)(x), f(x))
parts = [p for g in be.report().graphs for p in g.partitions]
print(json.dumps({{"ok": ok, "compiled": Liar.compiled,
                   "checks": [c.result for p in parts for c in p.first_use],
                   "fallbacks": [fb.stage for p in parts for fb in p.fallbacks]}}))
'''


def test_a_second_process_does_not_try_again(tmp_path):
    manifest = write_manifest(tmp_path, "liar", OPS)
    script = tmp_path / "liar.py"
    script.write_text(_SECOND_PROCESS.format(manifest=str(manifest)))
    env = {**os.environ, "ARBITER_CACHE_DIR": str(tmp_path / "cache")}

    def run() -> dict:
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                             env=env, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first, second = run(), run()
    assert first["ok"] and first["checks"] == ["failed"] and first["fallbacks"] == ["verify"]
    # the first process compiled the partition, then sin alone to find the culprit
    assert any("aten.sin.default" in c for c in first["compiled"])
    # the second never hands sin to liar: the finding came from the cache
    assert second["ok"] and "failed" not in second["checks"] and not second["fallbacks"]
    assert not any("aten.sin.default" in c for c in second["compiled"])
    assert second["compiled"], "mul and add still run on liar"


def test_a_fused_backward_that_is_wrong_is_caught(fresh_dynamo):
    """Inductor (torch 2.13) compiles a Falcon-style layer's backward wrong (gradients 7%
    off; every op of it probed): the partition's first call is checked as a composition,
    demoted to eager, and the gradients are eager's. Where Inductor computes it right,
    the check passes and the gradients are eager's all the same."""
    import copy

    tf = pytest.importorskip("transformers", reason="transformers is not installed")
    torch.manual_seed(0)
    cfg = tf.FalconConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                          vocab_size=100)
    model = tf.FalconModel(cfg).train()

    class Hidden(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(ids).last_hidden_state

    net, ids = Hidden(model), torch.randint(0, 100, (1, 32))
    ref = copy.deepcopy(net)
    be = arbiter.Arbiter({"backends": ["inductor"], "policy": "priority",
                          "against_eager": "off"})
    out = torch.compile(net, backend=be)(ids)
    r = torch.randn(out.shape)
    (out * r).sum().backward()
    (ref(ids) * r).sum().backward()
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-3,
                                   msg=lambda m: f"{name}: {m}")
    backward = [g for g in be.report(advice=False).graphs if g.kind == "backward"]
    assert backward and all(p.first_use for g in backward for p in g.partitions
                            if p.planned_backend == "inductor")


def test_a_finding_of_an_older_judging_rule_is_not_read(tmp_path, monkeypatch):
    """Findings are keyed by the rule that judged them (findings.JUDGE): a partition
    refused under an older rule (float32's tolerance for a quantized partition) is
    tried again, not refused in every later process."""
    from arbiter.cache import Cache
    from arbiter.plan import findings as fmod

    cache = Cache(tmp_path / "c")
    older = fmod.Findings()
    older.attach(cache)
    monkeypatch.setattr(fmod, "JUDGE", fmod.JUDGE - 1)
    older.add(fmod.new_finding("onnxruntime", "1.0", "aten.sin.default", "float32", -1,
                               "differs"))
    same_rule = fmod.Findings()
    same_rule.attach(cache)
    assert len(same_rule.for_op("onnxruntime", "1.0", "aten.sin.default")) == 1
    monkeypatch.undo()
    now = fmod.Findings()
    now.attach(cache)
    assert now.for_op("onnxruntime", "1.0", "aten.sin.default") == []
