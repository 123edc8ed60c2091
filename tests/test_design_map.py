"""docs/design.md's module map is what tests/design_map.py makes of the docstrings.

Every module opens with a one-line sentence saying what it is, and the map lists those
sentences by package; a module added, moved or renamed, or a first line reworded, without
the map rewritten fails here, as does a module whose first sentence runs on.
"""
from __future__ import annotations

import design_map

UPDATE = ".venv/bin/python tests/design_map.py --update"

#: Modules whose first sentence still runs over several lines: held by branches that
#: were moving them when the map came (config, cache, run's checks, deploy's export and
#: save, the entry points). Fix one and take it off; a name here that no longer exists
#: fails too.
NOT_YET: set[str] = set()


def test_the_map_in_design_md_is_current():
    got, want = design_map.current(), design_map.block()
    assert got, f"docs/design.md has no map block ({design_map.START} ... {design_map.END})"
    assert got == want, f"docs/design.md's module map is out of date: run {UPDATE}"


def test_every_module_opens_with_a_one_line_sentence():
    mods = design_map.modules()
    running_on = {name for name, path in mods.items()
                  if not design_map.one_line(design_map.docstring(path))}
    assert not running_on - NOT_YET, (
        "the docstring's first line must be one sentence saying what the module is, "
        "followed by a blank line (it is the module's line in docs/design.md's map): "
        f"{sorted(running_on - NOT_YET)}")
    assert not NOT_YET - running_on, (
        f"fixed or gone, take them off NOT_YET: {sorted(NOT_YET - running_on)}")
