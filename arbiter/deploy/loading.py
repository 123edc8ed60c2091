"""``arbiter.load``: a saved program (saving.py) made callable again.

The file is opened and checked (archive.py: format version, sizes, hashes), the ATen
program read as data (safe_program.py) while a thread reads and checks the partitions'
saved artifacts (each used only once its size and hash matched), the plan rebuilt from
the saved node names, and each compiled partition becomes a ``run.piece.Piece`` whose
chain starts with its saved artifact (``Backend.load_artifact``, done here, not at the
first call) and goes on down the saved chain: the same backend compiled again from ATen, the next ones, eager ATen. A
backend missing at load, an artifact that fails to load, or native code not allowed
(``native_code``) moves the partition down that chain, recorded as a fallback at stage
``load``. A backend whose version differs from the saved one gets its first call checked
against eager ATen (verify ``first``), as does every partition compiled again at load.
Then the saved example inputs run once and are compared with the outputs the program
gave on them when it was exported: a load reproduces what was saved. A difference
(another backend, version or machine) checks every partition's next call against eager
ATen, as verify ``first`` does when compiling, and those that differ fall back. The
report says all of it."""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, Optional

import torch

from ..config import Config, ConfigLike, VerifyOptions, load_config
from ..errors import ArbiterError, describe
from ..plan.partition import Partition, Plan
from ..registry import aten_fallback, backend_names, get_backend_class
from ..run.dynamic import Checked, PerShape, Symbolic
from ..run.piece import Piece
from ..run.record import Fallback, PieceRecord
from ..run.resources import apply as apply_resources
from ..run.split import extract, stitch
from ..run.checks.verify import compare
from .archive import Archive
from .program import Deployed, Program
from .report import loaded_report
from .safe_program import from_bytes
from .shared import SharedWeights, with_shared
from .saving import versions
from .signature import Signature
from .tensor_file import tensors
from .tracing import aten_graph

log = logging.getLogger(__name__)


class Preloaded:
    """A chain entry standing for a saved artifact, loaded already."""

    inline_aten = False
    mode = "saved"

    def __init__(self, backend: Any, fn: Callable, label: str = ""):
        self.backend = backend
        self.name = backend.name if not label else f"{backend.name}:{label}"
        self.precision = label
        self._fn = fn

    def nonfinite_guard(self, gm: torch.fx.GraphModule) -> list[str]:
        # the loading config's backend says which inputs to check, as when compiling
        return self.backend.nonfinite_guard(gm)

    def compile(self, gm: torch.fx.GraphModule, args: Any) -> Callable:
        return self._fn


def _config(saved: dict, override: ConfigLike, notes: list[str]) -> Config:
    if override is not None:
        return load_config(override)
    data = dict(saved)
    data.pop("manifests", None)  # planning is done: the capability manifests are not read
    known = set(backend_names())
    specs = data.get("backends") or []
    names = [s if isinstance(s, str) else s.get("name") for s in specs]
    missing = [n for n in names if n not in known]
    if missing:
        notes.append(f"backend(s) {', '.join(missing)} are not installed here (unknown names)")
        data["backends"] = [s for s, n in zip(specs, names) if n in known] or ["eager"]
        data["fallback"] = [f for f in data.get("fallback", []) if f in known]
    return load_config(data)


