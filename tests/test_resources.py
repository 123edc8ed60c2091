"""arbiter/run/resources.py and the backends' configure_resources: one thread budget, one
arena, outputs written in place, the settings in force in the report.

Thread pools and arenas are process-wide and cannot be undone, so every check of them
runs in a fresh subprocess (``run_py``); the sessions there are built from small ONNX
models written with onnx.helper (no export, so each subprocess takes seconds).
"""
from __future__ import annotations

import functools
import json
import subprocess
import sys
import textwrap

import pytest
import torch

import arbiter
from arbiter.run import resources

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
onnx = pytest.importorskip("onnx", reason="onnx is not installed")

# A model whose intermediate (t, 4 MiB) lives in the session's arena after a run.
MODEL = textwrap.dedent("""
    import numpy as np, onnx, onnx.helper as h
    def model_bytes(n=1024):
        x = h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [n, n])
        y = h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [n, n])
        g = h.make_graph([h.make_node("MatMul", ["x", "x"], ["t"]),
                          h.make_node("Relu", ["t"], ["u"]),
                          h.make_node("Neg", ["u"], ["y"])], "g", [x], [y])
        return h.make_model(g, opset_imports=[h.make_opsetid("", 17)],
                            ir_version=9).SerializeToString()
    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1])
""")


def run_py(body: str) -> dict:
    """Run ``body`` in a fresh interpreter (with MODEL's helpers); it prints one JSON."""
    code = MODEL + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


SESSIONS = """
    import json, numpy as np, onnxruntime, torch, arbiter
    torch_before = torch.get_num_threads()
    before = status("Threads")  # the pools are made when the budget is applied
    be = arbiter.Arbiter({{"backends": ["onnxruntime"], "resources": {resources}}})
    be.apply_resources()  # done at the first graph otherwise
    ort_backend = be.backends["onnxruntime"]
    x = np.random.rand(1024, 1024).astype(np.float32)
    rss0 = status("VmRSS")
    sessions = [ort_backend.make_session(model_bytes()) for _ in range({n})]
    for s in sessions:
        s.run(None, {{"x": x}})
    so = sessions[0].get_session_options()
    def entry(key):
        try:
            return so.get_session_config_entry(key)
        except Exception:  # not set
            return ""
    env_allocators = entry("session.use_env_allocators")
    print(json.dumps({{"torch_threads": torch.get_num_threads(),
                      "torch_before": torch_before,
                      "env_allocators": env_allocators,
                      "spinning": so.get_session_config_entry(
                          "session.intra_op.allow_spinning"),
                      "spinning_stop": entry("session.force_spinning_stop"),
                      "per_session_threads": so.use_per_session_threads,
                      "added_threads": status("Threads") - before,
                      "rss_growth_mb": (status("VmRSS") - rss0) / 1024,
                      "report": be.report(advice=False).resources}}))
"""


@functools.cache
def sessions(resources: str, n: int) -> dict:
    """n ORT sessions made and run under ``resources``, in a subprocess (cached)."""
    return run_py(SESSIONS.format(resources=resources, n=n))


def test_budget_sizes_one_ort_pool_without_workers_and_leaves_torch_threads_alone():
    got = sessions("{'threads': 1}", 10)
    assert got["torch_threads"] == got["torch_before"]  # the user's, not the budget's
    assert got["report"]["torch"]["intra_op_threads"] == got["torch_before"]
    # a pool of 1 thread per session has no workers, however many sessions there are
    assert got["added_threads"] == 0, got
    res = got["report"]
    assert res["budget"]["threads"] == 1 and res["budget"]["spin"] == "onnxruntime"
    assert res["onnxruntime"]["pool"].startswith("per session, 1 thread(s)")
    assert got["per_session_threads"] is True and got["spinning"] == "0"  # no worker
    assert res["onnxruntime"]["arena"].startswith("one, shared")


