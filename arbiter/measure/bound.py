"""The accuracy bound (config `accuracy`, docs/precision.md) and how far outputs are from it.

A ``Bound`` judges a candidate's outputs against float32 eager's over one or more
calibration inputs at once (``judge``), on every measure the config states, all of which
must hold: elementwise ``rtol``/``atol`` (``run.checks.verify.compare``; integers and bools
equal), ``max_rel_norm`` (``||got - ref|| / ||ref||`` per floating output, in float64)
and ``topk`` (the share of rows whose top-1 class lies among eager's top ``k``, over
every input together). A ``Judgement`` gives the measures and one number, ``score``: the
worst measure divided by its bound (below 1 within it), which the per-module search
ranks segments by (permodule.py).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..run.checks.verify import compare, uniform_tolerances


@dataclass
class Judgement:
    """How far a candidate's outputs were from float32 eager's, over some inputs."""

    ok: bool
    score: float  # worst measure / its bound: <= 1 within the bound
    max_abs: float = 0.0  # the largest absolute error
    rel_norm: float = 0.0  # the largest ||got - ref|| / ||ref|| of an output
    agreement: Optional[float] = None  # top-k agreement (config `topk`)
    why: str = ""  # outside the bound: which measure, how far
    inputs: int = 0  # how many calibration inputs it was judged on

    def words(self) -> str:
        """``max abs 3.1e-02, rel norm 4.0e-03, top-1 agreement 100%``."""
        out = f"max abs {self.max_abs:.2e}, rel norm {self.rel_norm:.2e}"
        if self.agreement is not None:
            out += f", agreement {self.agreement:.1%}"
        return out

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"max_abs": _finite(self.max_abs),
                               "rel_norm": _finite(self.rel_norm), "score": _finite(self.score),
                               "inputs": self.inputs}
        if self.agreement is not None:
            out["agreement"] = self.agreement
        return out


def _finite(x: float) -> Optional[float]:
    """JSON has no infinity: None stands for it."""
    return float(x) if math.isfinite(x) else None


@dataclass(frozen=True)
class Bound:
    """The config's `accuracy` bound (see the module docstring)."""

    rtol: float = 0.0
    atol: float = 0.0
    max_rel_norm: Optional[float] = None
    topk: Optional[int] = None  # k
    agreement: float = 1.0  # with topk: the least share of rows agreeing
    words: str = field(default="", compare=False)

    @classmethod
    def of(cls, accuracy: Any) -> Optional["Bound"]:
        """The bound of a config's ``AccuracyOptions`` (None: none)."""
        if accuracy is None:
            return None
        topk = accuracy.topk
        return cls(float(accuracy.rtol), float(accuracy.atol), accuracy.max_rel_norm,
                   None if topk is None else topk.k,
                   1.0 if topk is None else float(topk.agreement), accuracy.describe())

    @property
    def elementwise(self) -> bool:
        return self.rtol > 0 or self.atol > 0

    def judge(self, refs: Sequence[Sequence[Any]], gots: Sequence[Sequence[Any]]) -> Judgement:
        """Outputs ``gots[i]`` against float32 eager's ``refs[i]``, for each input i."""
        max_abs, rel, score, why = 0.0, 0.0, 0.0, ""
        agree = rows = 0
        for ref, got in zip(refs, gots, strict=True):
            # without an elementwise bound floats pass any finite error here (the norms
            # judge them) while integers and bools must still be equal
            tol = uniform_tolerances(self.rtol, self.atol) if self.elementwise \
                else uniform_tolerances(0.0, math.inf)
            cmp = compare(list(ref), list(got), tol)
            max_abs = max(max_abs, cmp.max_error)
            if math.isinf(cmp.max_error) or (not cmp.ok and not _floats_only(cmp.detail)):
                # another count, shape or dtype, a non-finite value, or integers unequal
                return Judgement(False, math.inf, math.inf, math.inf, None,
                                 cmp.detail or "non-finite outputs", len(refs))
            for r, g in zip(ref, got):
                if not (isinstance(r, torch.Tensor) and r.is_floating_point() and r.numel()):
                    continue
                r64, g64 = r.detach().double(), g.detach().double().to(r.device)
                if self.elementwise:
                    excess = (g64 - r64).abs() / (self.atol + self.rtol * r64.abs())
                    score = max(score, float(excess.max()))
                norm = float(r64.norm())
                diff = float((g64 - r64).norm())
                rel = max(rel, diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf))
                if self.topk is not None and r.dim() >= 1 and r.shape[-1] > 1:
                    k = min(self.topk, r.shape[-1])
                    top = r64.reshape(-1, r.shape[-1]).topk(k, dim=-1).indices
                    mine = g64.reshape(-1, r.shape[-1]).argmax(dim=-1, keepdim=True)
                    agree += int((top == mine).any(dim=-1).sum())
                    rows += top.shape[0]
            if self.elementwise and not cmp.ok and not why:
                why = cmp.detail
        if self.max_rel_norm is not None:
            score = max(score, rel / self.max_rel_norm)
            if rel > self.max_rel_norm and not why:
                why = f"relative error norm {rel:.3g} > max_rel_norm {self.max_rel_norm:g}"
        agreement = None
        if self.topk is not None:
            agreement = agree / rows if rows else 1.0
            allowed = max(1.0 - self.agreement, 1.0 / max(rows, 1))
            score = max(score, (1.0 - agreement) / allowed * (
                1.0 if agreement >= self.agreement else 1.0 + 1e-9))
            if agreement < self.agreement and not why:
                why = (f"top-{self.topk} agreement {agreement:.2%} ({agree} of {rows} rows) "
                       f"< {self.agreement:.2%}")
        return Judgement(not why, score, max_abs, rel, agreement, why, len(refs))


def _floats_only(detail: str) -> bool:
    """Whether a failed ``compare`` only found floating values apart (a measure this
    bound may not state), not another count, shape, dtype or unequal integers."""
    return "(float" in detail or "(bfloat" in detail or "(complex" in detail
