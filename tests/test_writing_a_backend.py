"""docs/writing-a-backend.md as a user follows it: its files, taken from the page as
written, make a package that registers a backend, and a model compiles onto it; a
`manifest_path` that is not a classmethod is refused at registration, saying what to
write (issue 30: before, "'PosixPath' object is not callable" deep inside Dynamo)."""
from __future__ import annotations

import importlib
import re
import sys
import tomllib
from pathlib import Path

import pytest
import torch

import arbiter

PAGE = Path(__file__).resolve().parent.parent / "docs" / "writing-a-backend.md"


def page_files() -> dict[str, str]:
    """The page's fenced blocks marked ``file=PATH``: path -> text."""
    blocks = re.findall(r"^```\w+ file=(\S+)\n(.*?)^```$", PAGE.read_text(), re.M | re.S)
    return dict(blocks)


@pytest.fixture
def numpy_package(tmp_path, registry, monkeypatch):
    pytest.importorskip("numpy")
    files = page_files()
    assert set(files) == {"arbiter_numpy/__init__.py", "arbiter_numpy/numpy.yaml",
                          "pyproject.toml"}
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("arbiter_numpy", None)
    yield importlib.import_module("arbiter_numpy"), files
    sys.modules.pop("arbiter_numpy", None)


def test_the_pages_backend_compiles_a_model(numpy_package, fresh_dynamo):
    module, files = numpy_package
    assert arbiter.registry.get_backend_class("numpy") is module.NumpyBackend
    # the entry point names the package that registers the backend
    entry = tomllib.loads(files["pyproject.toml"])["project"]["entry-points"]
    assert entry["arbiter.backends"] == {"numpy": "arbiter_numpy"}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    be = arbiter.Arbiter({"backends": [{"name": "numpy", "options": {"copy_outputs": True}}],
                          "min_block_size": 1})
    with torch.no_grad():
        out = torch.compile(model, backend=be)(x)
        torch.testing.assert_close(out, model(x))
    rep = be.report()
    (g,) = rep.graphs
    assert [(p.backend, p.nodes, p.fallbacks) for p in g.partitions] == [("numpy", 5, [])]
    assert rep.summary().startswith("1 graph, 1 partition; ran: numpy 100%; fallbacks: 0")
    # an op it has no kernel for runs elsewhere: the manifest never offers it
    be = arbiter.Arbiter({"backends": ["numpy"], "min_block_size": 1})
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(torch.sigmoid, backend=be)(x), x.sigmoid())
    assert {p.backend for g in be.report().graphs for p in g.partitions} == {"eager"}


@pytest.mark.parametrize("how", ["attribute", "plain method"])
def test_manifest_path_not_a_classmethod_is_refused_at_registration(how, registry):
    body = {"attribute": {"manifest_path": Path("/somewhere/mine.yaml")},
            "plain method": {"manifest_path": lambda self: Path("/somewhere/mine.yaml")}}[how]
    cls = type("MineBackend", (arbiter.Backend,), {"name": "mine", **body})
    with pytest.raises(arbiter.ArbiterError) as info:
        arbiter.register_backend(cls)
    msg = str(info.value)
    assert msg.startswith(f"backend class {__name__}.MineBackend ('mine'): `manifest_path` is")
    assert "@classmethod\n    def manifest_path(cls):" in msg
    assert "mine" not in arbiter.registry._REGISTRY
