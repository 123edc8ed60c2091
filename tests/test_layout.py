"""The package's shape: layers by pipeline stage, no import loops, light ``import arbiter``.

Every ``import`` of an ``arbiter`` module anywhere in a file (module level, inside a
function, or in an ``if TYPE_CHECKING:`` block: a type-only import ties the modules as
much) is an edge of the import graph. The graph must have no cycle, and no module may
import one of a higher layer. Plugin discovery by name
(``importlib.import_module("arbiter.backends")`` in the registry, the entry-point groups)
is how a lower layer loads what registers with it, and is not an import edge.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"arbiter": ROOT / "arbiter", "arbiter.backends": ROOT / "backends"}

#: Low to high. A module may import its own layer (no cycles) and the ones below.
LAYERS = [
    ("arbiter._version", "arbiter.errors", "arbiter.ops", "arbiter.shapes",
     "arbiter.yamlsrc",
     "arbiter.decompose"),
    ("arbiter.manifest", "arbiter.cache", "arbiter.plan.findings"),
    ("arbiter.backend", "arbiter.registry"),
    ("arbiter.plan.capability",),
    ("arbiter.plan",),
    ("arbiter.config", "arbiter.config.torch_compile"),
    ("arbiter.backends",),
    ("arbiter.run",),
    ("arbiter.measure",),
    ("arbiter.report",),
    ("arbiter.compile_graph",),
    ("arbiter.arbiter", "arbiter.dryrun"),
    ("arbiter.sessions",),
    ("arbiter.dynamo",),
    ("arbiter.deploy",),
    ("arbiter.probe", "arbiter.config.doc", "arbiter.config.schema"),
    ("arbiter.cli",),
]

#: What ``import arbiter`` must not load: every backend's package, and the big optional ones.
HEAVY = ("onnxruntime", "onnx", "onnxscript", "openvino", "tensorrt", "tensorrt_rtx",
         "triton", "transformers", "rich")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if pkg == "arbiter" and parts[:1] == ["backends"]:
                continue
            out[".".join([pkg, *parts])] = path
    return out


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _imports(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    here = name if _is_package(path) else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):  # `if TYPE_CHECKING:` blocks included: a type is an edge
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found |= {f"{mod}.{a.name}" for a in node.names}  # `from pkg import module`
    return {m for m in found if m == "arbiter" or m.startswith("arbiter.")}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        edges = set()
        for m in _imports(name, path):
            while m and m not in mods:  # `arbiter.x.name` -> the module it names
                m = m.rpartition(".")[0]
            if m and m != name:
                edges.add(m)
        graph[name] = edges
    return graph


def _layer(name: str) -> int:
    best = None
    for k, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if name == p or name.startswith(p + "."):
                if best is None or len(p) > best[1]:
                    best = (k, len(p))
    assert best is not None, f"{name} is in no layer of tests/test_layout.py"
    return best[0]


def test_every_module_has_a_layer():
    for name in _modules():
        if name != "arbiter":  # the package's face imports whatever it shows
            _layer(name)


def test_no_import_goes_up_a_layer():
    wrong = []
    for name, edges in _graph().items():
        if name == "arbiter":
            continue
        for m in edges:
            if m == "arbiter":
                wrong.append(f"{name} imports the package face `arbiter`")
            elif _layer(m) > _layer(name):
                wrong.append(f"{name} (layer {_layer(name)}) imports {m} (layer {_layer(m)})")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_loops():
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    loops = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                loops.append(" -> ".join(stack[stack.index(m):] + [m]))
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    assert not loops, "\n".join(loops)


def test_core_names_no_backend():
    """Core code never imports a backend module (backends register themselves)."""
    for name, edges in _graph().items():
        if name.startswith("arbiter.backends"):
            continue
        assert not any(m.startswith("arbiter.backends") for m in edges), (name, edges)


def test_import_arbiter_loads_no_backend_package():
    code = ("import sys, arbiter; heavy = %r; "
            "print(','.join(m for m in heavy if m in sys.modules))" % (HEAVY,))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "", f"`import arbiter` imported {out.stdout.strip()}"


#: the house's limits: no class past 300 lines (two ideas), the session and the entry
#: point small, a ground floor of at most 14 modules, the loader a reader of few rooms
MAX_CLASS = 300
MAX_LINES = {"arbiter.arbiter": 400, "arbiter.dynamo": 200}
MAX_TOP_LEVEL = 14
MAX_IMPORTS = {"arbiter.deploy.loading": 10}


def test_the_house_keeps_its_limits():
    mods = _modules()
    wrong = []
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno >= MAX_CLASS:
                wrong.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    for name, limit in MAX_LINES.items():
        n = len(mods[name].read_text().splitlines())
        if n >= limit:
            wrong.append(f"{name}: {n} lines (under {limit})")
    top = sorted(p.name for p in (ROOT / "arbiter").glob("*.py"))
    if len(top) > MAX_TOP_LEVEL:
        wrong.append(f"arbiter/ has {len(top)} modules at its top level: {', '.join(top)}")
    graph = _graph()
    for name, limit in MAX_IMPORTS.items():
        if len(graph[name]) > limit:
            wrong.append(f"{name} imports {len(graph[name])} arbiter modules: "
                         f"{', '.join(sorted(graph[name]))}")
    assert not wrong, "\n".join(wrong)
