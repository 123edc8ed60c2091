"""The config's JSON Schema, for editors that complete YAML (docs/config.schema.json).

Generated from the pydantic ``Config`` model, then sharpened with what only the registries
know: each registered backend's name and its own ``Options`` (so an editor completes
``options:`` per backend), the policies, the backends a ``pin`` may name, the form of an op
name. Never written by hand: a test checks the published copies equal what this module
generates. After changing ``arbiter/config/`` or a backend's options::

    python -m arbiter.config.schema --write      # or: arbiter schema --write

Editors: with the YAML language server (VS Code's YAML extension, and others), put
``# yaml-language-server: $schema=<path or URL of config.schema.json>`` at the top of a
config, or map the schema to ``*.arbiter.yaml`` in the editor's settings.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .._version import __version__

ROOT = Path(__file__).resolve().parent
#: where the schema is published: in docs/ (a checkout) and in the package (the wheel)
DOCS_PATH = ROOT.parents[1] / "docs" / "config.schema.json"
PACKAGE_PATH = ROOT / "config.schema.json"
#: an op as configs name it: aten.x or aten.x.overload
OP_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$"


def schema() -> dict:
    from ..plan.policy import policy_names
    from ..registry import backend_names, get_backend_class
    from . import Config

    out = Config.model_json_schema()
    defs = out.setdefault("$defs", {})
    props = out["properties"]
    props.pop("source", None)
    names = backend_names()
    # one BackendSpec per registered backend: its name, and its own options
    specs = []
    for name in names:
        opts = get_backend_class(name).Options.model_json_schema()
        for k, v in opts.pop("$defs", {}).items():
            defs.setdefault(k, v)
        opts.setdefault("additionalProperties", False)
        specs.append({"type": "object", "additionalProperties": False, "required": ["name"],
                      "properties": {"name": {"const": name},
                                     "options": {**opts, "title": f"{name} options"}}})
    spec_or_name = {"anyOf": [{"type": "string", "enum": names}, *specs]}
    props["backends"] = {**props["backends"], "items": spec_or_name, "minItems": 1}
    props["fallback"] = {**props["fallback"], "items": {"type": "string", "enum": names}}
    props["policy"] = {**props["policy"], "enum": policy_names()}
    props["pin"] = {**props["pin"], "propertyNames": {"pattern": OP_PATTERN},
                    "additionalProperties": {"type": "string", "enum": names}}
    for key in ("exclude_ops", "decompositions"):
        props[key] = {**props[key], "items": {"type": "string", "pattern": OP_PATTERN}}
    if "manifests" in props:
        props["manifests"] = {**props["manifests"],
                              "propertyNames": {"enum": names}}
    spin = defs.get("ResourcesOptions", {}).get("properties", {}).get("spin")
    if spin is not None:
        spin["enum"] = ["auto", "none", *names]
    return {**out, "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"https://torch-arbiter/config.schema.v{__version__}.json",
            "title": "torch-arbiter config",
            "description": "A torch-arbiter config (YAML); see docs/config.md"}


def schema_text() -> str:
    return json.dumps(schema(), indent=1, sort_keys=True) + "\n"


def write() -> list[Path]:
    text = schema_text()
    out = []
    for path in (DOCS_PATH, PACKAGE_PATH):
        if path.parent.is_dir():
            path.write_text(text)
            out.append(path)
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--write" in argv:
        for path in write():
            print(f"wrote {path}")
    else:
        sys.stdout.write(schema_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
