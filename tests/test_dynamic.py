"""Symbolic (dynamic) shapes: partitions with symbols compile on backends and stay right.

The pieces, then whole models: symbols and ranges read off a graph (arbiter/shapes.py),
SymInt inputs crossing partition boundaries (run/split.py), the capability check
(per-shape candidates), a symbolic artifact checked at a second shape before it is
trusted, the per-shape cache and its limit (run/dynamic.py), the report's symbols,
recompiles and eager share. Models across batch and sequence sizes with
``dynamic=None/True/False`` under the default config and ``cpu_all`` live in
tests/test_dynamic_models.py.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import arbiter
from arbiter import shapes
from arbiter.cli import examples
from arbiter.run.dynamic import ShapeError, Symbolic, specialize

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _symbolic_trace(fn, *args):
    return make_fx(fn, tracing_mode="symbolic")(*args)


# -- arbiter/shapes.py -------------------------------------------------------------------
def _halves(x, z):
    b, t = x.shape
    h = x.view(b, t // 2, 2).sum(-1).repeat_interleave(2, dim=1)
    return (h * z.view(b, t, 2).mean(-1),)


def test_reader_binds_symbols_and_computes_output_shapes():
    x, z = torch.randn(3, 6), torch.randn(3, 12)
    gm = _symbolic_trace(_halves, x, z)
    reader = shapes.Reader(shapes.input_values(gm))
    assert not reader.unbound
    bound = {str(k): v for k, v in reader.bind([x, z]).items()}
    assert sorted(bound.values()) == [3, 6], bound  # b and t; z's 2t is no new symbol
    from arbiter.ops import output_values

    out_vals = output_values(gm)
    fn = reader.shapes_function(out_vals)
    assert fn([torch.randn(5, 8), torch.randn(5, 16)]) == [(5, 8)]


def test_second_assignment_satisfies_the_graphs_guards():
    # t must be even (view(b, t // 2, 2)) and z is (b, 2t): a second shape keeps both
    x, z = torch.randn(3, 6), torch.randn(3, 12)
    gm = _symbolic_trace(_halves, x, z)
    values = shapes.input_values(gm)
    second = shapes.second_assignment(values, [x, z])
    assert second is not None
    new = shapes.inputs_at(values, [x, z], second.assignment)
    b, t = new[0].shape
    assert (b, t) != (3, 6) and t % 2 == 0 and new[1].shape == (b, 2 * t)
    assert b != t  # distinct values: a backend that merged the two sizes is caught
    torch.testing.assert_close(gm(*new)[0], _halves(*new)[0])


def test_second_assignment_respects_ranges():
    x = torch.randn(4, 3)
    gm = _symbolic_trace(lambda a: (a[:, :2] * 2,), x)
    values = shapes.input_values(gm)
    env = shapes.shape_env_of(values)
    sym = shapes.expr(values[0].shape[0])
    from torch.utils._sympy.value_ranges import ValueRanges

    env.var_to_range[sym] = ValueRanges(4, 4)  # as if mark_dynamic(min=4, max=4)
    assert shapes.second_assignment(values, [x]) is None


def test_inputs_at_tiles_integer_values_within_the_first_calls_range():
    ids = torch.tensor([[5, 9, 7], [6, 8, 5]])
    gm = _symbolic_trace(lambda i: (torch.nn.functional.embedding(i, torch.randn(10, 4)),), ids)
    values = shapes.input_values(gm)
    second = shapes.second_assignment(values, [ids])
    (new,) = shapes.inputs_at(values, [ids], second.assignment)
    assert new.shape != ids.shape and int(new.min()) >= 5 and int(new.max()) <= 9


def test_export_dynamic_shapes_named_from_ranges():
    x = torch.randn(4, 3)
    gm = _symbolic_trace(lambda a: (a.reshape(-1) * 2,), x)
    (spec,) = shapes.export_dynamic_shapes(shapes.input_values(gm))
    dims = list(spec.values())
    assert len(dims) == 2 and all(d.__name__.startswith("s") for d in dims)
    assert all(d.min == 2 for d in dims)


# -- run/split.py: SymInt inputs ---------------------------------------------------------
def _aot_graph(f, *calls):
    """The last ATen graph AOTAutograd makes of ``f`` under Dynamo (automatic dynamic:
    the second call's graph is symbolic, with SymInt placeholders), and its real args."""
    from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

    got = {}

    def backend(gm, example_inputs):
        def compiler(fx_g, _):
            got["gm"] = fx_g

            def run(*args):
                got["args"] = list(args)
                return fx_g(*args)
            return make_boxed_func(run)
        return aot_module_simplified(gm, example_inputs, fw_compiler=compiler,
                                     inference_compiler=compiler)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=backend)
    with torch.no_grad():
        for args in calls:
            compiled(*args)
    torch._dynamo.reset()
    return got["gm"], got["args"]


