"""Packaging (issue 15, item 7): the config's JSON Schema published (docs/, the package,
`arbiter schema`), py.typed, LICENSE and the license field, the report schema in the
wheel, user manifests loadable from the config's ``manifests:``."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import yaml

import arbiter
from arbiter.config import schema as config_schema
from arbiter.config import shipped_configs
from arbiter.report import schema as report_schema

ROOT = Path(__file__).resolve().parent.parent
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (test extra) missing")


def test_config_schema_is_published_and_in_sync(registry):
    text = config_schema.schema_text()
    for path in (config_schema.DOCS_PATH, config_schema.PACKAGE_PATH):
        assert path.read_text() == text, \
            f"{path} is stale: run python -m arbiter.config.schema --write"
    for path in (report_schema.SCHEMA_PATH, report_schema.PACKAGE_PATH):
        assert path.read_text() == report_schema.schema_text(), \
            f"{path} is stale: run python -m arbiter.report.schema --write"


def _readme_config() -> dict:
    text = (ROOT / "README.md").read_text()
    return yaml.safe_load(re.search(r"## Config\n\n```yaml\n(.*?)```", text, re.S).group(1))


def test_config_schema_accepts_good_configs_and_rejects_bad_ones():
    validator = jsonschema.Draft202012Validator(config_schema.schema())
    good = [yaml.safe_load(p.read_text()) for p in shipped_configs().values()]
    good.append(_readme_config())
    for cfg in good:
        validator.validate(cfg)
    bad = [
        {"backends": ["onnxruntime"], "min_blok_size": 2},                    # a typo
        {"backends": ["onnxruntim"]},                                          # a name
        {"backends": [{"name": "openvino", "options": {"precison": "f32"}}]},  # an option
        {"backends": [{"name": "openvino", "options": {"precision": "f64"}}]}, # a value
        {"backends": ["onnxruntime"], "policy": "fastest"},
        {"backends": ["onnxruntime"], "pin": {"softmax": "onnxruntime"}},     # op form
        {"backends": []},
    ]
    for cfg in bad:
        assert list(validator.iter_errors(cfg)), cfg
        with pytest.raises(arbiter.ConfigError):  # the loader agrees
            arbiter.load_config(cfg)


@pytest.mark.parametrize("args, title", [([], "torch-arbiter config"),
                                         (["--report"], "torch-arbiter capability report")])
def test_arbiter_schema_command(args, title):
    out = subprocess.run([sys.executable, "-m", "arbiter.cli", "schema", *args],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["title"] == title


def test_wheel_ships_types_schemas_license_and_the_layout_library(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                          "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0 and "No module named pip" in out.stderr:
        pytest.skip("pip is not installed in this environment")
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith("dist-info/METADATA"))).decode()
    for name in ("arbiter/py.typed", "arbiter/config/config.schema.json",
                 "arbiter/report/report.schema.json", "arbiter/report/vendor/dagre.min.js",
                 "arbiter/report/page.js", "arbiter/report/page.css",
                 "arbiter/capabilities/onnxruntime.yaml", "arbiter/configs/default.yaml"):
        assert name in names, name
    assert any(n.endswith("dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: BSD-3-Clause" in meta.splitlines()


def test_user_manifest_from_the_config_key(tmp_path, fresh_dynamo):
    """Before: `arbiter probe --out` wrote a manifest nothing could load."""
    from arbiter.registry import get_backend_class

    shipped = get_backend_class("onnxruntime").manifest_path()
    data = yaml.safe_load(shipped.read_text())
    assert "aten.relu.default" in data["ops"]
    del data["ops"]["aten.relu.default"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "ort.yaml").write_text(yaml.safe_dump(data))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("backends: [onnxruntime]\nmin_block_size: 1\n"
                   "manifests: {onnxruntime: mine/ort.yaml}\n")   # relative to the config
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
    be = arbiter.Arbiter(str(cfg))
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(m, backend=be)(x), m(x))
    rep = be.report()
    relu = next(o for g in rep.graphs for o in g.ops if o.op == "aten.relu.default")
    assert relu.placed == {"eager": 1}
    assert "not in the onnxruntime manifest" in relu.refused["onnxruntime"]
    # the class's own manifest is untouched
    assert get_backend_class("onnxruntime").manifest().entry("aten.relu.default") is not None


@pytest.mark.parametrize("manifests, words", [
    ({"openvino": "x.yaml"}, "not in this config"),
    ({"onnxruntime": "missing.yaml"}, "file not found"),
])
def test_bad_manifest_keys_are_located_errors(manifests, words, tmp_path):
    with pytest.raises(arbiter.ConfigError) as info:
        arbiter.load_config({"backends": ["onnxruntime"], "manifests": manifests})
    assert words in str(info.value) and info.value.key.startswith("manifests")


def test_every_shipped_folder_is_a_listed_package():
    """Before: `pip install -e .` warned that `arbiter.report.vendor` (dagre.min.js) was
    "absent from the packages configuration": setuptools ships a folder's files only as a
    package of its own. Every folder under the package's sources (the package-dir map) must
    be in `packages`, and package-data globs stay inside their package."""
    import tomllib

    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = set(tool["packages"])
    folders = set()
    for name, src in tool["package-dir"].items():
        for d in [ROOT / src, *(ROOT / src).rglob("*")]:
            if d.is_dir() and d.name != "__pycache__" and any(
                    f.is_file() and f.suffix != ".pyc" for f in d.iterdir()):
                rel = d.relative_to(ROOT / src).parts
                dotted = ".".join((name, *rel))
                if not any(dotted.startswith(other + ".") and other != name
                           for other in tool["package-dir"]):  # mapped elsewhere
                    folders.add(dotted)
    assert folders <= packages, f"folders not in [tool.setuptools] packages: {folders - packages}"
    for pkg, globs in tool["package-data"].items():
        assert pkg in packages
        assert not [g for g in globs if "/" in g], f"{pkg}: a glob into a sub-folder {globs}"
