"""The old name of report/from_record.py, kept only for arbiter/arbiter.py's import.

Not for new code: import from ``arbiter.report.from_record``. Deleted once
arbiter/arbiter.py imports ``SHAPE_EAGER_WARN`` and ``shape_eager_share`` from there.
"""
from .from_record import SHAPE_EAGER_WARN, shape_eager_share  # noqa: F401
