"""`arbiter probe BACKEND`: PyTorch's OpInfo samples through one backend, against eager.

Each sample runs through the backend alone and through eager; prints what passed and
failed; with --write, marks the manifest's entries that passed `verified: probed`
(`probed_dtypes:` the dtypes that passed), drops from each op's `dtypes:` those tried and
never passed (untried ones stay, as declared), and drops the ops whose samples alone
failed in every dtype they allowed (arbiter.probe.update.manifest_update).

--build-only (TensorRT without CUDA): each sample is converted and built, not run; what
passed is marked `verified: built` (`built_dtypes:`), numbers unchecked.
--dynamic probes symbolic shapes instead: each sample traced with symbolic sizes, compiled
once and run at two sizes; --write marks the ops that passed `dynamic: true`.

--grad: each sample's training graphs are probed instead, as AOTAutograd hands them to
arbiter: the forward (`_embedding_bag`, `max_pool2d_with_indices`, `native_layer_norm`...),
every output it returns compared with eager, those saved for the backward included (a
wrong one of a tuple-returning op is written as `wrong_outputs`), then the backward (the
`*_backward` ops, with the forward's saved tensors). An OpInfo whose forward holds an op
with several outputs gets more samples, one per new argument value (embedding_bag's
modes). Ops the manifest's `decompositions:` names are decomposed for the backend, as in
a partition, and the summary says which of them passed. --write also records the ops
credited by a training graph (`training_dtypes:`) and the counts apart (`training_*`).

--edges runs the edge-value samples of arbiter/probe/edges.py instead (integer overflow,
empty dimensions, huge magnitudes, NaN made inside a graph, auxiliary outputs) and says
which differ from eager and whether the backend refuses them; it writes nothing.

Progress goes to stderr. A full probe takes minutes (ONNX export costs 0.3-1 s a sample);
--limit-s stops after that many seconds, leaving the rest `declared`.
"""
from __future__ import annotations

import json


def add_arguments(parser) -> None:
    parser.add_argument("backend", help="a registered backend (`arbiter backends`)")
    parser.add_argument("--ops", nargs="+", default=None, metavar="OP",
                        help="only these OpInfos (e.g. add, nn.functional.gelu) or ATen "
                             "ops (aten.add, aten.gelu.default)")
    parser.add_argument("--dtypes", default=None,
                        help="comma-separated dtypes to try (default float32,int64,bool,float16)")
    parser.add_argument("--limit-s", type=float, default=None,
                        help="stop starting new OpInfos after this many seconds")
    parser.add_argument("--dynamic", action="store_true",
                        help="probe symbolic shapes (two sizes through one compiled "
                             "artifact; dtypes default to float32) and, with --write, set "
                             "`dynamic: true` on the ops that passed")
    parser.add_argument("--write", action="store_true",
                        help="update capabilities/<backend>.yaml: what passed, the dtypes "
                             "that failed, the ops that failed")
    parser.add_argument("--out", default=None, metavar="PATH",
                        help="with --write: write the updated manifest here instead (a "
                             "config uses it with `manifests: {BACKEND: PATH}`)")
    parser.add_argument("--build-only", action="store_true",
                        help="build each sample with the backend and do not run it (a "
                             "backend that builds where it cannot run: tensorrt); passes "
                             "are written `verified: built`")
    parser.add_argument("--grad", action="store_true",
                        help="probe each sample's training graphs (what AOTAutograd hands "
                             "arbiter for a training step): the forward, every output "
                             "compared, saved ones included, then the backward")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="write every sample's result as JSON")
    parser.add_argument("--edges", action="store_true",
                        help="run the edge-value samples instead (integer overflow, empty "
                             "dimensions, huge magnitudes, NaN made inside a graph, "
                             "auxiliary outputs: arbiter/probe/edges.py); --ops names "
                             "samples; nothing is written")


def run(args) -> int:
    from dataclasses import asdict

    from ..backend import Backend
    from ..errors import ArbiterError, require_known
    from ..manifest import DTYPES
    from ..probe.opinfo import DEFAULT_DTYPES, probe, stderr_progress
    from ..probe.result import summarize_failures
    from ..probe.update import write_manifest
    from ..registry import get_backend_class

    cls = get_backend_class(args.backend)
    backend = cls()
    ok, why = backend.plannable() if args.build_only else backend.available()
    if not ok:
        raise ArbiterError(f"backend {args.backend!r} is unavailable: {why}")
    if args.build_only and type(backend).build_only is Backend.build_only:
        raise ArbiterError(f"backend {args.backend!r} has no build-only mode (only a "
                           "backend that builds without running has one: tensorrt)")
    if backend.inline_aten:
        raise ArbiterError(f"backend {args.backend!r} runs ATen itself: nothing to probe")
    if getattr(args, "edges", False):
        from ..probe.edges import run_cli
        return run_cli(backend, args)
    dynamic = getattr(args, "dynamic", False)
    if dynamic and args.build_only:
        raise ArbiterError("--dynamic and --build-only cannot be combined: a dynamic probe "
                           "runs each artifact at two sizes")
    if args.grad and (dynamic or args.build_only):
        raise ArbiterError("--grad cannot be combined with --dynamic or --build-only: "
                           "training graphs are probed with static shapes, run")
    dtypes = args.dtypes.split(",") if args.dtypes else \
        (["float32"] if dynamic else list(DEFAULT_DTYPES))
    try:
        require_known("dtype", dtypes, DTYPES)
    except ValueError as exc:
        raise ArbiterError(f"--dtypes: {exc}") from None
    result = probe(backend, ops=args.ops, dtypes=dtypes, limit_s=args.limit_s,
                   progress=stderr_progress(), build_only=args.build_only, dynamic=dynamic,
                   grad=args.grad)
    print(result.summary())
    for line in summarize_failures(result.samples):
        print("  failed:", line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": result.summary(), "counts": result.counts(),
                       "samples": [asdict(s) for s in result.samples]}, f, indent=1)
    if args.write:
        path = cls.manifest_path()
        text = write_manifest(path, result, out=args.out)
        print(f"wrote {args.out or path} ({len(text.splitlines())} lines)")
    return 0
