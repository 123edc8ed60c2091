"""Manifests from what backends declare and from what they do.

What they declare (``generate``); what they do: OpInfo samples through one backend
against eager (``opinfo``), written back by one rule (``update``).
"""
from .opinfo import opinfos, probe
from .result import ProbeResult, SampleResult
from .update import manifest_dtypes, manifest_update, write_manifest

__all__ = ["ProbeResult", "SampleResult", "manifest_dtypes", "manifest_update", "opinfos",
           "probe", "write_manifest"]