def test_without_the_spin_ort_sessions_get_the_budget_with_spinning_off():
    got = sessions("{'threads': 2, 'spin': 'none'}", 3)
    assert got["report"]["onnxruntime"]["pool"].startswith("per session, 2 thread(s)")
    assert got["per_session_threads"] is True and got["spinning"] == "0"
    assert got["spinning_stop"] == "", got  # nothing to stop
    assert got["added_threads"] == 3, got  # one worker per session, sleeping when idle


def test_spin_auto_goes_to_the_first_backend():
    from arbiter.config import ResourcesOptions
    from arbiter.run.resources import resolve

    assert resolve(ResourcesOptions(), "onnxruntime").spin == "onnxruntime"
    assert resolve(ResourcesOptions(spin="none"), "onnxruntime").spin == "none"
    got = sessions("{'threads': 2}", 3)  # auto, ONNX Runtime first: its pool gets 2 threads
    assert got["report"]["budget"]["spin"] == "onnxruntime"
    assert got["spinning"] == "1" and got["per_session_threads"] is True
    # the workers stop spinning when a run returns: left spinning, they held the cores
    # 20-50 ms after it (docs/resources.md)
    assert got["spinning_stop"] == "1", got


def test_spin_auto_follows_the_plan_not_the_config_order():
    """`spin: auto` in inference: the backend holding most of a graph's plan gets the spin
    (cpu_all lists OpenVINO first; policy `calibrated` may run a model on ONNX Runtime,
    whose sessions then spin, as they do under the default config)."""
    got = run_py("""
        import json, torch, arbiter
        cfg = {"backends": ["eager", "onnxruntime"], "fallback": ["eager"],
               "policy": "priority", "pin": {"aten.addmm.default": "onnxruntime",
                                              "aten.relu.default": "onnxruntime"},
               "against_eager": "off", "min_block_size": 1, "resources": {"threads": 2}}
        be = arbiter.Arbiter(cfg)
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
        with torch.no_grad():
            torch.compile(m, backend=be)(torch.randn(2, 8))
        ort = be.backends["onnxruntime"]
        parts = [p.backend for g in be.report(advice=False).graphs for p in g.partitions]
        print(json.dumps({"spin": ort.budget.spin, "spins": ort._spins(), "parts": parts,
                          "report": be.report(advice=False).resources["budget"]["spin"]}))
    """)
    assert "onnxruntime" in got["parts"], got  # (and a view left to eager)
    assert got["spin"] == "onnxruntime" and got["spins"] is True, got
    assert got["report"] == "onnxruntime"  # the report says this config's spin


def test_spin_owner_s_sessions_spin_in_their_own_pools_and_uncoordinated_ones_too():
    spin = sessions("{'threads': 2, 'spin': 'onnxruntime'}", 6)
    assert spin["spinning"] == "1" and spin["per_session_threads"] is True
    # a pool per session (ONNX Runtime's global pool would break other code's sessions):
    # one worker each
    assert spin["added_threads"] == 6, spin
    alone = sessions("{'coordinate': False}", 6)
    assert alone["report"]["onnxruntime"]["coordinated"] is False
    assert alone["added_threads"] >= 6, alone  # ORT's default: a pool per session


def test_shared_arena_is_used_and_keeps_memory_flat():
    shared = sessions("{'threads': 1}", 10)
    separate = sessions("{'threads': 1, 'shared_arena': False}", 10)
    assert shared["env_allocators"] == "1" and shared["per_session_threads"] is True
    assert separate["env_allocators"] == ""
    assert separate["report"]["onnxruntime"]["arena"] == "per session"
    # each session's own arena keeps its 4 MiB intermediates; the shared one is reused
    assert shared["rss_growth_mb"] < 0.5 * separate["rss_growth_mb"], (shared, separate)


