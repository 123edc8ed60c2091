"""A probe's findings written into a manifest: the rule for entries, dtypes and outputs.

See ``arbiter.probe.opinfo`` for what a probe finds; here is what the manifest becomes:
an op keeps the dtypes it allowed before minus those tried and never passed, plus those
that passed (``manifest_dtypes``); an op that passed becomes ``verified: probed`` with
``probed_dtypes``, less the dtypes in which a sample of it alone gave wrong numbers
(other arguments passed: allowed, not verified; ``probe.unverified``, kept while the
versions are the same); an op whose samples alone failed in every dtype it allowed is
removed; outputs found wrong one by one (unreturned, or saved by a training forward) become
``wrong_outputs``; ops a training graph passed (``--grad``) get ``training_dtypes``; the
``probe:`` record adds up runs of named OpInfos (``--ops``) and starts again at a run of
every OpInfo (a training probe's counts apart: ``training_*``).
A build-only probe (``ProbeResult.mode == "build"``) writes ``verified: built`` and
``built_dtypes`` instead (an entry already ``probed`` stays so: running says more).
"""
from __future__ import annotations

import datetime
from collections.abc import Iterable

from ..manifest import DTYPES, Defaults, parse_manifest
from ..ops import packet_name
from .result import ProbeResult


def manifest_dtypes(allowed: Iterable[str], probed: Iterable[str],
                    dropped: Iterable[str]) -> tuple[list[str], list[str]]:
    """(dtypes the entry allows, dtypes that passed) after a probe: what it allowed before
    (``allowed``) minus ``dropped`` (tried, never passed), plus every dtype that passed
    (``probed``: this probe's and earlier ones'). Dtypes a manifest cannot name are left
    out; the order is manifest.DTYPES'."""
    order = list(DTYPES)
    probed = {d for d in probed if d in DTYPES}
    keep = (set(allowed) - set(dropped)) | probed
    return sorted(keep, key=order.index), sorted(probed, key=order.index)


def dynamic_update(doc: dict, result: ProbeResult) -> dict:
    """A manifest document updated with a dynamic probe's findings: ``dynamic: true`` on
    the entries of ops that passed at two sizes through one artifact; ``dynamic: false``
    on those it keeps static (``ProbeResult.dynamic_refused``); ``probe.dynamic_*``
    records the run. Dtypes are not touched."""
    ops: dict = dict(doc.get("ops") or {})
    failed = result.dynamic_refused()
    for op in sorted(result.dynamic_passed | set(failed)):
        key = op if op in ops else packet_name(op)
        if key not in ops:  # only the wildcard "*" took it: nothing to mark
            continue
        # an overload's own entry (a packet's entry speaks for every overload)
        ops[op] = {**dict(ops[key] or {}), "dynamic": op not in failed}
    out = dict(doc)
    out["ops"] = dict(sorted(ops.items()))
    c = result.counts()
    prev = dict(doc.get("probe") or {})
    same = (prev.get("torch") == str(result.torch_version)
            and prev.get("backend_version") == str(result.backend_version))
    run = f"{result.opinfos_done}/{result.opinfos_total}"
    kept_failed = {op: why for op, why in (prev.get("dynamic_failed") or {}).items()
                   if op not in result.dynamic_passed}
    probe = {**prev,
             "date": datetime.date.today().isoformat(),
             "torch": str(result.torch_version),
             "backend_version": str(result.backend_version),
             "dynamic_opinfos": f"{prev['dynamic_opinfos']} + {run}"
             if same and prev.get("dynamic_opinfos") else run,
             "dynamic_samples_passed": (prev.get("dynamic_samples_passed", 0) if same else 0)
             + c["passed"],
             "dynamic_samples_failed": (prev.get("dynamic_samples_failed", 0) if same else 0)
             + c["failed"],
             "dynamic_failed": dict(sorted({**kept_failed, **failed}.items())),
             "dynamic_partial": dict(sorted({
                 **{op: why for op, why in (prev.get("dynamic_partial") or {}).items()
                    if op not in failed and op not in result.dynamic_passed},
                 **{op: why for op, why in result.dynamic_partial.items()
                    if op not in failed}}.items()))}
    if not same:  # the dtype record belongs to other versions: start it again
        for k in ("dtypes_tried", *COUNTS, *(f"training_{k}" for k in COUNTS)):
            probe.pop(k, None)
    out["probe"] = probe
    return out


