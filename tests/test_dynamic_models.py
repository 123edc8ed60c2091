"""Models whose batch and sequence (or image) sizes vary, compiled once with symbols.

A text encoder (batch, sequence), a decoder (GPT-2, batch, sequence) and a CNN (batch,
image size) are called at three sizes with ``torch.compile(dynamic=None | True | False)``
under the default config and ``cpu_all``; every answer equals eager's. With ``None``
Dynamo compiles a static graph, then one symbolic graph on the second size, which serves
the third without compiling anything; with ``True`` the first graph is symbolic; with
``False`` every size is its own static graph. Symbolic partitions must run as one
artifact on a backend (``symbolic``), nothing in eager because of shapes.

The whole matrix is ``slow`` (about 5 minutes on 2 cores); one case per model runs by
default.
"""
from __future__ import annotations

import pytest
import torch

import arbiter
from arbiter.cli import examples

TOL = {"rtol": 1e-4, "atol": 1e-4}


def _encoder():
    model, _ = examples.encoder_block()
    return model, [(torch.randn(2, 16, 64),), (torch.randn(3, 20, 64),),
                   (torch.randn(4, 24, 64),)]


def _decoder():  # batch 1 first, as generation does
    model, _ = examples.gpt2_tiny()
    g = torch.Generator().manual_seed(0)
    return model, [(torch.randint(0, 1000, (1, 32), generator=g),),
                   (torch.randint(0, 1000, (2, 24), generator=g),),
                   (torch.randint(0, 1000, (3, 40), generator=g),)]


def _cnn():
    model, _ = examples.small_cnn()
    return model, [(torch.randn(2, 3, 32, 32),), (torch.randn(3, 3, 40, 40),),
                   (torch.randn(4, 3, 48, 48),)]


MODELS = {"encoder": _encoder, "decoder": _decoder, "cnn": _cnn}
#: the cases that run by default: one per model, each config at least once
FAST = {("encoder", "default", None), ("decoder", "default", None), ("cnn", "cpu_all", None)}


def _cases():
    for name in MODELS:
        for config in ("default", "cpu_all"):
            for dynamic in (None, True, False):
                marks = () if (name, config, dynamic) in FAST else (pytest.mark.slow,)
                yield pytest.param(name, config, dynamic, marks=marks,
                                   id=f"{name}-{config}-dynamic={dynamic}")


@pytest.mark.parametrize("name,config,dynamic", list(_cases()))
def test_varying_sizes_equal_eager(name, config, dynamic, fresh_dynamo):
    if config == "cpu_all":
        pytest.importorskip("openvino")
    torch.manual_seed(0)
    model, calls = MODELS[name]()
    model.eval()
    be = arbiter.Arbiter(config)
    compiled = torch.compile(model, backend=be, dynamic=dynamic)
    with torch.no_grad():
        for args in calls:
            torch.testing.assert_close(compiled(*args), model(*args), **TOL)
        counts = [len(be.graphs)]
        again = calls[-1]  # a size seen before: nothing compiles
        torch.testing.assert_close(compiled(*again), model(*again), **TOL)
        counts.append(len(be.graphs))
    rep = be.report()
    kinds = {g.kind for g in rep.graphs}
    assert kinds == {"inference"}
    symbolic = [g for g in rep.graphs if g.symbols]
    expected = {None: (2, 1), True: (1, 1), False: (3, 0)}[dynamic]
    if dynamic is True and name == "decoder":
        # batch 1 first: Dynamo specializes sizes 0 and 1 even with dynamic=True, so the
        # first graph is symbolic in the sequence only, the second in both
        expected = (2, 2)
    # per Dynamo frame: graph breaks would add frames, these models have none
    assert (len(rep.graphs), len(symbolic)) == expected, rep.summary()
    assert counts[0] == counts[1]
    for g in symbolic:
        assert g.shape_eager_share == 0.0, str(rep)
        compiled = [p for p in g.partitions if not p.inline]
        # one artifact for every size; a partition of static values (GPT-2's attention
        # scale, a 0-d tensor) is static; none is compiled per shape
        assert compiled and all(p.compiled for p in compiled), str(rep)
        assert any(p.shapes == "symbolic" for p in compiled), str(rep)
        assert all(p.shapes in ("symbolic", "static") for p in compiled), str(rep)
        assert not any("symbolic shapes" in f.reason for p in compiled for f in p.fallbacks
                       if f.to_backend == "eager"), str(rep)
    if dynamic is None:
        assert [g.recompile for g in rep.graphs] == [0, 1]