def _fold(x, mask):
    b, t, d = x.shape
    y = torch.relu(x.reshape(b * t, d)) + 1
    return y.reshape(b, t, d) * mask[:, :, None] + t


def _real_args(values, x, m):
    """Real arguments for an AOT graph of ``_fold``: its SymInt inputs from the sizes of
    the tensors (placeholders of symbols come before the tensors carrying them)."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    sizes = {shapes.expr(s): n for v, t in zip(tensors, (x, m)) for s, n in zip(v.shape, t.shape)}
    real = iter([x, m])
    return [sizes[shapes.expr(v)] if isinstance(v, torch.SymInt) else next(real) for v in values]


def _cut(gm, names):
    from arbiter.plan.partition import Partition, Plan
    from arbiter.run.split import extract

    part = Partition(0, "x", [n for n in gm.graph.nodes if n.name in names])
    return extract(Plan(gm, [part], {}), part, {})


def test_extract_reads_symints_from_its_tensor_inputs():
    calls = [(torch.randn(2, 3, 4), torch.randn(2, 3)), (torch.randn(3, 5, 4), torch.randn(3, 5))]
    gm, args = _aot_graph(_fold, *calls)
    outer = shapes.input_values(gm)
    assert any(isinstance(v, torch.SymInt) for v in outer)  # the AOT graph takes SymInts
    compute = [n.name for n in gm.graph.nodes if n.op == "call_function"
               and isinstance(n.meta.get("val"), torch.Tensor)]
    sub = _cut(gm, compute)
    inner = shapes.input_values(sub.gm)
    # every symbol is a bare dimension of a tensor input: no int input is left
    assert not any(isinstance(v, torch.SymInt) for v in inner), inner
    assert any(n.target is torch.ops.aten.sym_size.int for n in sub.gm.graph.nodes)
    index = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    for x, m in calls + [(torch.randn(4, 6, 4), torch.randn(4, 6))]:
        real = _real_args(outer, x, m)
        got = sub.gm(*[real[index[n]] for n in sub.inputs])
        torch.testing.assert_close(got[0], _fold(x, m))


def test_extract_brings_symbols_only_a_size_expression_carries():
    calls = [(torch.randn(2, 3, 4), torch.randn(2, 3)), (torch.randn(3, 5, 4), torch.randn(3, 5))]
    gm, _ = _aot_graph(_fold, *calls)
    relu = next(n for n in gm.graph.nodes if n.name.startswith("relu"))
    # from the relu to the reshape back to (b, t, 4): its one input is (b*t, 4)
    names, after = [], False
    for n in gm.graph.nodes:
        after = after or n is relu
        if after and n.op == "call_function":
            names.append(n.name)
            if n.meta["val"].dim() == 3:
                break
    sub = _cut(gm, names)
    inner = shapes.input_values(sub.gm)
    ints = [v for v in inner if isinstance(v, torch.SymInt)]
    # the (b*t, 4) input binds neither b nor t: both come in as the graph's own SymInts,
    # the ones whose raw expression is the symbol (Inductor binds symbols by it)
    assert len(ints) == 2 and all(v.node._expr == shapes.expr(v) for v in ints), ints
    reader = shapes.Reader(inner)
    assert not reader.unbound
    x = torch.randn(6, 4)
    ints = iter([2, 3])
    (got,) = sub.gm(*[x if isinstance(v, torch.Tensor) else next(ints) for v in inner])
    # the order of the two ints follows the outer graph's; either way sizes multiply to 6
    assert got.shape[:2] in ((2, 3), (3, 2)) and got.shape[2] == 4


# -- the capability check --------------------------------------------------------------
def test_symbolic_node_is_per_shape_on_a_static_manifest_and_refused_when_off(make_backend):
    make_backend("dyn", ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"],
                 dynamic=True)
    make_backend("static", ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"])

    def f(x):
        return torch.relu(x) * 2 + x

    gm = _symbolic_trace(f, torch.randn(4, 3))
    relu = next(n for n in gm.graph.nodes if n.name == "relu")
    plan = arbiter.partition(gm, {"backends": ["static", "dyn"], "min_block_size": 1})
    sup = plan.support[relu]
    # the backend that takes symbols comes first, whatever the config order
    assert sup.candidates == ("dyn", "static", "eager")
    assert "static" in sup.per_shape and sup.per_shape["static"].startswith(shapes.REASON)
    off = arbiter.partition(gm, {"backends": ["static"], "min_block_size": 1,
                                 "shapes": {"max_specializations": 0}})
    sup = off.support[relu]
    assert sup.candidates == ("eager",)
    assert "max_specializations: 0" in sup.refusals["static"]


def test_static_graph_has_no_per_shape(make_backend):
    make_backend("static", ["aten.relu.default"])
    gm = make_fx(torch.relu, tracing_mode="fake")(torch.randn(4, 3))
    plan = arbiter.partition(gm, {"backends": ["static"], "min_block_size": 1})
    assert all(not s.per_shape for s in plan.support.values())


# -- a symbolic artifact is checked at a second shape ---------------------------------
def _first_call_only(self, gm, example_inputs):
    """A broken 'dynamic' backend: it answers every call with the first call's result,
    as an exporter that silently produced a static graph would."""
    frozen = [a.clone() if isinstance(a, torch.Tensor) else a for a in example_inputs]
    return lambda *args: gm(*frozen)


def test_artifact_wrong_at_a_second_shape_is_not_trusted(make_backend, fresh_dynamo):
    make_backend("liar", ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"],
                 compile=_first_call_only, dynamic=True)
    be = arbiter.Arbiter({"backends": ["liar"], "min_block_size": 1,
                          "shapes": {"max_specializations": 0}})

    def f(x):
        return torch.relu(x) * 2 + x

    compiled = torch.compile(f, backend=be, dynamic=True)
    for n in (4, 7, 9):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x), f(x))
    (part,) = be.report().graphs[0].partitions
    assert part.backend == "eager"
    (fb,) = part.fallbacks
    assert fb.stage == "compile" and "second shape" in fb.reason, fb.reason


def test_right_artifact_passes_the_second_shape_check(make_backend, fresh_dynamo):
    make_backend("honest", ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"],
                 dynamic=True)
    be = arbiter.Arbiter({"backends": ["honest"], "min_block_size": 1})

    def f(x):
        return torch.relu(x) * 2 + x

    compiled = torch.compile(f, backend=be, dynamic=True)
    for n in (4, 7, 9):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x), f(x))
    (part,) = be.report().graphs[0].partitions
    assert (part.backend, part.shapes, part.fallbacks) == ("honest", "symbolic", [])
    # compiled once for every size
    assert len(arbiter.get_backend_class("honest").compiled) == 1


def test_a_symbol_equal_to_a_static_size_is_held_at_the_second_shape(make_backend,
                                                                       fresh_dynamo):
    # A decode step at batch 2 whose graph also holds a tensor traced with batch 2 as a
    # constant (Qwen2's dynamic cache after a batch-1 generate()): moved to batch 3, eager
    # itself indexes past it, so every second shape failed and the partition compiled once
    # per decode length. The batch is now kept, the length moved, and the artifact held
    # to that batch per call.
    make_backend("honest", ["aten.sum.dim_IntList", "aten.add.Tensor", "aten.index.Tensor",
                            "aten.arange.default"], dynamic=True)
    be = arbiter.Arbiter({"backends": ["honest"], "min_block_size": 1,
                          "shapes": {"max_specializations": 0}})

    def f(x, table):
        rows = torch.arange(x.shape[0])
        return x.sum(1, keepdim=True) + table[rows]

    table = torch.randn(2, 4)
    compiled = torch.compile(f, backend=be, dynamic=False)
    for t in (5, 6, 9):
        x = torch.randn(2, t)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(x, 1)
        torch.testing.assert_close(compiled(x, table), f(x, table))
    with pytest.raises(IndexError):  # the user's model refuses batch 3, as in eager
        compiled(torch.randn(3, 5), table)
    part = next(p for g in be.report().graphs for p in g.partitions if p.backend == "honest")
    assert part.shapes == "symbolic" and part.fallbacks == [], part
    assert len(arbiter.get_backend_class("honest").compiled) == 1


def test_symbolic_outputs_keep_eagers_layout(make_backend, fresh_dynamo):
    # a backend returning contiguous results where eager returns a transpose: the output
    # is copied into eager's layout (later views were traced against it)
    make_backend("dense", ["aten.relu.default", "aten.t.default", "aten.mul.Tensor",
                           "aten.transpose.int"],
                 compile=lambda self, gm, a: (lambda *x: [o.contiguous() for o in gm(*x)]),
                 dynamic=True)
    be = arbiter.Arbiter({"backends": ["dense"], "min_block_size": 1})

    def f(x):
        return torch.relu(x).t() * 2

    compiled = torch.compile(f, backend=be, dynamic=True)
    for n in (4, 7):
        x = torch.randn(n, 3)
        got, want = compiled(x), f(x)
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()
    (part,) = be.report().graphs[0].partitions
    assert part.backend == "dense" and part.restride_copies >= 2


def test_no_second_shape_means_no_symbolic_artifact():
    x = torch.randn(4, 3)
    gm = _symbolic_trace(lambda a: (a * 2,), x)
    values = shapes.input_values(gm)
    from torch.utils._sympy.value_ranges import ValueRanges

    env = shapes.shape_env_of(values)
    for s in values[0].shape:  # as if mark_dynamic(min=max=its size)
        env.var_to_range[shapes.expr(s)] = ValueRanges(int(s.node.hint), int(s.node.hint))

    class Never(arbiter.Backend):
        name = "never"

        def compile(self, gm, example_inputs):
            raise AssertionError("compiled although nothing could check it")

    with pytest.raises(ShapeError, match="second shape"):
        Symbolic(Never()).compile(gm, [x])


# -- the per-shape cache ---------------------------------------------------------------
def test_per_shape_compiles_up_to_the_limit_then_next_backend(make_backend, fresh_dynamo):
    make_backend("static", ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"])
    be = arbiter.Arbiter({"backends": ["static"], "min_block_size": 1,
                          "shapes": {"max_specializations": 2}})

    def f(x):
        return torch.relu(x) * 2 + x

    compiled = torch.compile(f, backend=be, dynamic=True)
    for n in (4, 7, 4, 9, 11):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x), f(x))
    got = arbiter.get_backend_class("static").compiled
    assert len(got) == 2  # sizes 4 and 7, static graphs
    assert not any(shapes.graph_is_symbolic(g) for g in got)
    (part,) = be.report().graphs[0].partitions
    assert part.backend == "eager" and part.specializations == 2
    (fb,) = part.fallbacks
    assert fb.stage == "run" and "max_specializations: 2" in fb.reason
    assert shapes.about_shapes(fb.reason)


def test_specialize_folds_sizes_and_int_inputs():
    x = torch.randn(3, 4)
    gm = _symbolic_trace(lambda a: (a.reshape(-1) * a.shape[0],), x)
    static, keep = specialize(gm, [x])
    assert keep == [0] and not shapes.graph_is_symbolic(static)
    assert not any(n.target is torch.ops.aten.sym_size.int for n in static.graph.nodes)
    torch.testing.assert_close(static(x)[0], x.reshape(-1) * 3)


# -- backends, one partition each -------------------------------------------------------
@pytest.mark.parametrize("backend", ["onnxruntime", "openvino", "inductor"])
def test_backend_compiles_a_symbolic_partition_once(backend):
    pytest.importorskip({"onnxruntime": "onnxruntime", "openvino": "openvino",
                         "inductor": "torch"}[backend])
    cls = arbiter.get_backend_class(backend)
    ok, why = cls().available()
    if not ok:
        pytest.skip(why)

    def f(x, m):
        b, t, d = x.shape
        y = torch.nn.functional.gelu(x.reshape(b * t, d) @ torch.ones(d, 8))
        return (y.reshape(b, t, 8) * m[:, :, None],)

    x, m = torch.randn(2, 5, 4), torch.randn(2, 5)
    gm = _symbolic_trace(f, x, m)
    fn = Symbolic(cls()).compile(gm, [x, m])  # checks a second shape itself
    for b, t in ((2, 5), (3, 7), (6, 2)):
        x, m = torch.randn(b, t, 4), torch.randn(b, t)
        torch.testing.assert_close(fn(x, m)[0], f(x, m)[0], **TOL)


def test_openvino_dims_keep_mark_dynamic_bounds(fresh_dynamo):
    pytest.importorskip("openvino")
    model, _ = examples.mlp()
    be = arbiter.Arbiter({"backends": ["openvino"], "min_block_size": 1})
    compiled = torch.compile(model, backend=be)
    x = torch.randn(6, 32)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **TOL)
        y = torch.randn(11, 32)
        torch.testing.assert_close(compiled(y), model(y), **TOL)
    rep = be.report()
    (g,) = rep.graphs
    (sym,) = g.symbols
    assert (sym.min, sym.max) == (2, 16) and sym.sources == ["x.size(0)"]
    piece = next(p for p in be._pieces)
    runner = piece._fn.fn  # Checked -> OvRunner
    shape = str(runner.compiled.inputs[0].get_partial_shape())
    assert shape.startswith("[2..16,"), shape


# -- report -----------------------------------------------------------------------------
def test_report_shows_symbols_recompiles_and_per_partition_shapes(fresh_dynamo):
    model, _ = examples.mlp()
    be = arbiter.Arbiter("default")
    compiled = torch.compile(model, backend=be)
    with torch.no_grad():
        for n in (8, 5, 3):
            x = torch.randn(n, 32)
            torch.testing.assert_close(compiled(x), model(x), **TOL)
    rep = be.report()
    first, second = rep.graphs
    assert first.recompile == 0 and not first.symbols
    assert second.recompile == 1 and second.frame == first.frame
    (sym,) = second.symbols
    assert sym.min == 2 and sym.max is None and sym.sources == ["x.size(0)"]
    assert {p.shapes for p in second.partitions if not p.inline} <= {"symbolic", "per shape"}
    assert "recompiles: 1" in rep.summary()
    assert "symbolic: " in str(rep)
    assert second.shape_eager_share == 0.0 and not second.warnings


def test_report_warns_when_shapes_send_compute_to_eager(make_backend, fresh_dynamo):
    make_backend("static", ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"])
    be = arbiter.Arbiter({"backends": ["static"], "min_block_size": 1,
                          "shapes": {"max_specializations": 0}})

    def f(x):
        return torch.relu(x) * 2 + x

    compiled = torch.compile(f, backend=be, dynamic=True)
    x = torch.randn(5, 3)
    torch.testing.assert_close(compiled(x), f(x))
    (g,) = be.report().graphs
    assert g.shape_eager_share == 1.0
    assert g.warnings and "because of symbolic shapes" in g.warnings[0]


def test_training_with_symbolic_batch(fresh_dynamo):
    model, _ = examples.mlp()
    ref = copy.deepcopy(model)
    be = arbiter.Arbiter({"backends": ["onnxruntime", "inductor"], "min_block_size": 1})
    compiled = torch.compile(model, backend=be, dynamic=True)
    for batch in (8, 5):
        x = torch.randn(batch, 32, requires_grad=True)
        xr = x.detach().clone().requires_grad_()
        out = compiled(x)
        out.square().sum().backward()
        want = ref(xr)
        want.square().sum().backward()
        torch.testing.assert_close(out, want, **TOL)
        torch.testing.assert_close(x.grad, xr.grad, **TOL)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL)
    kinds = [g.kind for g in be.report().graphs]
    assert kinds.count("forward") == 1 and kinds.count("backward") == 1


# -- arbiter probe --dynamic -------------------------------------------------------------
def test_dynamic_probe_credits_ops_that_pass_two_sizes(make_backend):
    from arbiter.probe.opinfo import probe

    cls = make_backend("honest", ["aten.add.Tensor", "aten.mul.Tensor"])
    result = probe(cls(), ops=["add", "mul"], dtypes=["float32"], dynamic=True)
    assert {"aten.add.Tensor", "aten.mul.Tensor"} <= result.dynamic_passed
    assert not result.dynamic_refused()
    # the backend got symbolic graphs, compiled once each
    assert all(shapes.graph_is_symbolic(g) for g in cls.compiled)


def test_dynamic_probe_keeps_static_an_op_wrong_at_a_second_size(make_backend):
    from arbiter.probe.opinfo import probe
    from arbiter.probe.update import dynamic_update

    cls = make_backend("liar", ["aten.add.Tensor"], compile=_first_call_only)
    result = probe(cls(), ops=["add"], dtypes=["float32"], dynamic=True)
    assert "aten.add.Tensor" not in result.dynamic_passed
    refused = result.dynamic_refused()
    assert "differs from eager" in refused["aten.add.Tensor"] or \
        "fails at a second shape" in refused["aten.add.Tensor"]
    doc = {"backend": "liar", "format": 1,
           "ops": {"aten.add.Tensor": {"dynamic": True}, "aten.mul.Tensor": {}}}
    new = dynamic_update(doc, result)
    assert new["ops"]["aten.add.Tensor"]["dynamic"] is False  # a stale `true` is undone
    assert new["ops"]["aten.mul.Tensor"] == {}
    assert "aten.add.Tensor" in new["probe"]["dynamic_failed"]


def test_dynamic_update_marks_overloads_and_records_the_run(make_backend):
    from arbiter.probe.opinfo import probe
    from arbiter.probe.update import dynamic_update

    cls = make_backend("honest", ["aten.add.Tensor"])
    result = probe(cls(), ops=["add"], dtypes=["float32"], dynamic=True)
    doc = {"backend": "honest", "format": 1, "ops": {"aten.add": {"note": "every overload"}}}
    new = dynamic_update(doc, result)
    # the packet's entry speaks for every overload: the probed one gets its own
    assert new["ops"]["aten.add.Tensor"] == {"note": "every overload", "dynamic": True}
    assert new["ops"]["aten.add"] == {"note": "every overload"}
    assert new["probe"]["dynamic_samples_passed"] >= 1
    again = dynamic_update(new, result)  # idempotent entries
    assert again["ops"] == new["ops"]


def test_dynamic_probe_reaches_overloads_no_opinfo_traces_to(make_backend):
    from arbiter.probe.opinfo import probe

    cls = make_backend("honest", ["aten.pow.Tensor_Scalar", "aten._unsafe_view.default",
                                  "aten.clone.default"])
    result = probe(cls(), ops=["aten.pow.Tensor_Scalar", "aten._unsafe_view"],
                   dtypes=["float32"], dynamic=True)
    assert {"aten.pow.Tensor_Scalar", "aten._unsafe_view.default"} <= result.dynamic_passed


def test_dynamic_probe_cli_writes_the_flag(tmp_path, capsys):
    from arbiter.cli import main
    from arbiter.manifest import load_manifest

    out = tmp_path / "ort.yaml"
    assert main(["probe", "onnxruntime", "--dynamic", "--ops", "aten.mul", "--write",
                 "--out", str(out)]) == 0
    assert "(dynamic shapes)" in capsys.readouterr().out
    manifest = load_manifest(out, backend="onnxruntime")
    assert manifest.entry("aten.mul.Tensor").dynamic is True
    assert manifest.probe.dynamic_samples_passed >= 1


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino", "inductor"])
def test_backend_takes_int_inputs_of_a_symbolic_partition(backend):
    """A partition whose symbols no tensor input carries bare gets them as ints."""
    pytest.importorskip({"onnxruntime": "onnxruntime", "openvino": "openvino",
                         "inductor": "torch"}[backend])
    cls = arbiter.get_backend_class(backend)
    calls = [(torch.randn(2, 3, 4), torch.randn(2, 3)), (torch.randn(3, 5, 4), torch.randn(3, 5))]
    gm, _ = _aot_graph(_fold, *calls)
    relu = next(n for n in gm.graph.nodes if n.name.startswith("relu"))
    names, after = [], False
    for n in gm.graph.nodes:
        after = after or n is relu
        if after and n.op == "call_function":
            names.append(n.name)
            if n.meta["val"].dim() == 3:
                break
    sub = _cut(gm, names)
    inner = shapes.input_values(sub.gm)
    assert sum(isinstance(v, torch.SymInt) for v in inner) == 2

    def args_for(b, t):  # the two ints in either order: they only reshape (b*t, 4)
        ints = iter([b, t])
        return [torch.randn(b * t, 4) if isinstance(v, torch.Tensor) else next(ints)
                for v in inner]

    fn = Symbolic(cls()).compile(sub.gm, args_for(2, 3))  # checks a second shape itself
    for b, t in ((2, 3), (4, 5), (3, 7)):
        a = args_for(b, t)
        torch.testing.assert_close(fn(*a)[0], sub.gm(*a)[0], **TOL)


def test_input_ranges_for_optimization_profiles(fresh_dynamo):
    seen = {}

    def capture(gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

        def compiler(fx_g, _):
            seen["values"] = shapes.input_values(fx_g)
            return make_boxed_func(fx_g)
        return aot_module_simplified(gm, example_inputs, fw_compiler=compiler,
                                     inference_compiler=compiler)

    f = torch.compile(lambda x: x * 2, backend=capture)
    x = torch.randn(6, 3)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=64)
    with torch.no_grad():
        f(x)
    values = seen["values"]
    args = [6 if isinstance(v, torch.SymInt) else x for v in values]
    ranges = [r for r in shapes.input_ranges(values, args) if r is not None]
    assert ranges == [[(2, 6, 64), (3, 3, 3)]]


def _tiny_bert():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                  intermediate_size=64, vocab_size=100)
    torch.manual_seed(0)
    return examples._HFOutput(transformers.BertModel(cfg), "input_ids",
                              "last_hidden_state").eval()


@pytest.mark.parametrize("dynamic", [False, True])
def test_openvino_takes_bert_attention(dynamic, fresh_dynamo):
    # OpenVINO's frontend re-decomposes the exported program, where SDPA's output has
    # other strides than traced: BERT's `view` of it failed there ("Cannot view a tensor
    # with shape [4, 32, 256] and strides (256, 1024, 1)") and the partition fell back
    pytest.importorskip("openvino")
    model = _tiny_bert()
    be = arbiter.Arbiter({"backends": ["openvino"], "min_block_size": 1})
    compiled = torch.compile(model, backend=be, dynamic=dynamic)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for b, s in ((2, 8), (3, 12)):
            x = torch.randint(0, 100, (b, s), generator=g)
            torch.testing.assert_close(compiled(x), model(x), **TOL)
    parts = [p for g in be.report().graphs for p in g.partitions if not p.inline]
    assert parts and all(p.backend == "openvino" and not p.fallbacks for p in parts), \
        str(be.report())


def test_data_dependent_sizes_cross_partitions(fresh_dynamo):
    """nonzero's size (an unbacked symbol, `aten.sym_size` in the graph) runs in place and
    reaches the next partition as a tensor dimension; runtime asserts on sizes run in place."""
    def f(x):
        idx = torch.nonzero(x[:, 0] > 0).squeeze(1)
        y = x.index_select(0, idx)
        return torch.relu(y * 2 + 1).sum(1) + idx.shape[0]

    be = arbiter.Arbiter({"backends": ["onnxruntime", "inductor"], "min_block_size": 1})
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled = torch.compile(f, backend=be)
        g = torch.Generator().manual_seed(0)
        for n in (6, 9, 5, 7):
            x = torch.randn(n, 4, generator=g)
            if n == 7:
                x[:, 0] = -1.0  # no row selected: a size of 0
            torch.testing.assert_close(compiled(x), f(x), **TOL)
    rep = be.report()
    for gr in rep.graphs:
        assert not any("_assert_scalar" in op for p in gr.partitions if not p.inline
                       for op in p.ops), str(rep)
    data = [p for gr in rep.graphs for p in gr.partitions
            if "aten.index_select.default" in p.ops]
    assert data and all(p.backend == "onnxruntime" and p.shapes == "symbolic" for p in data), \
        str(rep)


def test_openvino_gets_fused_attention_and_reshapes():
    pytest.importorskip("openvino")
    from arbiter.backends._openvino_convert import _for_openvino

    def f(q, k, v):
        h = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return (h.transpose(1, 2).contiguous().view(2, 5, 16),)

    args = [torch.randn(2, 4, 5, 4) for _ in range(3)]
    gm = make_fx(f, tracing_mode="fake")(*args)
    ops = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default in ops
    new = _for_openvino(gm)
    new_ops = {n.target for n in new.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.scaled_dot_product_attention.default in new_ops
    assert torch.ops.aten.view.default not in new_ops
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default in ops  # a copy
    torch.testing.assert_close(new(*args)[0], f(*args)[0], **TOL)


def test_a_dtype_probe_keeps_the_dynamic_record(make_backend):
    from arbiter.probe.opinfo import probe
    from arbiter.probe.update import dynamic_update, manifest_update

    cls = make_backend("honest", ["aten.add.Tensor"])
    doc = {"backend": "honest", "format": 1, "ops": {"aten.add.Tensor": {}}}
    dyn = dynamic_update(doc, probe(cls(), ops=["add"], dtypes=["float32"], dynamic=True))
    after = manifest_update(dyn, probe(cls(), ops=["add"], dtypes=["float32"]))
    assert after["ops"]["aten.add.Tensor"]["dynamic"] is True
    assert after["probe"]["dynamic_samples_passed"] == dyn["probe"]["dynamic_samples_passed"]


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_a_query_that_sees_no_key_gets_eagers_zeros_in_a_symbolic_graph(backend,
                                                                        fresh_dynamo):
    # A batch row that is all padding: its queries see no key. The first call (checked)
    # had no such row; ONNX Runtime's export of the whole CPU flash attention (a symbolic
    # partition gets no traced decompositions) then returned NaN, silently, on the calls
    # that had one (arbiter/decompose/masked_rows.py).
    pytest.importorskip(backend)

    class Attend(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(16, 16)

        def forward(self, x, mask):
            return torch.nn.functional.scaled_dot_product_attention(self.proj(x), x, x,
                                                                    attn_mask=mask)

    torch.manual_seed(0)
    model = Attend().eval()
    compiled = torch.compile(model, backend=arbiter.Arbiter(
        {"backends": [backend], "against_eager": "off"}), dynamic=True)
    with torch.no_grad():
        for batch, length in ((2, 5), (3, 7), (4, 9)):
            x = torch.randn(batch, 2, length, 16)
            for padded in (False, True):
                mask = torch.ones(batch, 1, length, length, dtype=torch.bool)
                mask[0, ..., length - 2:] = False
                if padded:
                    mask[1] = False  # the second sequence is all padding
                torch.testing.assert_close(compiled(x, mask), model(x, mask), **TOL)


def test_the_masked_rows_guard_keeps_eagers_output_and_logsumexp():
    # a training forward reads the kernel's logsumexp too (its backward does): 0 where a
    # row has no key, as the CPU kernel's; the output's rows 0 as well
    from arbiter.decompose.masked_rows import FLASH, guard_masked_rows

    def attend(q, k, v, mask):
        out, lse = FLASH(q, k, v, attn_mask=mask)
        return out, lse

    q, k, v = (torch.randn(2, 2, 4, 8) for _ in range(3))
    mask = torch.zeros(2, 1, 4, 4)
    mask[1] = float("-inf")  # the second sequence sees no key at all
    gm = make_fx(attend, tracing_mode="fake")(q, k, v, mask)
    want = gm(q, k, v, mask)
    assert guard_masked_rows(gm.graph, gm)
    gm.graph.lint()
    gm.recompile()
    got = gm(q, k, v, mask)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    assert torch.equal(want[0][1], torch.zeros_like(want[0][1]))
    clamped = next(n for n in gm.graph.nodes if n.target is FLASH).kwargs["attn_mask"]
    assert clamped.target is torch.ops.aten.clamp.default  # the kernel sees no -inf row


def test_a_symbolic_artifact_refused_says_the_backend_compiles_per_shape(make_backend,
                                                                         fresh_dynamo,
                                                                         caplog):
    # Before: "liar failed to compile (...); falling back to liar", which read as a
    # backend failing over to itself; the next entry is the same backend per shape.
    make_backend("liar2", ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor"],
                 compile=_first_call_only, dynamic=True)
    be = arbiter.Arbiter({"backends": ["liar2"], "min_block_size": 1})
    compiled = torch.compile(lambda x: torch.relu(x) * 2 + x, backend=be, dynamic=True)
    with caplog.at_level("WARNING", logger="arbiter.run.piece"):
        for n in (4, 7):
            compiled(torch.randn(n, 3))
    said = [r.getMessage() for r in caplog.records if "failed to compile" in r.getMessage()]
    assert said and all(m.endswith("liar2 compiles it per shape instead") for m in said), said
