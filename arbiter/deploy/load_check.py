"""The check at load: the saved example inputs run again, compared with the saved outputs.

The saved example inputs run once and are compared with the outputs the program gave
on them when it was exported. A difference (another backend,
version or machine) rebuilds the program with every partition's next call checked
against eager ATen (verify ``first``), and those that differ fall back."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from ..errors import describe
from ..run.checks.verify import compare
from .archive import Archive
from .program import Program
from .tensor_file import tensors

log = logging.getLogger(__name__)


def checked(archive: Archive, tolerances: Any, program: Program,
            rebuild: Callable[[str], Program]) -> Program:
    """``program``, or the one ``rebuild("first")`` makes when it differs (see the
    module); ``program.deployed.check`` says what was found."""
    samples = tensors(archive.read_buffer("samples.safetensors"),
                      f"{archive.path}: samples.safetensors")
    ins = [samples[f"in.{i}"] for i in range(sum(k.startswith("in.") for k in samples))]
    outs = [samples[f"out.{i}"] for i in range(sum(k.startswith("out.") for k in samples))]
    args, kwargs = program.signature.unflatten_inputs(ins)

    def run(p: Program) -> str:
        try:
            got = [t for t in tree_flatten(p(*args, **kwargs))[0] if isinstance(t, torch.Tensor)]
        except Exception as exc:  # noqa: BLE001 - said in the report, then eager
            return f"failed: {describe(exc)}"
        cmp = compare(outs, got, tolerances)
        return "passed" if cmp.ok else f"differs from the saved program's outputs: {cmp.detail}"

    result = run(program)
    if result == "passed":
        program.deployed.check = "passed"
        return program
    log.warning("%s: the check at load %s; checking every partition against eager ATen",
                archive.path, result)
    program = rebuild("first")
    again = run(program)
    rep = program.report()
    fell = sum(1 for g in rep.graphs for p in g.partitions
               if any(f.stage == "verify" for f in p.fallbacks))
    program.deployed.check = (f"{result}; every partition then checked against eager ATen: "
                              f"{fell} fell back; the check again: {again}")
    return program
