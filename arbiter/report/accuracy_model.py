"""The model of the report's accuracy section (config `accuracy`), part of ``GraphReport``.

The bound, every lower-precision candidate's measures, the per-module search, the drift
watch (docs/precision.md).
"""
from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, Field


class Measures(BaseModel):
    """How far outputs were from float32 eager's over some inputs (arbiter/measure/bound.py)."""

    max_abs: Optional[float] = Field(None, description="largest absolute error (null: "
                                     "infinite)")
    rel_norm: Optional[float] = Field(None, description="largest ||got - eager|| / "
                                      "||eager|| of an output")
    score: Optional[float] = Field(None, description="the worst measure over its bound: "
                                   "at most 1 within the bound")
    agreement: Optional[float] = Field(None, description="top-k agreement (config "
                                       "`accuracy.topk`)")
    inputs: int = Field(0, description="inputs judged on")


class ModulePrecision(BaseModel):
    """One module-boundary segment as the per-module precision search saw it."""

    index: int
    module: str = Field(description="its path in the model (`encoder.layer.0.attention`)")
    cls: str = Field(description="its class")
    precision: str = Field(description="`float32`, or the variant it runs on "
                           "(`onnxruntime:int8`)")
    backend: str = Field("", description="the backend its first node runs on")
    f32_ms: Optional[float] = Field(None, description="its kind's time on the variant's "
                                    "backend at float32")
    low_ms: Optional[float] = Field(None, description="its time on the variant")
    alone: Optional[Measures] = Field(None, description="the graph's outputs with only "
                                      "this segment lowered")
    why: str = Field("", description="why it stayed float32")


class PrecisionSearchReport(BaseModel):
    """The per-module precision search of one graph (docs/precision.md)."""

    variant: str
    depth: int = Field(0, description="the module depth of the segments")
    evaluations: int = Field(0, description="segment plans judged on the samples")
    search_s: float = 0.0
    samples: int = Field(0, description="calibration inputs searched on")
    candidate: str = Field("", description="the candidate it built (\"\": none)")
    notes: list[str] = Field(default_factory=list)


class AccuracyReport(BaseModel):
    """Config `accuracy`: the bound and how the lower-precision candidates fared against
    float32 eager (docs/precision.md)."""

    rtol: float
    atol: float
    bound: str = Field("", description="every bound stated, in words")
    errors: dict[str, float] = Field(default_factory=dict, description="lower-precision "
                                     "candidate -> max abs error of the graph's outputs "
                                     "against float32 eager on the calibration inputs")
    measures: dict[str, Measures] = Field(default_factory=dict, description="lower-"
                                          "precision candidate -> every measure")
    rejected: dict[str, str] = Field(default_factory=dict, description="candidate -> why "
                                     "it was refused (outside the bound)")
    chosen_error: Optional[float] = Field(None, description="the chosen placement's error "
                                          "when it runs at a lower precision")
    holdout: Optional[Measures] = Field(None, description="the chosen lower-precision "
                                        "placement on held-out inputs (`arbiter.tune`), "
                                        "which the search never saw")
    float32: str = Field("", description="the best float32 placement")
    float32_ms: Optional[float] = None
    chosen_ms: Optional[float] = None
    speedup: Optional[float] = Field(None, description="float32_ms / chosen_ms")
    modules: list[ModulePrecision] = Field(default_factory=list, description="per-module "
                                           "search: each segment's precision and backend")
    search: Optional[PrecisionSearchReport] = None
    checks: int = Field(0, description="drift watch: checks of the graph against float32 "
                        "eager since it was installed")
    worst: Optional[Measures] = Field(None, description="drift watch: the worst check")
    drift: list[str] = Field(default_factory=list, description="drift watch: what left the "
                             "bound and went back to float32")
