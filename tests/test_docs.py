"""The documentation a reader can follow (issue 30): no citation of things outside the
project ("see shared ANCHORS", "(issue 6)"), an index of docs/ in reading order that lists
every page, and a getting-started at the top of the README whose example does what it
says."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
READ = [*sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "configs").glob("*.yaml")),
        ROOT / "bench" / "README.md", ROOT / "README.md"]
#: what a reader of the repository cannot open: the tracker's issue numbers, notes kept
#: outside the repository
UNFOLLOWABLE = re.compile(r"\bissues? \d+|ANCHORS|\.\./shared/|\bshared/[A-Z]")


@pytest.mark.parametrize("path", READ, ids=lambda p: str(p.relative_to(ROOT)))
def test_cites_only_what_a_reader_can_open(path):
    hits = [f"{k}: {line.strip()}" for k, line in enumerate(path.read_text().splitlines(), 1)
            if UNFOLLOWABLE.search(line)]
    assert not hits, "\n".join(hits)


def test_docs_index_lists_every_page_and_its_links_resolve():
    index = ROOT / "docs" / "README.md"
    links = re.findall(r"\]\(([^)#]+)\)", index.read_text())
    for link in links:
        assert (index.parent / link).resolve().exists(), link
    listed = {(index.parent / link).resolve() for link in links}
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md")} - {index.resolve()}
    assert pages <= listed, f"not in docs/README.md: {sorted(p.name for p in pages - listed)}"


def test_readme_starts_with_getting_started_that_runs(fresh_dynamo):
    pytest.importorskip("onnxruntime")
    text = (ROOT / "README.md").read_text()
    heads = re.findall(r"^## (.+)$", text, re.M)
    assert heads[0] == "Getting started", heads
    part = text.split("## Getting started", 1)[1].split("\n## ", 1)[0]
    code, said = re.search(r"```python\n(.*?)# (1 graph.*?)\n```", part, re.S).groups()
    printed = []
    exec(compile(code, "README.md", "exec"), {"print": printed.append, "torch": torch})
    assert printed == [said]
