"""The whole report of one Arbiter (``Arbiter.report``), around its graphs' reports.

What ``from_record`` makes of each graph's record, with what is about the Arbiter as a
whole around it: the backends' statuses and versions, Dynamo's graph breaks, the advice
over every graph, the pins and excludes that applied nowhere, the graphs by kind, the
distributed broadcasts and the resources in force. Everything here reads records;
nothing compiles or runs.
"""
from __future__ import annotations

import platform
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import torch

from .._version import __version__
from ..plan.capability import MUTATES, NOT_ATEN, RANDOM, SCALAR
from ..config import Config
from ..plan.planner import Planner, safe_version
from ..plan.rules import graph_ops, names, unmatched_message
from ..run.record import DynamoGraph, GraphRecord
from ..run.resources import in_force as resources_in_force
from .advice import advise
from .from_record import distributed_report, graph_report, kind_reports
from .model import BackendStatus, GraphBreakReport, GraphReport, Report

#: A pin or exclude of the config: (``"pin"`` or ``"exclude"``, op, backend or "").
Rule = tuple[str, str, str]


def assemble(config: Config, planner: Planner, plans_only: Mapping[str, str],
             graphs: Sequence[GraphRecord], dynamo: Sequence[DynamoGraph], *,
             model: Optional[str], rules: Sequence[Rule], decomposed: Sequence[str],
             dry_run: bool, advice: bool) -> Report:
    """The report of ``graphs`` (those of the model named ``model``, or every graph when
    None: then each is labelled with its own) and of what Dynamo handed over for them
    (``dynamo``). ``plans_only``: backends a dry run planned onto that cannot run here;
    ``rules``: the config's pins and excludes; ``decomposed``: the ops the config's
    decompositions replace (named in the warnings about rules)."""
    statuses, versions = backend_statuses(planner, plans_only)
    breaks = GraphBreakReport(graphs=len(dynamo), breaks=sum(d.graph_break for d in dynamo),
                              reasons=[d.reason for d in dynamo if d.graph_break]) \
        if dynamo else None
    tips = advise([g.plan for g in graphs], planner.table, config.min_block_size,
                  (MUTATES, NOT_ATEN, RANDOM, SCALAR)) if advice else []
    owners = list(dict.fromkeys(str(g.owner) for g in graphs))
    every = {**planner.backends, **planner.variants}
    reports = [graph_report(g, every, config.pin, config.exclude_ops) for g in graphs]
    return Report(config=config.source, dry_run=dry_run, backends=statuses,
                  model=model if model is not None else ", ".join(owners) or None,
                  graph_breaks=breaks,
                  config_dump=config.model_dump(mode="json"), versions=versions,
                  advice=tips, warnings=rule_warnings(graphs, reports, rules, decomposed),
                  graphs=reports,
                  kinds=kind_reports(reports, {n for n, b in every.items() if b.inline_aten}),
                  distributed=distributed_report(reports),
                  resources={} if dry_run else resources_in_force(planner.backends.values()))


def backend_statuses(planner: Planner, plans_only: Mapping[str, str]
                     ) -> tuple[list[BackendStatus], dict[str, str]]:
    """Each backend of the chain as the report shows it, and the versions: python's,
    torch's, arbiter's and each backend's ("unavailable" when it cannot run)."""
    statuses = []
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "arbiter": __version__}
    for name, backend in planner.backends.items():
        ok = name not in planner.unavailable
        version = safe_version(backend) if ok else None
        statuses.append(BackendStatus(name=name, available=ok and name not in plans_only,
                                      reason=planner.unavailable.get(name, "")
                                      or plans_only.get(name, ""),
                                      version=version, color=backend.color,
                                      plans_only=name in plans_only))
        versions[name] = version or ("unavailable" if not ok else "unknown")
    return statuses, versions


def rule_warnings(graphs: Sequence[GraphRecord], reports: Sequence[GraphReport],
                  rules: Sequence[Rule], decomposed: Sequence[str]) -> list[str]:
    """Pins and excludes that apply to no node of ``graphs``; pins their backend did
    not take everywhere, with why (the report's ``warnings``)."""
    out = []
    seen: set[Any] = set().union(*(graph_ops(g.plan.graph_module) for g in graphs)) \
        if graphs else set()
    for rule, op, backend in rules:
        if graphs and not any(names(op, o) for o in seen):
            out.append(unmatched_message(rule, op, backend, seen, decomposed))
    for r in reports:
        for rule in r.rules:
            if rule.kind == "pin" and rule.applied < rule.nodes:
                why = "; ".join(f"{n} node(s): {w}" for w, n in rule.why_not.items())
                out.append(f"pin {rule.op} -> {rule.backend}: {rule.applied} of "
                           f"{rule.nodes} node(s) of graph {r.graph_id} on {rule.backend}"
                           f"; {why}")
    return out
