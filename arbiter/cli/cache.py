"""`arbiter cache [list|size|clear]`: the persistent cache's entries (docs/cache.md).

    arbiter cache [list] [--dir D | --config C] [--kind onnx]  entries, newest use first
    arbiter cache size  [--dir D | --config C]                 total, per kind, the limit
    arbiter cache clear [--dir D | --config C] [--kind onnx]   remove entries

The directory is `--dir`, else the `cache.dir` of `--config`, else $ARBITER_CACHE_DIR or
~/.cache/torch-arbiter. Each command also says whether arbiter trusts the directory
(yours alone, docs/cache.md): an untrusted one is listed and can be cleared, but is never
used.
"""
from __future__ import annotations

import datetime
import sys


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=("list", "size", "clear"), nargs="?",
                        default="list",
                        help="list entries (the default), show their total size, or "
                             "remove them")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--dir", default=None, help="the cache directory")
    where.add_argument("--config", default=None,
                       help="a config (path or shipped name) whose cache.dir to use")
    parser.add_argument("--kind", default=None,
                        help="only entries of this kind (onnx, decision, finding, ...)")


def run(args) -> int:
    from pathlib import Path

    from ..cache import DEFAULT_MAX_BYTES, default_dir
    from ..cache.directory import entries, untrusted
    from ..report.cells import human_bytes as _human, plural

    limit = DEFAULT_MAX_BYTES
    if args.dir is not None:
        directory = Path(args.dir).expanduser()
    elif args.config is not None:
        from ..config import load_config

        cfg = load_config(args.config)
        directory = Path(cfg.cache.dir).expanduser() if cfg.cache.dir else default_dir()
        limit = int(cfg.cache.max_size_gb * 1024 ** 3)
    else:
        directory = default_dir()
    if not directory.is_dir():
        print(f"{directory}: no cache here")
        return 0
    why = untrusted(directory)
    if why:
        print(f"warning: arbiter does not use this cache: {why}", file=sys.stderr)
    every = entries(directory)
    found = [e for e in every if args.kind is None or e.kind == args.kind]
    if args.kind is not None and not found:  # a typo reads as an empty kind: say which are
        from ..errors import did_you_mean

        here = sorted({e.kind for e in every})
        print(f"arbiter: no entry of kind {args.kind!r} in {directory}"
              f"{did_you_mean(args.kind, here)}; kinds here: "
              f"{', '.join(here) or 'none (the cache is empty)'}", file=sys.stderr)
    if args.action == "list":
        for e in sorted(found, key=lambda e: -e.mtime_ns):
            used = datetime.datetime.fromtimestamp(e.mtime_ns / 1e9).isoformat(
                sep=" ", timespec="seconds")
            print(f"{e.kind:<10} {e.key[:16]}  {_human(e.size):>10}  {used}  {e.path}")
        print(f"{plural(len(found), 'entry', 'entries')}, "
              f"{_human(sum(e.size for e in found))} in {directory}")
    elif args.action == "size":
        kinds: dict[str, list] = {}
        for e in found:
            kinds.setdefault(e.kind, []).append(e.size)
        for kind, sizes in sorted(kinds.items()):
            print(f"{kind:<10} {len(sizes):>6} {'entry  ' if len(sizes) == 1 else 'entries'}  "
                  f"{_human(sum(sizes)):>10}")
        total = sum(e.size for e in found)
        print(f"total      {len(found):>6} {'entry  ' if len(found) == 1 else 'entries'}  "
              f"{_human(total):>10} of "
              f"{_human(limit)} (cache.max_size_gb) in {directory}")
    else:
        removed = 0
        for e in found:
            try:
                e.path.unlink()
                removed += e.size
            except OSError as exc:
                print(f"cannot remove {e.path}: {exc}", file=sys.stderr)
        print(f"removed {plural(len(found), 'entry', 'entries')} ({_human(removed)}) from "
              f"{directory}")
        if any(e.kind == "calibration" for e in found):
            print("the machine's calibration was among them: the next compile under policy "
                  "`calibrated` (the shipped configs') measures it again, within "
                  "calibration.time_budget_s (about a minute), or run `arbiter calibrate` "
                  "now")
    return 0