class Loader:
    """One load (see the module)."""

    def __init__(self, path: str, config: ConfigLike, native_code: bool):
        self.path = path
        self.native_code = native_code
        self.archive = Archive(path)
        m = self.archive.manifest
        self.notes: list[str] = []
        try:
            self.signature = Signature.from_json(m["signature"])
            self.parts = _checked_parts(m["plan"]["partitions"])
            self.saved_report = dict(m["report"])
            self.saved_versions = {str(k): str(v) for k, v in m["versions"].items()}
            saved_config = dict(m["config"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ArbiterError(f"{path}: manifest.json is malformed "
                               f"({type(exc).__name__}: {exc})") from None
        self.config = _config(saved_config, config, self.notes)
        self.backends: dict[str, Any] = {}
        self.missing: dict[str, str] = {}
        for name in self.config.chain_names():
            cls = get_backend_class(name)
            backend = cls(cls.Options.model_validate(self.config.options_for(name)))
            try:
                ok, why = backend.loadable()
            except Exception as exc:  # noqa: BLE001 - a broken install
                ok, why = False, f"broken: {describe(exc)}"
            if ok:
                self.backends[name] = backend
            else:
                self.missing[name] = why
        apply_resources(self.config.resources, [b for b in self.backends.values()
                                                if not b.inline_aten],
                        first_backend=self.config.backends[0].name, training=False)
        self.eager = aten_fallback()()
        self.versions = versions(self.backends)
        for name, saved in self.saved_versions.items():
            now = self.versions.get(name)
            if now is not None and now != saved:
                self.notes.append(f"{name}: saved with {saved}, loaded with {now}"
                                  + (": its partitions' first calls are checked against eager"
                                     if name in self.backends else ""))
                log.warning("%s: %s was %s when saved, is %s here", path, name, saved, now)

    def _changed(self, name: str) -> bool:
        return self.saved_versions.get(name) != self.versions.get(name) or \
            self.saved_versions.get("torch") != self.versions.get("torch")

    def program(self) -> tuple[Program, Callable[[Optional[str]], Program]]:
        from concurrent.futures import ThreadPoolExecutor

        ar = self.archive
        # the saved artifacts are read and checked in a thread while this one reads the
        # ATen program (both mostly outside the GIL: file reads, sha256; see the module)
        pool = ThreadPoolExecutor(1, thread_name_prefix="arbiter-load")
        try:
            files = {p["id"]: pool.submit(self._files, p) for p in self.parts
                     if not p["inline"] and self._refused(p) is None}
            weights = _untransposed(tensors(ar.read_buffer("weights.safetensors"),
                                            f"{self.path}: weights.safetensors"),
                                    ar.manifest.get("stored_transposed", []), self.path)
            self.shared = SharedWeights(weights, self.path)
            # the transposed weights the artifacts take (views where stored transposed,
            # copies made in the thread meanwhile for a version 2 file)
            made = pool.submit(self.shared.prefetch, ar.manifest.get("shared_weights"))
            ep = from_bytes(ar.read("program.json"), weights, f"{self.path}: program.json")
            self.graph = aten_graph(ep)
            by_name = _match_nodes(self.graph.gm, self.parts, self.path)
            partitions = []
            for p in self.parts:
                try:
                    nodes = [by_name[n] for n in p["nodes"]]
                except KeyError as exc:
                    raise ArbiterError(f"{self.path}: partition {p.get('id')} names node "
                                       f"{exc}, which the saved program does not have") from None
                partitions.append(Partition(int(p["id"]), str(p["ran"] or p["planned"]), nodes))
            self.plan = Plan(self.graph.gm, partitions, support={})
            self.subs = {p["id"]: extract(self.plan, part, self.graph.constants)
                         for p, part in zip(self.parts, partitions) if not p["inline"]}
            made.result()
            self.loaded = {p["id"]: self._artifact(p, files.get(p["id"]))
                           for p in self.parts if not p["inline"]}
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return self.build(None)

    def _refused(self, p: dict) -> Optional[str]:
        """Why partition ``p``'s saved artifact is not loaded here, or None."""
        art = p.get("artifact")
        if not art:
            return p.get("not_saved", "no saved artifact")
        name = str(art["backend"])
        base = name.partition(":")[0]
        if base not in self.backends:
            return f"{base} is not available here ({self.missing.get(base, 'not in the config')})"
        entry = dict(art.get("entry") or {})
        if entry.get("native_code") and not self.native_code:
            return (f"its {entry.get('format', name)} artifact is native code (a shared "
                    "library), loaded only with arbiter.load(..., native_code=True)")
        return None

    def _files(self, p: dict) -> dict[str, bytes]:
        """Partition ``p``'s artifact files, each checked (archive.py)."""
        return {k: self.archive.read(v) for k, v in dict(p["artifact"]["files"]).items()}

    def _artifact(self, p: dict, files: Any) -> tuple[Optional[Preloaded], str]:
        """(the saved artifact loaded, or None; why not); ``files``: the future of its
        files (``_files``), None when ``_refused`` says why."""
        if files is None:  # refused before its files were read
            return None, self._refused(p) or "not read"
        art = p["artifact"]
        name = str(art["backend"])
        base, _, label = name.partition(":")
        backend = self.backends[base]
        entry = dict(art.get("entry") or {})
        files = files.result()  # a file refused (size, hash) raises here
        gm = self.subs[p["id"]].gm
        try:
            fn = with_shared(backend.load_artifact, entry, files, gm, shared=self.shared)
        except Exception as exc:  # noqa: BLE001 - down the saved chain
            log.warning("%s: partition %s: %s failed to load its artifact (%s)", self.path,
                        p["id"], name, describe(exc))
            return None, f"{name} failed to load it ({describe(exc)})"
        if any(isinstance(v, torch.Tensor) and not all(isinstance(s, int) for s in v.shape)
               for v in (n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder")):
            fn = Checked(fn, gm, [])
        return Preloaded(backend, fn, label), ""

    def _chain(self, p: dict) -> tuple[list, list[tuple[str, str]]]:
        """The chain at load, and (backend, why) for each saved entry left out."""
        pre, why = self.loaded[p["id"]]
        labels = list(p["chain"])
        level = max(0, int(p.get("level", 0)))
        left: list[tuple[str, str]] = []
        chain: list = [pre] if pre is not None else []
        if pre is None and p.get("artifact"):
            left.append((str(p["artifact"]["backend"]), why))
        for label in labels[level:]:
            name, _, mode = label.partition(" (")
            mode = mode.rstrip(")")
            if name == self.eager.name:
                break
            backend = self.backends.get(name.partition(":")[0])
            if backend is None or ":" in name:
                if all(name != frm for frm, _ in left):  # one note per backend
                    left.append((name, f"not available here "
                                       f"({self.missing.get(name, 'a variant')})"))
                continue
            tol = self.config.verify.tolerances
            chain.append(Symbolic(backend, tol) if mode == "symbolic" else
                         PerShape(backend, self.config.shapes.max_specializations, label)
                         if mode == "per shape" else backend)
        chain.append(self.eager)
        return chain, left

    def build(self, verify_all: Optional[str]) -> tuple[Program, Callable]:
        """The program with fresh pieces; ``verify_all``: a verify mode for every piece
        (``first``), or None: each piece's own (see the module)."""
        runners, inline, records = {}, set(), {}
        rows = []
        for p in self.parts:
            pid = p["id"]
            if p["inline"]:
                inline.add(pid)
                records[pid] = PieceRecord(pid, p["planned"], list(p["chain"]), backend=self.eager.name)
                rows.append((p, "eager", ""))
                continue
            chain, left = self._chain(p)
            rec = PieceRecord(pid, p["planned"], [getattr(b, "name", "?") + (
                f" ({b.mode})" if hasattr(b, "mode") else "") for b in chain])
            for frm, why in left:
                rec.fallbacks.append(Fallback(frm, chain[0].name, "load", why))
            first = chain[0]
            verify = self.config.verify
            if verify_all is not None or not isinstance(first, Preloaded) or \
                    self._changed(first.backend.name):
                verify = VerifyOptions(mode="first", tolerances=verify.tolerances)
            elif verify.mode == "unverified":  # its first-use checks ran before it was saved
                verify = VerifyOptions(mode="off", tolerances=verify.tolerances)
            piece = Piece(rec, self.subs[pid].gm, chain, f"{os.path.basename(self.path)}",
                          verify=verify, compile_timeout_s=self.config.compile_timeout_s)
            records[pid] = rec
            runners[pid] = (self.subs[pid], piece)
            reasons = [f"{f}: {w}" for f, w in left]
            if not p.get("artifact") and not isinstance(first, Preloaded):
                reasons.insert(0, f"saved as ATen: {p.get('not_saved', 'no artifact')}")
            rows.append((p, "saved artifact" if isinstance(first, Preloaded) else
                         "eager" if first.inline_aten else "pending",
                         "; ".join(reasons)))
        fn = stitch(self.plan, runners, inline)
        deployed = Deployed(self.path, int(self.archive.manifest["format_version"]),
                            self.saved_versions, self.versions, notes=list(self.notes))
        deployed.partitions = [
            {"id": p["id"], "saved_backend": p["ran"] or p["planned"],
             "artifact": (p["artifact"] or {}).get("entry", {}).get("format", "aten")
             if p.get("artifact") else ("eager" if p["inline"] else "aten"),
             "loaded": how, "reason": why} for p, how, why in rows]
        saved = self.saved_report
        program = Program(fn, self.signature, self.graph.weights,
                          lambda: loaded_report(saved, records, deployed), deployed=deployed)
        return program, self.build


def _untransposed(weights: dict[str, torch.Tensor], keys: Any, path: str
                  ) -> dict[str, torch.Tensor]:
    """``weights`` with each matrix ``keys`` names (stored transposed: saving.py) as a
    transposed view of what was stored: the ATen program's layout, no copy."""
    if not isinstance(keys, list) or len(set(map(str, keys))) != len(keys):
        raise ArbiterError(f"{path}: manifest.json's stored_transposed is not a list of "
                           "distinct names")
    for k in keys:
        w = weights.get(k) if isinstance(k, str) else None
        if w is None or w.dim() != 2:
            raise ArbiterError(f"{path}: manifest.json's stored_transposed names {k!r}, "
                               "which is not a matrix of weights.safetensors")
        weights[k] = w.t()
    return weights


def _checked_parts(parts: Any) -> list[dict]:
    """The manifest's partitions, each field of the type saving.py writes (TypeError or
    ValueError naming the partition and field otherwise)."""
    kinds = {"id": int, "planned": str, "ran": str, "inline": bool, "nodes": list,
             "chain": list}
    out = []
    for k, p in enumerate(parts):
        for key, kind in kinds.items():
            if not isinstance(p.get(key), kind):
                raise TypeError(f"partition {k}: {key} is not a {kind.__name__}")
        if not all(isinstance(x, str) for x in (*p["nodes"], *p["chain"])):
            raise TypeError(f"partition {k}: nodes and chain must be names")
        art = p.get("artifact")
        if art is not None and not (isinstance(art, dict) and isinstance(art.get("backend"), str)
                                    and isinstance(art.get("files"), dict)
                                    and isinstance(art.get("entry", {}), dict)):
            raise TypeError(f"partition {k}: artifact is malformed")
        if not isinstance(p.get("level", 0), int):
            raise TypeError(f"partition {k}: level is not an int")
        out.append(p)
    return out


def _match_nodes(gm: torch.fx.GraphModule, parts: list[dict], path: str) -> dict:
    """Node name -> node of the loaded graph. torch's deserializer makes a ``getitem`` for
    every output of a multi-output op, used or not; those no saved partition holds are
    removed (else they would become partition outputs). Any other node missing from the
    plan means the plan is not this program's."""
    import operator

    saved = {n for p in parts for n in p["nodes"]}
    erased = False
    for n in reversed(list(gm.graph.nodes)):
        if n.op == "call_function" and n.name not in saved and not n.users and \
                n.target is operator.getitem:
            gm.graph.erase_node(n)
            erased = True
    stray = [n.name for n in gm.graph.nodes if n.op == "call_function" and n.name not in saved]
    if stray:
        raise ArbiterError(f"{path}: the saved plan does not cover nodes "
                           f"{', '.join(stray[:5])} of the saved program")
    if erased:
        gm.recompile()
    return {n.name: n for n in gm.graph.nodes}


def load(path: str | os.PathLike, *, config: ConfigLike = None, native_code: bool = False,
         check: bool = True) -> Program:
    """The program ``Program.save`` wrote to ``path`` (see the module; docs/deploy.md).

    ``config``: the config to load under (its backends' options; a backend it does not
    list is not used); None: the saved one. ``native_code``: load artifacts that are
    native code (AOTInductor's shared libraries); off by default, since loading one runs
    code from the file. ``check``: run the saved example inputs once and compare with
    the outputs the program gave on them when it was exported (compiles anything the load
    left to compile)."""
    start = time.perf_counter()
    loader = Loader(str(path), config, native_code)
    try:
        program, rebuild = loader.program()
        if check:
            program = _checked(loader, program, rebuild)
    finally:
        loader.archive.close()
    program.deployed.load_s = time.perf_counter() - start
    return program


def _checked(loader: Loader, program: Program, rebuild: Callable) -> Program:
    samples = tensors(loader.archive.read_buffer("samples.safetensors"),
                      f"{loader.path}: samples.safetensors")
    ins = [samples[f"in.{i}"] for i in range(sum(k.startswith("in.") for k in samples))]
    outs = [samples[f"out.{i}"] for i in range(sum(k.startswith("out.") for k in samples))]
    tol = loader.config.verify.tolerances
    from torch.utils._pytree import tree_flatten

    args, kwargs = program.signature.unflatten_inputs(ins)

    def run(p: Program) -> str:
        try:
            got = [t for t in tree_flatten(p(*args, **kwargs))[0] if isinstance(t, torch.Tensor)]
        except Exception as exc:  # noqa: BLE001 - said in the report, then eager
            return f"failed: {describe(exc)}"
        cmp = compare(outs, got, tol)
        return "passed" if cmp.ok else f"differs from the saved program's outputs: {cmp.detail}"

    result = run(program)
    if result == "passed":
        program.deployed.check = "passed"
        return program
    # not what the saved program computed (another backend, version or machine): every
    # partition's next call is checked against eager ATen, as verify `first` does when
    # compiling; those that differ fall back
    log.warning("%s: the check at load %s; checking every partition against eager ATen",
                loader.path, result)
    program, _ = rebuild("first")
    again = run(program)
    rep = program.report()
    fell = sum(1 for g in rep.graphs for p in g.partitions
               if any(f.stage == "verify" for f in p.fallbacks))
    program.deployed.check = (f"{result}; every partition then checked against eager ATen: "
                              f"{fell} fell back; the check again: {again}")
    return program
