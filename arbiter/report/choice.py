"""Why a graph runs where it does, said in words, for the text report and the HTML page.

A policy that chose (``cost``, ``measure``, ``calibrated``, or any plan timed against eager
under config ``against_eager``) leaves in the graph's report the label of what it chose,
each candidate's measured and estimated milliseconds and how it timed them. ``reason``
turns them into one sentence: which ran and on what grounds ("eager was measured faster
than the plan: 0.98 ms against 1.46 ms"), candidates named in words (``named``: the
label ``priority`` is the config-order plan, ``only X`` is X alone), what was not measured
said so, never a dash. Both renderings print ``choice_line``, so they say the same.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from .cells import estimates_text
from .model import StepReport
from .words import ONLY, named

if TYPE_CHECKING:
    from .model import GraphReport


def ms(v: float) -> str:
    """Milliseconds to about three digits: ``0.98``, ``51.4``, ``131``."""
    return f"{v:.3f}" if v < 0.1 else f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 \
        else f"{v:.0f}"


def _groups(values: dict[str, float]) -> list[tuple[list[str], float]]:
    """Labels of one candidate (equal plans share every number) together, in order."""
    out: dict[float, list[str]] = {}
    for k, v in values.items():
        out.setdefault(v, []).append(k)
    return [(labels, v) for v, labels in out.items()]


def _who(labels: list[str]) -> str:
    return named(labels[0]) + "".join(f" (the same as {named(k)})" for k in labels[1:])


def _fallback(g: GraphReport) -> str:
    """The last backend of the graph's chains (eager ATen): ``only`` it is eager whole."""
    return next((p.chain[-1] for p in g.partitions if p.chain), "")


def _estimates(g: GraphReport) -> str:
    """Each candidate's estimate, named in words, one that its measured time contradicts
    said so (``estimates_text``)."""
    groups = _groups(g.estimates_ms)
    return estimates_text({_who(ks): v for ks, v in groups},
                          {_who(ks): g.candidates_ms.get(ks[0]) for ks, _ in groups})


def _measured(g: GraphReport) -> str:
    """The sentence for a choice measured on the first call (the policy's own plan is
    the first candidate timed)."""
    from ..plan.policy import EAGER_MARGIN

    times = {k: v for k, v in g.candidates_ms.items() if v is not None}
    spread = g.candidates_spread_ms

    def at(labels: list[str], v: float) -> str:
        q = next((spread[k] for k in labels if k in spread), None)
        return f"{ms(v)} ms" + (f" [{ms(q[0])}-{ms(q[1])}]" if q else "")

    groups = _groups(times)
    mine = next(((ks, v) for ks, v in groups if g.chosen in ks), None)
    if mine is None:  # the installed candidate was found by the search (mixed, refined)
        return f"{named(g.chosen)} ran, found while timing; measured: " + \
            ", ".join(f"{_who(ks)} {at(ks, v)}" for ks, v in groups)
    rest = sorted((x for x in groups if x[0] is not mine[0]), key=lambda x: x[1])
    if not rest:
        return f"{_who(mine[0])} ran, measured at {at(*mine)}; nothing else was measured"
    eager = _fallback(g)
    if g.against_eager and len(groups) == 2 and ONLY + eager in times:
        # the plan against eager whole: say which was faster, by the times
        plan = "the plan" if g.chosen == next(iter(times)) else None
        who, them = (plan, eager) if plan else (eager, "the plan")
        if mine[1] <= rest[0][1]:
            return f"{who} was measured faster than {them}: {at(*mine)} against " \
                   f"{at(*rest[0])}"
        return (f"{who} kept: {them} was measured at {at(*rest[0])} against its "
                f"{at(*mine)}, not faster by more than {EAGER_MARGIN:.0%}")
    against = ", ".join(f"{at(ks, v)} for {_who(ks)}" for ks, v in rest)
    if mine[1] <= rest[0][1]:
        return f"{_who(mine[0])} was measured fastest: {at(*mine)} against {against}"
    why = (f"eager must beat the plan by more than {EAGER_MARGIN:.0%}" if g.against_eager
           else "the faster ones were refused for accuracy or were not kept")
    return f"{_who(mine[0])} kept at {at(*mine)} against {against}: {why}"