def manifest_update(doc: dict, result: ProbeResult) -> dict:
    """A manifest document (as loaded from YAML) updated with a probe's findings (see the
    module docstring). Applying the same result twice, or results of disjoint ``--ops``
    runs one after the other, gives the same entries as applying them once: earlier
    ``probed_dtypes`` count as passed, and dropped dtypes are no longer allowed."""
    ops: dict = dict(doc.get("ops") or {})
    defaults = Defaults.model_validate(doc.get("defaults") or {}).dtypes
    built = result.mode == "build"
    passed_key = "built_dtypes" if built else "probed_dtypes"
    # An op is removed only when no dtype it allowed is left: failing in the dtypes tried
    # says nothing of the others (a float16-only probe once removed prod.dim_int, which
    # float32 never tried). An op that passed, now or earlier, always keeps those dtypes.
    removed: dict[str, str] = {}
    dropped_now: dict[str, dict] = {}
    # A probe of other OpInfos (--ops) on the same versions adds to the record. The counts
    # start again on other versions; why ops are missing or narrowed (`failed`,
    # `dtypes_dropped`) stays as long as they are.
    kept = prev = doc.get("probe") or {}
    same = (prev.get("torch") == str(result.torch_version)
            and prev.get("backend_version") == str(result.backend_version)
            and prev.get("mode", "run") == result.mode)
    if not same:
        prev = {}
    # a dtype some sample of the op alone computed wrongly is not verified on these
    # versions, whatever other samples (other arguments) passed
    unverified = _merge(prev.get("unverified", {}), result.wrong_alone)
    for op in sorted(set(result.passed) | set(result.failed_dtypes)):
        # an overload: a probe verifies overloads, not whole packets
        key = op if op in ops else packet_name(op)
        if key not in ops:  # only the wildcard "*" took it: nothing to narrow
            continue
        before = ops[key] or {}  # `op:` with no value in YAML is an entry of defaults
        entry = dict(before)
        # a dtype that ran before is not dropped by a failed build (nor one built before);
        # a failed run drops a dtype that was only built
        passed = (result.passed.get(op, set()) | set(entry.get("probed_dtypes") or ())
                  | set(entry.get("built_dtypes") or () if built else ()))
        dropped = {d: why for d, why in result.dropped(op).items() if d not in passed}
        allowed = defaults if entry.get("dtypes") is None else entry["dtypes"]
        dtypes, _ = manifest_dtypes(allowed, passed, dropped)
        probed = manifest_dtypes((), result.passed.get(op, set())
                                 | set(entry.get(passed_key) or ()), ())[1]
        if not built:
            probed = [d for d in probed if d not in unverified.get(op, ())]
            if not probed and entry.get("verified") == "probed":  # no longer verified
                entry.pop("probed_dtypes", None)
                entry.pop("verified")
                if entry.get("built_dtypes"):
                    entry["verified"] = "built"
        if not dtypes and op in result.failed:  # failed alone in every dtype it allowed
            dname, reason = next(iter(result.failed[op].items()))
            removed[op] = f"{dname}: {reason}"[:300]
            ops.pop(op, None)
            continue
        if "dtypes" in entry or set(dtypes) != set(defaults):
            entry["dtypes"] = dtypes
        if probed:
            if not (built and entry.get("verified") == "probed"):
                entry["verified"] = "built" if built else "probed"
            entry[passed_key] = probed
        trained = [d for d in manifest_dtypes((), result.trained.get(op, set())
                                              | set(entry.get("training_dtypes") or ()), ())[1]
                   if d in probed]
        if trained:
            entry["training_dtypes"] = trained
        else:
            entry.pop("training_dtypes", None)
        # earlier findings stay unless this probe passed that output in that dtype
        passed_outputs = result.outputs_passed.get(op, set())
        wrong: dict = {}
        for k, per in (entry.get("wrong_outputs") or {}).items():
            per = {d: why for d, why in per.items() if (int(k), d) not in passed_outputs}
            if per:
                wrong[int(k)] = per
        for k, per in result.wrong_outputs(op).items():
            wrong.setdefault(k, {}).update(per)
        wrong = {k: {d: wrong[k][d] for d in DTYPES if d in wrong[k]} for k in wrong}
        if wrong:
            entry["wrong_outputs"] = dict(sorted(wrong.items()))
        else:
            entry.pop("wrong_outputs", None)
        dropped_now[op] = {d: why for d, why in dropped.items() if d in allowed}
        if key == op or entry != before:
            ops[op] = entry
    out = dict(doc)
    out["ops"] = dict(sorted(ops.items()))
    out["probe"] = {
        "date": datetime.date.today().isoformat(),
        "torch": str(result.torch_version),
        "backend_version": str(result.backend_version),
        **({"mode": "build"} if built else {}),
        "dtypes_tried": sorted(set(prev.get("dtypes_tried", [])) | set(result.dtypes),
                               key=list(DTYPES).index),
        # the inference probe's counts, then the training probe's (--grad)
        **_counts(prev, result, ""),
        **_counts(prev, result, "training_"),
        "failed": {op: why for op, why in sorted({**kept.get("failed", {}), **removed}.items())
                   if op not in out["ops"]},  # one put back (by hand) and passed is not
        "dtypes_dropped": _merge_dropped(kept.get("dtypes_dropped", {}), dropped_now,
                                         out["ops"]),
        **({"unverified": {op: per for op, per in unverified.items() if op in out["ops"]}}
           if unverified else {}),
    }
    if same:  # a dynamic probe's record (dynamic_update) on the same versions stays
        out["probe"].update({k: v for k, v in prev.items() if k.startswith("dynamic_")})
    return out