def test_budget_is_applied_once_and_a_different_second_config_warns():
    got = run_py("""
        import json, warnings, torch, arbiter
        torch_before = torch.get_num_threads()
        arbiter.Arbiter({"backends": ["onnxruntime"], "resources": {"threads": 1}}).apply_resources()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            arbiter.Arbiter({"backends": ["onnxruntime"], "resources": {"threads": 1}}).apply_resources()
            same = len(w)
            arbiter.Arbiter({"backends": ["onnxruntime"], "resources": {"threads": 2}}).apply_resources()
        print(json.dumps({"same": same, "msgs": [str(x.message) for x in w],
                          "torch_threads": torch.get_num_threads(),
                          "torch_before": torch_before}))
    """)
    assert got["same"] == 0
    assert len(got["msgs"]) == 1
    assert "threads=2 (in force: 1)" in got["msgs"][0]
    assert "stay" in got["msgs"][0]
    assert got["torch_threads"] == got["torch_before"]


def test_the_user_s_torch_thread_count_is_kept_and_compiling_under_it_works():
    """torch's thread count is the process's: set to 1 before torch.compile, the budget
    follows it and nothing changes it. Before, the budget (made at the first graph,
    inside Dynamo's trace) set it to every usable CPU, and Dynamo failed the call
    ("Global num_threads state changed while dynamo tracing"); on a machine whose torch
    default (physical cores) is below its logical CPUs that was every first call. A
    config's own number that differs is said once, and torch's count still kept."""
    got = run_py("""
        import json, warnings, torch, arbiter
        torch.set_num_threads(1)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        x = torch.randn(4, 8)
        be = arbiter.Arbiter({"backends": ["onnxruntime"], "against_eager": "off"})
        with torch.no_grad():
            out = torch.compile(m, backend=be)(x)
        rep = be.report(advice=False).resources
        print(json.dumps({"ok": bool(torch.allclose(out, m(x), atol=1e-6)),
                          "threads": torch.get_num_threads(),
                          "budget": rep["budget"]["threads"],
                          "ort": rep["onnxruntime"]["pool"]}))
    """)
    assert got["ok"] and got["threads"] == 1, got
    assert got["budget"] == 1 and got["ort"].startswith("per session, 1 thread(s)"), got
    if resources.cores() < 2:
        pytest.skip("one usable CPU: a config's thread number cannot differ from torch's")
    got = run_py("""
        import json, warnings, torch, arbiter
        torch.set_num_threads(1)
        m = torch.nn.Linear(8, 4)
        be = arbiter.Arbiter({"backends": ["onnxruntime"], "against_eager": "off",
                              "resources": {"threads": 2}})
        with warnings.catch_warnings(record=True) as w, torch.no_grad():
            warnings.simplefilter("always")
            torch.compile(m, backend=be)(torch.randn(4, 8))
        print(json.dumps({"threads": torch.get_num_threads(),
                          "msgs": [str(x.message) for x in w]}))
    """)
    assert got["threads"] == 1, got
    said = [m for m in got["msgs"] if "torch.set_num_threads(2)" in m]
    assert len(said) == 1 and "resources.threads: 2" in said[0], got["msgs"]