def _estimated(g: GraphReport) -> str:
    """The sentence for a choice by estimate (nothing measured yet, or a policy that
    does not measure)."""
    calibrated = g.policy == "calibrated"
    how = "predicted" if calibrated else "estimated"
    source = " from this machine's calibration" if calibrated else ""
    groups = _groups(g.estimates_ms)
    if not g.chosen:  # policy measure before its first call: the plan runs until then
        return (f"the config-order plan runs until the first call times "
                f"{len(groups)} candidates ({how}: {_estimates(g)})")
    mine = next(((ks, v) for ks, v in groups if g.chosen in ks), None)
    if mine is None:
        return f"{named(g.chosen)} ran"
    rest = sorted((x for x in groups if x[0] is not mine[0]), key=lambda x: x[1])
    if not rest:
        return f"{_who(mine[0])}, {how} at ~{ms(mine[1])} ms{source}, was the only candidate"
    return (f"{_who(mine[0])} was {how} fastest{source}: ~{ms(mine[1])} ms against "
            + ", ".join(f"~{ms(v)} ms for {_who(ks)}" for ks, v in rest))


def reason(g: GraphReport) -> str:
    """Why ``g`` runs where it does, in words; "" when its policy had no choice to make."""
    if not (g.chosen or g.candidates_ms or g.estimates_ms):
        return ""
    times = {k: v for k, v in g.candidates_ms.items() if v is not None}
    if g.chosen and times:
        out = _measured(g)
        left = [k for k, v in g.candidates_ms.items() if v is None]
        if left:
            out += "; not measured: " + ", ".join(named(k) for k in left)
        if g.measure_rounds:
            out += (f"; {g.measure_rounds} interleaved rounds, winner "
                    + ("apart from the rest" if g.measure_confident
                       else "not apart from the rest (a close call)"))
        est = _estimates(g)
        return out + (f"; estimated: {est}" if est else "")
    if g.estimates_ms:
        return _estimated(g)
    return f"{named(g.chosen)} ran"


def choice_line(g: GraphReport) -> str:
    """``policy P[, timed against eager]: <reason>[ (rank 0: broadcast)]``, or ""."""
    why = reason(g)
    if not why:
        return ""
    return (f"policy {g.policy}" + (", timed against eager" if g.against_eager else "")
            + f": {why}" + (f" ({g.measure_broadcast})" if g.measure_broadcast else ""))


def not_chosen_lines(g: GraphReport) -> list[str]:
    """The timed candidates not chosen whose partitions fell back while timed (a backend
    failed there, whichever placement won)."""
    return [f"not chosen, fell back while timed: {named(label)}: " + "; ".join(lines)
            for label, lines in g.candidate_fallbacks.items()]


def step_report(step: Any) -> Optional[StepReport]:
    """A training graph's ``StepRecord`` (run/step.py) for the report; None without one."""
    if step is None:
        return None
    return StepReport(route=step.route, reason=step.reason, ms=dict(step.ms),
                      samples=step.samples)


def step_line(g: GraphReport) -> str:
    """``step: <what runs the forward and its backward>: <why>``, or "" (not training)."""
    s = g.step
    if s is None:
        return ""
    if s.route == "pending":
        return "step: the compiled plan runs until its backward is compiled and the step " \
               "is checked against Dynamo's graph in eager"
    if s.route == "trial":
        return "step: the compiled plan and Dynamo's graph in eager alternate on these " \
               "calls, timed"
    who = "Dynamo's graph in eager (these partitions no longer run)" \
        if s.route == "dynamo eager" else "the compiled plan"
    return f"step: {who}: {s.reason}" if s.reason else f"step: {who}"
