"""The capability report: what ran where, and why, as data and in three renderings.

A pydantic model (``model``), filled from a graph's record (``from_record``) with
computed advice (``advice``), rendered as rich text (``text``), a self-contained HTML page
(``html``) and JSON with a published schema (``schema``).
"""
from .model import (AdviceReport, BackendStatus, FallbackReport, GraphBreakReport, GraphReport,
                    NodeReport, OpReport, PartitionReport, RefusalReport, Report, RuleReport,
                    TensorReport, TimingReport, WeightEventReport)
from . import text  # noqa: F401 - str(report) renders through it (model.use_text_rendering)

__all__ = ["AdviceReport", "BackendStatus", "FallbackReport", "GraphBreakReport", "GraphReport",
           "NodeReport", "OpReport", "PartitionReport", "RefusalReport", "Report", "RuleReport",
           "TensorReport", "TimingReport", "WeightEventReport"]
