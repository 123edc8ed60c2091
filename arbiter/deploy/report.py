"""The report of a loaded program: the saved report, updated from what runs now.

Its partitions updated from the pieces that run now (backend, chain, fallbacks at load
and after), the per-kind summary recomputed, and what loading did (``deployed``).
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ..report import Report
from ..report.from_record import kind_reports
from ..report.model import DeployedReport, FallbackReport


def loaded_report(saved: dict, records: dict, deployed: Any) -> Report:
    report = Report.model_validate(saved)
    eager = set()
    for g in report.graphs:
        for p in g.partitions:
            rec = records.get(p.id)
            if rec is None:
                continue
            if p.inline:
                eager.add(p.backend or p.planned_backend)
                continue
            p.fallbacks = [*p.fallbacks, *(FallbackReport(**asdict(f)) for f in rec.fallbacks)]
            p.compiled = bool(rec.backend)
            p.backend = rec.backend or None
            p.chain = list(rec.chain)
            p.compile_s = rec.compile_s
            p.verify_checks = rec.verify_checks
            p.verify_max_error = rec.verify_max_error
            if rec.backend:  # how the running entry took the shapes (run/dynamic.py)
                p.shapes, p.specializations = rec.shapes, rec.specializations
    report.kinds = kind_reports(report.graphs, eager or {"eager"})
    report.deployed = DeployedReport(
        path=deployed.path, format_version=deployed.format_version,
        saved_versions=deployed.saved_versions, loaded_versions=deployed.loaded_versions,
        load_s=deployed.load_s, check=deployed.check, partitions=deployed.partitions,
        notes=deployed.notes)
    return report


def saved_report(path: str) -> Report:
    """The report saved in a program's file (no backend needed, nothing loaded), with
    the file named in its ``model`` line; the file is checked whole first (sizes and
    sha256, as ``arbiter.load`` checks them)."""
    from .archive import Archive

    archive = Archive(path)
    try:
        archive.verify_all()  # a report of an altered file would describe another program
        report = Report.model_validate(archive.manifest.get("report") or {})
    except Exception as exc:  # noqa: BLE001 - pydantic's error, said where
        from ..errors import ArbiterError

        raise ArbiterError(f"{path}: the saved report is malformed ({exc})") from None
    finally:
        archive.close()
    report.model = f"{report.model or archive.manifest.get('model', '')} (saved in {path})"
    return report
