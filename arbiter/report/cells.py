"""The pieces both text and HTML reports are made of.

Lines and tables (``Line``, ``Table``: what ``text.items`` yields), the short forms of
ops, byte counts and tensor lists, counted nouns (``plural``, from ``words``: "1 node",
"2 nodes"), and the phrases for graph kinds and the distributed section. Imports the
model only for type checking.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Union

from .words import named, plural

if TYPE_CHECKING:
    from .model import DistributedReport, KindReport


class Line:
    """A line of text; parts are plain strings or (style, text) pairs (a rich style)."""

    def __init__(self, *parts: Union[str, tuple[str, str]]):
        self.parts = [p for p in parts if p]

    def plain(self) -> str:
        return "".join(p if isinstance(p, str) else p[1] for p in self.parts)

    def markup(self) -> str:
        from rich.markup import escape  # data, not markup: "[at file.py:12]" prints as is

        return "".join(escape(p) if isinstance(p, str) else f"[{p[0]}]{escape(p[1])}[/{p[0]}]"
                       for p in self.parts)


#: A table cell: text, styled text, or entries (rich: one a line; plain: joined by ", ").
Cell = Union[str, Line, list]


@dataclass
class Col:
    name: str
    right: bool = False  # justified right (numbers)
    wrap: bool = False  # rich: long cells fold onto more lines (else no_wrap)
    max_width: Optional[int] = None
    ratio: Optional[int] = None


@dataclass
class Table:
    title: str
    columns: list[Col]
    rows: list[list[Cell]] = field(default_factory=list)
    expand: bool = True


Item = Union[Line, Table]



def short_op(op: str) -> str:
    return op.removeprefix("aten.").removesuffix(".default")


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def shapes_summary(ts) -> str:
    """The first data tensor's shape (frozen weights, `constant`, come last) and how many
    more: the table stays one line a partition."""
    if not ts:
        return "-"
    first = next((t for t in ts if t.source != "constant"), ts[0])
    text = "x".join(map(str, first.shape)) or "()"
    return text + (f" +{len(ts) - 1}" if len(ts) > 1 else "")


def ops_text(ops: dict[str, int], most: Optional[int] = None) -> str:
    """``opxN, op2, ...``, most nodes first; with ``most``, the first ``most`` and how many
    ops more."""
    items = sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = items if most is None else items[:most]
    text = ", ".join(f"{short_op(k)}x{v}" if v > 1 else short_op(k) for k, v in shown)
    return text + (f", +{plural(len(items) - most, 'op')}" if most is not None and
                   len(items) > most else "")


# -- per graph kind, and the distributed section -------------------------------------
def kind_where(k: KindReport) -> str:
    """``onnxruntime 398 in 2, eager 14 in 5``: nodes and partitions per backend."""
    return ", ".join(kind_entries(k)) or "-"


def kind_entries(k: KindReport) -> list[str]:
    return [f"{b.backend} {b.nodes} in {b.partitions}" + ("" if b.compiled else " (plan)")
            for b in k.backends]


def kind_fell_back(k: KindReport) -> str:
    if not k.fell_back_partitions:
        return "-" if not k.fallbacks else f"- ({plural(k.fallbacks, 'fallback')})"
    return (f"{plural(k.fell_back_nodes, 'node')} in {k.fell_back_partitions}"
            f" ({plural(k.fallbacks, 'fallback')})")


def distributed_summary(d: DistributedReport) -> str:
    """``rank 0 of 2: 3 graphs decided here (policy measure) and broadcast``."""
    who = (f"rank {d.rank}" if d.rank is not None else "this rank") + \
        (f" of {d.world_size}" if d.world_size is not None else "")
    what = []
    if d.sent:
        what.append(f"{plural(d.sent, 'graph')} decided here (policy measure) and broadcast")
    if d.received:
        what.append(f"{plural(d.received, 'graph')} took rank 0's decision, untimed")
    return f"{who}: " + "; ".join(what)


def distributed_entries(d: DistributedReport) -> list[str]:
    """One entry per broadcast graph, then the graphs not broadcast."""
    out = [f"graph {b.graph_id} ({b.kind}{', ' + b.model if b.model else ''}): "
           f"{named(b.chosen) if b.chosen else 'not decided yet'} ({b.role})"
           for b in d.broadcast]
    if d.not_broadcast:
        out.append("not broadcast (decided alike on every rank, or not called yet): graph "
                   + ", ".join(map(str, d.not_broadcast)))
    return out


#: An estimate this many times off the candidate's measured time is said to be.
ESTIMATE_OFF = 2.0


def estimates_text(estimates: dict, measured: dict) -> str:
    """A graph's estimates (candidate -> ms), three significant digits; one that its
    candidate's measured time contradicts (off by ``ESTIMATE_OFF`` or more) says so
    beside it, so a prediction is never read as a measurement."""
    parts = []
    for k, v in estimates.items():
        text = f"{k} ~{v:.3g} ms"
        got = measured.get(k)
        if got and v and max(v / got, got / v) >= ESTIMATE_OFF:
            text += f" (measured {got:.3g} ms: {max(v / got, got / v):.0f}x off)"
        parts.append(text)
    return ", ".join(parts)


def sizes_vary(p: Any) -> bool:
    """Whether a partition's traffic has no one size: some tensor it reads or writes is
    symbolic (its bytes are None), so a byte count would read 0 B."""
    return any(t.bytes is None for t in (*p.inputs, *p.outputs))


def partition_notes(p: Any) -> list[str]:
    """What a partition's table row has no room for: copies at its boundary, its NaN/inf
    guard, the integer dtypes it runs quantized, verify's checks, first-use checks, the
    times measured per backend (the text report's ``partition N:`` line, and the notes
    under the HTML page's table)."""
    notes = []
    if p.copies or p.restride_copies:
        notes.append(f"copies {p.copies} at the boundary, {p.restride_copies} restrides")
    if p.nonfinite_guard:
        notes.append(f"inputs checked for NaN/inf ({', '.join(p.nonfinite_guard[:4])}"
                     f"{', ...' if len(p.nonfinite_guard) > 4 else ''} differ there)"
                     + (f", {plural(p.nonfinite_eager_calls, 'call')} ran in eager"
                        if p.nonfinite_eager_calls else ""))
    if p.quantized:
        notes.append(f"quantized ({', '.join(p.quantized)}): {p.backend} runs the "
                     "quantize/dequantize nodes with the layers they feed")
    if p.verify_checks:
        err = f", max error {p.verify_max_error:.2e}" if p.verify_max_error is not None else ""
        notes.append(f"verified {p.verify_checks}x against eager{err}")
    notes += [c.line() for c in p.first_use]
    if p.measured_ms:
        notes.append("measured " + ", ".join(f"{b} {ms:.3f} ms"
                                             for b, ms in p.measured_ms.items()))
    return notes


def bytes_text(p: Any) -> str:
    """A partition's bytes in/out, or that they vary with the symbols."""
    if sizes_vary(p):
        return "varies (symbolic)"
    return f"{human_bytes(p.bytes_in + p.graph_input_bytes)}/{human_bytes(p.bytes_out)}"