#: The counts of a probe's record, each kept apart for the inference probe (no prefix)
#: and the training probe (``training_``).
COUNTS = ("opinfos", "samples_passed", "samples_failed", "samples_skipped")


def _counts(prev: dict, result: ProbeResult, prefix: str) -> dict:
    """The record's counts of one kind of probe: this one's added to ``prev``'s when it is
    that kind, ``prev``'s as they were otherwise (none when empty). A probe of every
    OpInfo replaces that kind's counts: it ran again what they counted."""
    if prefix != ("training_" if result.grad else ""):
        return {f"{prefix}{k}": prev[f"{prefix}{k}"] for k in COUNTS if f"{prefix}{k}" in prev}
    if result.every_opinfo:
        prev = {}
    c = result.counts()
    run = f"{result.opinfos_done}/{result.opinfos_total}"
    before = prev.get(f"{prefix}opinfos")
    return {f"{prefix}opinfos": f"{before} + {run}" if before else run,
            **{f"{prefix}samples_{s}": prev.get(f"{prefix}samples_{s}", 0) + c[s]
               for s in ("passed", "failed", "skipped")}}


def _merge(prev: dict, new: dict) -> dict:
    """op -> {dtype: why}, ``new``'s reasons over ``prev``'s, sorted."""
    order = list(DTYPES).index
    return {op: dict(sorted({**prev.get(op, {}), **new.get(op, {})}.items(),
                            key=lambda kv: order(kv[0]) if kv[0] in DTYPES else len(DTYPES)))
            for op in sorted(set(prev) | set(new))}


def _merge_dropped(prev: dict, new: dict, ops: dict) -> dict:
    """op -> {dtype: why} over this probe and earlier ones, less what the op allows now
    (a later probe passed it) and ops no longer in the manifest."""
    merged: dict = {}
    for op in sorted(set(prev) | set(new)):
        if op not in ops:
            continue
        allowed = ops[op].get("dtypes")
        per = {**prev.get(op, {}), **new.get(op, {})}
        per = {d: why[:200] for d, why in per.items() if allowed is not None and d not in allowed}
        if per:
            merged[op] = dict(sorted(per.items(), key=lambda kv: list(DTYPES).index(kv[0])))
    return merged


def write_manifest(path, result: ProbeResult, out=None) -> str:
    """Rewrite the manifest at ``path`` (or write to ``out``) with a probe's findings;
    returns the new text."""
    from pathlib import Path

    import yaml


    path = Path(path)
    text = path.read_text()
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    update = dynamic_update if result.dynamic else manifest_update
    doc = update(yaml.safe_load(text) or {}, result)
    body = yaml.safe_dump(doc, sort_keys=False, width=100, default_flow_style=None)
    new = header + body
    parse_manifest(new, str(path), backend=result.backend)  # never write what cannot load
    Path(out or path).write_text(new)
    return new


