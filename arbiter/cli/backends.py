"""`arbiter backends`: every registered backend, and whether it can run here.

Per backend also its manifest's size (and how its entries are known) and its version.
One row per backend, columns as wide as their longest cell; why a backend cannot run is
the line below its row, wrapped to the terminal's width (80 columns off a terminal). An
install command is shown only when a package it needs is missing here.
"""
from __future__ import annotations

import shutil
import sys
import textwrap


def add_arguments(parser) -> None:
    parser.add_argument("--width", type=int, default=None,
                        help="wrap the reasons at this width (default: the terminal's, "
                             "80 off a terminal)")


def rows(names=None) -> list[tuple[str, str, str, str, str]]:
    """(name, status, manifest, version, why) per registered backend (or of ``names``)."""
    from ..errors import ArbiterError
    from ..registry import backend_names, get_backend_class, install_advice, missing_packages

    out = []
    for name in names or backend_names():
        cls = get_backend_class(name)
        be = cls()
        try:
            ok, why = be.available()
        except Exception as exc:  # noqa: BLE001 - a broken install is a row, not a crash
            ok, why = False, f"broken: {type(exc).__name__}: {exc}"
        try:
            size = cls.manifest().verification()  # and how its entries are known
        except ArbiterError as exc:
            size = f"manifest error: {exc}"
        builds = not ok and be.plannable()[0]  # builds and plans, cannot run (TensorRT)
        installed = not ok and bool(cls.install_hint) and \
            missing_packages(cls.install_hint) == []
        try:
            version = be.version() if ok or builds or installed else "-"
        except Exception:  # noqa: BLE001 - a version is not worth a crash
            version = "-"
        status = "available" if ok else "plans only" if builds else "unavailable"
        if builds:
            why = f"builds and plans (dry runs), cannot run here: {why}"
        elif installed:
            why = f"installed, but cannot run here: {why}"
        elif not ok:
            why += install_advice(cls)
        out.append((name, status, size, version, why if not ok else ""))
    return out


def table_lines(found: list[tuple[str, str, str, str, str]], width: int) -> list[str]:
    """The rows as lines: no trailing spaces, reasons wrapped below their row."""
    head = ("backend", "status", "manifest", "version")
    cols = [max(len(r[k]) for r in [head, *found]) for k in range(4)]

    def line(cells) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, cols)).rstrip()

    lines = [line(head), line("-" * w for w in cols)]
    for r in found:
        lines.append(line(r[:4]))
        if r[4]:
            lines += textwrap.wrap(r[4], max(40, width), initial_indent="  ",
                                   subsequent_indent="  ", break_on_hyphens=False)
    return lines


def calibration_lines() -> list[str]:
    """This machine's calibration for the embedded default config's backends, as the
    cache holds it (nothing is measured here: `arbiter calibrate` does)."""
    import torch

    from ..arbiter import Arbiter
    from ..measure.calibration import Calibrations, backend_row

    be = Arbiter(None)
    be.apply_resources()  # the thread count keys the calibration
    cal = Calibrations(be.planner, be.cache, measure=False, pinned=False)
    got = cal.cached()
    known = cal.measured(measure=False)
    lines = [f"calibration on this machine ({torch.get_num_threads()} threads; what policy "
             "`calibrated` predicts with; `arbiter calibrate` measures it):"]
    for name in cal.names:
        m = known.get(name)
        load = f" (measured at load {m.load:.1f} per core)" if m and m.load else ""
        lines.append(f"  {name}: {backend_row(got.get(name))}{load}")
    pinned = Calibrations(be.planner, be.cache, be.config.calibration.file,
                          measure=False).pinned_file
    if pinned:  # what `calibrated` reads instead (a file measured elsewhere ranks wrongly)
        lines.append(f"policy `calibrated` predicts with the pinned file {pinned} instead "
                     "(config calibration.file or $ARBITER_CALIBRATION), not the above")
    return lines


def run(args) -> int:
    width = args.width or (shutil.get_terminal_size().columns if sys.stdout.isatty() else 80)
    print("\n".join(table_lines(rows(), width)))
    print()
    print("\n".join(calibration_lines()))
    return 0