def test_the_user_s_own_sessions_still_work_after_arbiter_compiled():
    """A good guest: after arbiter compiled (and ran) an inference model, a plain
    onnxruntime.InferenceSession of the user's (or another library's), with default
    options and with its own intra_op_num_threads, is made and runs in the same process;
    arbiter's own sessions keep the budget (their pool size) and its spin. A second
    config with another `spin` warns about nothing."""
    got = run_py("""
        import json, warnings, numpy as np, onnxruntime as ort, torch, arbiter
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        x = torch.randn(4, 8)
        with torch.no_grad():
            be = arbiter.Arbiter({"backends": ["onnxruntime"], "against_eager": "off",
                                  "resources": {"threads": 2}})
            ok = torch.allclose(torch.compile(m, backend=be)(x), m(x), atol=1e-6)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                other = arbiter.Arbiter({"backends": ["onnxruntime"],
                                         "resources": {"threads": 2, "spin": "none"}})
                other.apply_resources()
        mine = be.backends["onnxruntime"].make_session(model_bytes(64))
        opts = mine.get_session_options()
        a = np.random.rand(64, 64).astype(np.float32)
        plain = ort.InferenceSession(model_bytes(64), providers=["CPUExecutionProvider"])
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        sized = ort.InferenceSession(model_bytes(64), so, providers=["CPUExecutionProvider"])
        want = -np.maximum(a @ a, 0)
        outs = [s.run(None, {"x": a})[0] for s in (plain, sized, mine)]
        print(json.dumps({"ok": ok, "equal": [bool(np.allclose(o, want, atol=1e-4)) for o in outs],
                          "threads": opts.intra_op_num_threads,
                          "spinning": opts.get_session_config_entry("session.intra_op.allow_spinning"),
                          "other_spins": other.backends["onnxruntime"]._spins(),
                          "warnings": [str(x.message) for x in w]}))
    """)
    assert got["ok"] and got["equal"] == [True, True, True], got
    assert got["threads"] == 2 and got["spinning"] == "1", got  # the budget holds
    assert got["other_spins"] is False and not got["warnings"], got


def test_config_errors_name_the_key_and_what_is_valid():
    with pytest.raises(arbiter.ConfigError, match=r"resources.spin: .*onnxruntim.*did you "
                                                   r"mean 'onnxruntime'.*valid: auto, none"):
        arbiter.load_config({"backends": ["eager"], "resources": {"spin": "onnxruntim"}})
    with pytest.raises(arbiter.ConfigError, match=r"resources.threads"):
        arbiter.load_config({"backends": ["eager"], "resources": {"threads": 0}})


def test_auto_threads_is_torch_s_own_count_within_the_affinity_mask():
    opts = arbiter.load_config({"backends": ["eager"]}).resources
    assert resources.resolve(opts).threads == min(resources.cores(),
                                                  torch.get_num_threads())


def test_auto_threads_follow_torch_s_count_and_the_ranks_share(monkeypatch):
    """`auto` takes torch's thread count as the process set it, at most the usable CPUs,
    and under torch.distributed at most the cores divided among the host's ranks."""
    opts = arbiter.load_config({"backends": ["eager"]}).resources
    before = torch.get_num_threads()
    monkeypatch.setattr(resources, "cores", lambda: 8)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    try:
        torch.set_num_threads(1)
        assert resources.resolve(opts).threads == 1  # the process's own setting
        torch.set_num_threads(8)
        assert resources.resolve(opts).threads == 8
        monkeypatch.setattr(resources, "cores", lambda: 4)
        assert resources.resolve(opts).threads == 4  # no more than the usable CPUs
        monkeypatch.setattr(resources, "cores", lambda: 8)
        monkeypatch.setattr(resources, "_ranks", lambda: 2)
        assert resources.resolve(opts).threads == 8
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
        assert resources.resolve(opts).threads == 2  # 8 cores, 4 ranks on this host
        torch.set_num_threads(1)
        assert resources.resolve(opts).threads == 1
        # a number in the config is taken as it is (up to the usable CPUs)
        from arbiter.backend import usable_cpus

        explicit = opts.model_copy(update={"threads": 2})
        assert resources.resolve(explicit).threads == min(2, usable_cpus())
    finally:
        torch.set_num_threads(before)
        assert torch.get_num_threads() == before


# -- zero-copy handoff ----------------------------------------------------------------
def _ort_runner():
    import onnx.helper as h

    from arbiter.backends.onnxruntime import OnnxRuntime, OrtRunner

    x = h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 4])
    y = h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 4])
    g = h.make_graph([h.make_node("Relu", ["x"], ["t"]), h.make_node("Neg", ["t"], ["y"])],
                     "g", [x], [y])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9)
    sess = OnnxRuntime().make_session(model.SerializeToString())
    return OrtRunner(sess, ["x"], ["y"], (torch.empty(3, 4),), [torch.empty(3, 4)])


