"""First calls' measured times fed back into this machine's predictions
(arbiter/measure/feedback.py): a backend whose single-backend candidates measure N times
their prediction has its later predictions multiplied by about N, kept in the cache,
reset by a new calibration, and never applied to a pinned calibration file.

Measuring is on eager alone (the calibration's small cells: seconds)."""
from __future__ import annotations

import math

import pytest
import torch

import arbiter
from arbiter.measure import calibration as calmod
from arbiter.measure import feedback
from arbiter.plan.policy import ONLY, candidates
from arbiter.plan.predict import predict

from conftest import trace
from test_calibrated import EAGER, _args, mlp, unpinned  # noqa: F401 - a fixture


def test_the_correction_is_the_geometric_mean_within_limits():
    assert feedback.correction([3.0]) == 1.0  # one timing is not enough
    assert math.isclose(feedback.correction([2.0, 8.0]), 4.0)
    assert feedback.correction([1000.0, 1000.0]) == feedback.LIMIT
    assert feedback.correction([1e-4] * 3) == 1 / feedback.LIMIT


def _only_eager(be, gm):
    (cand,) = [c for c in candidates(be.planner, gm) if ONLY + "eager" in c.labels]
    return cand


def _measured(be, tmp_path):
    cal = calmod.Calibrations(be.planner, be.cache, budget_s=None, progress=False)
    be.planner.calibration, be.planner.observe = cal.get, cal.observe
    return cal


def test_measured_candidates_correct_later_predictions_and_persist(tmp_path, unpinned):
    be = arbiter.Arbiter({**EAGER, "cache": {"dir": str(tmp_path / "c")}})
    cal = _measured(be, tmp_path)
    gm = trace(mlp, *_args())
    cand = _only_eager(be, gm)
    raw = predict(cand.plan, be.planner.inline, cal.get()).ms
    assert cal.get()["eager"].observed == 1.0 and raw > 0
    for ratio in (2.0, 4.5):  # two first calls measured it 2x and 4.5x the prediction
        cand.measured_ms = raw * ratio
        cal.observe([cand], ONLY)
    got = cal.get()["eager"]
    assert got.observed_n == 2 and math.isclose(got.observed, 3.0, rel_tol=1e-6)
    assert math.isclose(predict(cand.plan, be.planner.inline, cal.get()).ms, 3 * raw,
                        rel_tol=1e-6)
    assert "predictions x3.00 from 2 timings" in calmod.backend_row(got)
    # the prediction a later timing is compared with is the uncorrected one: the
    # correction converges instead of compounding
    cand.measured_ms = raw * 3.0
    cal.observe([cand], ONLY)
    assert math.isclose(cal.get()["eager"].observed, 3.0, rel_tol=1e-6)

    calmod.forget()  # a new process: the cache has them
    again = calmod.Calibrations(be.planner, be.cache, progress=False)
    assert again.get()["eager"].observed_n == 3

    calmod.forget()  # a new calibration starts afresh
    fresh = calmod.Calibrations(be.planner, be.cache, budget_s=None, progress=False,
                                again=True)
    assert fresh.get()["eager"].observed_n == 0


def test_a_pinned_calibration_is_used_as_it_is(tmp_path, unpinned):
    be = arbiter.Arbiter({**EAGER, "cache": {"dir": str(tmp_path / "c")}})
    cal = _measured(be, tmp_path)
    path = tmp_path / "calib.json"
    calmod.write_file(str(path), cal.measured(), be.backends)
    pinned = calmod.Calibrations(be.planner, be.cache, file=str(path))
    gm = trace(mlp, *_args())
    cand = _only_eager(be, gm)
    cand.measured_ms = 10 * predict(cand.plan, be.planner.inline, pinned.get()).ms
    for _ in range(3):
        pinned.observe([cand], ONLY)
    assert pinned.get()["eager"].observed == 1.0
    assert pinned.get()["eager"].observed_n == 0


def test_a_first_call_that_times_candidates_feeds_them_back(tmp_path, unpinned,
                                                           fresh_dynamo, make_backend):
    """Policy measure times every candidate on the first call (here the whole graph on
    a compiling backend, and in eager); each reaches the calibration's record."""
    make_backend("fast", ["aten.mm.default", "aten.relu.default", "aten.add.Tensor",
                          "aten.mul.Tensor", "aten.addmm.default", "aten.t.default",
                          # the calibration's elementwise cell
                          "aten.gelu.default", "aten.tanh.default", "aten.sub.Tensor"])
    config = {"backends": ["fast"], "policy": "measure", "min_block_size": 1,
              "cache": {"dir": str(tmp_path / "c")}}
    be = arbiter.Arbiter(config)
    assert set(be.calibrations.get()) == {"fast", "eager"}  # measured ahead: small cells
    compiled = torch.compile(mlp, backend=be)
    with torch.no_grad():
        compiled(*_args())
    calmod.forget()
    later = calmod.Calibrations(be.planner, be.cache, measure=False).get()
    assert later["fast"].observed_n == 1 and later["eager"].observed_n == 1
