"""The published JSON Schema of ``arbiter report --json`` (docs/report.schema.json).

Generated from the pydantic model, never written by hand: a test checks the files in
docs/ and in the package (arbiter/report/report.schema.json, shipped in the wheel) equal
what this module generates. After changing ``arbiter/report/model.py``::

    python -m arbiter.report.schema --write

A JSON report is one ``Report`` object, or a list of them (several ``--config``).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Union

from .model import SCHEMA_VERSION, Report

#: Where the schema is published: docs/ (a checkout) and the package (the wheel).
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "report.schema.json"
PACKAGE_PATH = Path(__file__).resolve().parent / "report.schema.json"


def schema() -> dict:
    from pydantic import TypeAdapter

    out = TypeAdapter(Union[Report, list[Report]]).json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"https://torch-arbiter/report.schema.v{SCHEMA_VERSION}.json",
            "title": "torch-arbiter capability report",
            "description": "One Report, or a list of Reports (side by side); "
                           "see docs/report.md",
            **out}


def schema_text() -> str:
    return json.dumps(schema(), indent=1, sort_keys=True) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--write" in argv:
        for path in (SCHEMA_PATH, PACKAGE_PATH):
            if path.parent.is_dir():
                path.write_text(schema_text())
                print(f"wrote {path}")
    else:
        sys.stdout.write(schema_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