def test_outputs_are_written_into_the_buffers_torch_allocated(monkeypatch):
    runner = _ort_runner()
    allocated = []
    real_empty = torch.empty

    def spy_empty(*a, **k):
        t = real_empty(*a, **k)
        allocated.append((t, t.data_ptr()))
        return t

    monkeypatch.setattr(torch, "empty", spy_empty)
    x = torch.randn(3, 4)
    (out,) = runner(x)
    monkeypatch.undo()
    assert len(allocated) == 1
    buf, ptr = allocated[0]
    assert out is buf and out.data_ptr() == ptr  # ORT wrote into torch's own buffer
    torch.testing.assert_close(out, -torch.relu(x))


def test_non_contiguous_inputs_are_the_copies_counted():
    from arbiter.run.piece import PieceRecord

    runner = _ort_runner()
    rec = PieceRecord(0, "onnxruntime", ["onnxruntime", "eager"])
    runner.attach_record(rec)
    x = torch.randn(4, 3)
    runner(x.t().contiguous())
    assert rec.copies == 0
    (out,) = runner(x.t())  # a transposed view: bound as a contiguous copy
    assert rec.copies == 1
    torch.testing.assert_close(out, -torch.relu(x.t()))


def test_report_shows_the_settings_in_force_and_the_copies(fresh_dynamo):
    # verify off: a first-use check calls the backend a second time (a second copy)
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "min_block_size": 1,
                          "verify": {"mode": "off"}})

    def f(a):
        return torch.tanh(a) * 2 + 1

    x = torch.randn(6, 5)
    got = torch.compile(f, backend=be)(x.t())  # non-contiguous input
    torch.testing.assert_close(got, f(x.t()))
    rep = be.report(advice=False)
    assert rep.resources["budget"]["threads"] >= 1
    assert rep.resources["torch"]["intra_op_threads"] == torch.get_num_threads()
    assert "onnxruntime" in rep.resources
    parts = [p for g in rep.graphs for p in g.partitions if p.backend == "onnxruntime"]
    assert parts and not parts[0].fallbacks
    assert sum(p.copies for p in parts) == 1  # the transposed input, made contiguous


# -- the other backends' thread options ----------------------------------------------
def test_inductor_and_openvino_take_the_budget_threads(monkeypatch):
    budget = resources.Budget(threads=1)
    ind = arbiter.registry.get_backend_class("inductor")
    monkeypatch.setattr(ind, "_threads", None)
    got = ind().configure_resources(budget)
    assert got["openmp_threads"] == 1 and ind._threads == 1
    if "openvino" not in arbiter.backend_names() or not arbiter.registry.get_backend_class(
            "openvino")().available()[0]:
        pytest.skip("openvino is not installed")
    ov = arbiter.registry.get_backend_class("openvino")
    monkeypatch.setattr(ov, "_budget_threads", None)
    backend = ov()
    assert backend.configure_resources(budget)["INFERENCE_NUM_THREADS"] == 1
    assert backend.properties()["INFERENCE_NUM_THREADS"] == 1


@pytest.mark.parametrize("trains,spin", [(True, "none"), (False, "onnxruntime")])
def test_spin_auto_decides_at_the_first_graph_whether_it_trains(trains, spin):
    """`spin: auto` (the default config): the budget is applied at the process's first
    graph; a graph that trains leaves every backend's pool quiet (eager work runs between
    its calls), an inference graph gives the spin to the first backend."""
    got = run_py(f"""
        import json, torch, arbiter
        be = arbiter.Arbiter("default")
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        x = torch.randn(4, 8)
        if {trains}:
            torch.compile(m, backend=be)(x).sum().backward()
        else:
            with torch.no_grad():
                torch.compile(m, backend=be)(x)
        r = be.report(advice=False).resources
        spins = be.backends["onnxruntime"]._spins()
        print(json.dumps({{"spin": r["budget"]["spin"], "spins": spins}}))
    """)
    assert got["spin"] == spin, got
    assert got["spins"] is (spin == "onnxruntime"), got
