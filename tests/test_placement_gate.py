"""The placement regression gate (tests/placement_gate.py says what is recorded).

Each case's plan (partitions and compute nodes per backend, per graph kind) must equal
tests/placement_expected.json. A change that moves work to eager or adds partitions
fails here; one that moves work on purpose updates the file in the same commit:
``.venv/bin/python tests/placement_gate.py --update "why"``. Plans come from
``arbiter.explain`` (nothing compiled), so the gate is deterministic: no timing, no
backend run.
"""
from __future__ import annotations

import json

import pytest

import placement_gate as gate

EXPECTED = json.loads(gate.EXPECTED.read_text())["plans"]


def test_every_case_has_an_expected_plan():
    assert sorted(EXPECTED) == sorted(gate.key(*c) for c in gate.cases())


@pytest.mark.parametrize("model", list(gate.MODELS))
def test_plans_are_as_recorded(model, fresh_dynamo):
    moved = []
    for case in [c for c in gate.cases() if c[0] == model]:
        got, want = gate.plans(*case), EXPECTED[gate.key(*case)]
        if got != want:
            moved.append(f"{gate.key(*case)}: expected {want}, got {got}")
    assert not moved, ("plans moved (update tests/placement_expected.json with the reason "
                       "if on purpose: .venv/bin/python tests/placement_gate.py --update "
                       "'why'):\n" + "\n".join(moved))
