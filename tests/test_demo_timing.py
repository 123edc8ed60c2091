"""`arbiter demo`'s speed line (issue 30): timed as the benches time (interleaved rounds,
each side's median and spread, the machine's load), and on a machine too busy to time, a
plain sentence instead of a ratio. Before: one timing per side, no spread, no load:
"ratio 0.01" (eager 167 ms, arbiter 1.1 ms) on a busy machine, 0.32 on the next run."""
from __future__ import annotations

import logging
import time

import torch

import arbiter
from arbiter.cli.timing import Load, Timed, comparison, interleaved, too_busy


def _spin(ms: float):
    def fn():
        end = time.perf_counter() + ms / 1e3
        while time.perf_counter() < end:
            pass
    return fn


def test_interleaved_rounds_time_each_side_with_its_own_calls():
    timed, load = interleaved({"slow": _spin(2.0), "fast": _spin(0.5)}, rounds=3,
                              round_s=0.02)
    assert [len(t.rounds_ms) for t in timed.values()] == [3, 3]
    assert timed["fast"].calls > timed["slow"].calls >= 1  # K from a probe, per side
    assert timed["slow"].median_ms >= 2.0 and timed["fast"].median_ms >= 0.5
    assert timed["fast"].median_ms < timed["slow"].median_ms
    assert load.cpus >= 1 and len(load.average) == 2


def _timed(name: str, rounds: list[float]) -> Timed:
    return Timed(name, calls=10, rounds_ms=rounds)


def test_a_quiet_machine_gets_medians_spreads_and_a_ratio():
    timed = {"eager": _timed("eager", [10.0, 10.2, 9.9]),
             "arbiter": _timed("arbiter", [5.0, 5.1, 5.05])}
    load = Load(average=(0.4, 0.6), cpus=2, others=0)
    assert too_busy(timed, load) is None
    text = comparison(timed, load, "eager", "arbiter")
    assert "3 interleaved rounds" in text and "load average 0.40 before, 0.60 after" in text
    assert "eager 10.000 ms (rounds 9.900-10.200, 10 calls each)" in text
    assert "arbiter / eager: 0.51 (below 1: arbiter is faster)" in text


def test_a_busy_machine_says_so_instead_of_a_ratio():
    loaded = Load(average=(12.8, 9.6), cpus=2, others=5)
    calm = {"eager": _timed("eager", [10.0, 10.1]), "arbiter": _timed("arbiter", [5.0, 5.0])}
    text = comparison(calm, loaded, "eager", "arbiter")
    assert "no ratio: this machine is too busy to time (load average 12.80 on 2 CPUs)" in text
    assert "arbiter / eager" not in text
    noisy = {"eager": _timed("eager", [167.0, 20.0, 21.0]),
             "arbiter": _timed("arbiter", [1.1, 6.0, 6.2])}
    why = too_busy(noisy, Load(average=(0.5, 0.5), cpus=2, others=0))
    assert "eager's rounds spread over" in why and "arbiter's rounds spread over" in why


def test_measuring_an_only_eager_candidate_is_not_called_compiling(caplog, fresh_dynamo):
    """Before: "compiling candidate 2/2 (only eager), 5.8 s": eager compiles nothing."""
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    be = arbiter.Arbiter({"backends": ["onnxruntime"], "min_block_size": 1,
                          "against_eager": "all"})
    with caplog.at_level(logging.INFO, logger="arbiter.run.measured"), torch.no_grad():
        torch.compile(m, backend=be)(torch.randn(4, 8))
    lines = [r.getMessage() for r in caplog.records if "candidate" in r.getMessage()]
    assert any("warming up candidate 2 of 2 (only eager;" in x for x in lines), lines
    assert not any("compiling candidate" in x for x in lines)
