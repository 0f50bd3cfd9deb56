"""The small documents a weekly run keeps in the artifact store, read for the page, defensively.

Each reader returns a JSON-ready dict with ``available``: False (and why) when the document does
not exist (yet) or cannot be read, so the page shows "not available" instead of failing. The why
names the document, never its storage path: the page is for engineers watching a week, and the
store's layout is in docs/design.md.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from avsim.artifacts import RunLayout, breaker_uri
from avsim.contracts import RunDescriptor
from avsim.report.cases import parse_time

log = logging.getLogger(__name__)

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def read_doc(uri: str) -> dict[str, Any] | None:
    """A JSON object from the artifact store, or None when absent or not a JSON object."""
    from avsim.storage import path

    try:
        doc = json.loads(path(uri).read_text())
    except (FileNotFoundError, ValueError, OSError):
        return None
    return doc if isinstance(doc, dict) else None


def run_descriptor(value: Any, where: str) -> RunDescriptor | None:
    """The run descriptor ``prepare`` pushed (its XCom ``run``, ``where``), parsed as the contract; None
    when there is none yet, or when it does not parse (logged, naming the fields): the page then
    derives the run key and takes the configured root, as before ``prepare`` ran."""
    if not isinstance(value, Mapping) or not value:
        return None
    from pydantic import ValidationError

    try:
        return RunDescriptor.model_validate(value)
    except ValidationError as exc:
        fields = ", ".join(".".join(str(p) for p in e["loc"]) + f" ({e['msg']})" for e in exc.errors())
        log.warning("the run descriptor of %s does not parse, ignored: %s", where, fields)
        return None


def _missing(what: str) -> dict[str, Any]:
    return {"available": False, "message": f"no {what} yet"}


def head(layout: RunLayout) -> dict[str, Any]:
    """The run's manifest head: run (name, week, deadline), build, case count."""
    doc = read_doc(layout.head_uri)
    if doc is None:
        return _missing("manifest snapshot")
    run = doc.get("run") if isinstance(doc.get("run"), Mapping) else {}
    assert isinstance(run, Mapping)
    build = run.get("build") if isinstance(run.get("build"), Mapping) else {}
    assert isinstance(build, Mapping)
    return {
        "available": True,
        "name": run.get("name"),
        "iso_week": run.get("iso_week"),
        "run_class": run.get("run_class"),
        "deadline": run.get("deadline"),
        "build_id": build.get("build_id"),
        "image": build.get("image"),
        "case_count": doc.get("case_count"),
    }


def plan(layout: RunLayout) -> dict[str, Any]:
    """What the run plans (``manifest/plan.json``): cases, phases, GPU/CPU seconds, critical path."""
    doc = read_doc(layout.plan_uri)
    if doc is None:
        return _missing("plan")
    keys = (
        "cases",
        "phases",
        "gpu_seconds",
        "cpu_seconds",
        "critical_path_seconds",
        "deadline",
        "canary_cases",
    )
    return {"available": True, **{k: doc.get(k) for k in keys}}


def canary(
    layout: RunLayout, head_doc: Mapping[str, Any] | None, plan_doc: Mapping[str, Any]
) -> dict[str, Any]:
    """The canary gate's decision; ``off`` when the week has no canary stage, ``waiting`` before it decides."""
    doc = read_doc(layout.canary_gate)
    if doc is None:
        off = canary_off(head_doc, plan_doc)
        if off:
            return {"available": False, "state": "off", "message": f"off for this week: {off}"}
        return {"available": False, "state": "waiting", "message": "no canary gate decision yet"}
    keys = ("state", "build_id", "digest", "cases", "finished", "failures", "rate", "threshold")
    return {"available": True, **{k: doc.get(k) for k in (*keys, "decided_at", "message")}}


def canary_off(head_doc: Mapping[str, Any] | None, plan_doc: Mapping[str, Any]) -> str:
    """Why the week has no canary stage (the manifest disables it, or the week is canary-sized), else ""."""
    run = (head_doc or {}).get("run")
    spec = run.get("canary") if isinstance(run, Mapping) else None
    if isinstance(spec, Mapping) and spec.get("enabled") is False:
        return "the manifest disables the canary (run.canary.enabled: false)"
    if plan_doc.get("available") and plan_doc.get("canary_cases") == 0:
        cases = plan_doc.get("cases")
        least = spec.get("min_cases") if isinstance(spec, Mapping) else None
        size = f"{cases:,} cases" if isinstance(cases, int) else "its cases"
        floor = f" (canary min_cases {least})" if isinstance(least, int) else ""
        return f"the week's {size} are no more than a canary{floor}, so they all run at once"
    return ""


def deadline(layout: RunLayout, fallback_deadline: str | None) -> dict[str, Any]:
    """The deadline tracker's newest estimate; without one, the deadline from the manifest."""
    doc = read_doc(layout.deadline_latest)
    if doc is None:
        out = _missing("finish estimate")
        out["deadline"] = fallback_deadline
        out["verdict"] = finish_verdict(None)
        return out
    keys = ("at", "estimated_finish", "deadline", "remaining_gpu_seconds", "gpus_in_use", "gpus_needed")
    out = {"available": True, **{k: doc.get(k) for k in (*keys, "action")}}
    out["deadline"] = out["deadline"] or fallback_deadline
    late = seconds_between(out.get("deadline"), out.get("estimated_finish"))
    out["seconds_late"] = late
    out["verdict"] = finish_verdict(late)
    return out


def finish_verdict(seconds_late: float | None) -> dict[str, str]:
    """How the estimated finish stands against the deadline, as the page prints it.

    ``state``: ``none`` (no estimate yet: the tracker has not run, or could not estimate, e.g. no
    GPU phase running), ``late``, ``early`` or ``on_time`` (within half a minute, so the page never
    prints "-0 min"). ``text``: the words, with whole minutes.
    """
    if seconds_late is None:
        return {"state": "none", "text": "no estimate yet"}
    minutes = round(abs(seconds_late) / 60)
    if minutes == 0:
        return {"state": "on_time", "text": "on time"}
    if seconds_late > 0:
        return {"state": "late", "text": f"{minutes:,} min late"}
    return {"state": "early", "text": f"{minutes:,} min early"}


def seconds_between(start: Any, end: Any) -> float | None:
    a, b = parse(start), parse(end)
    return round((b - a).total_seconds(), 1) if a and b else None


parse = parse_time


def breaker(root: str, image: str | None, gate_digest: str | None) -> dict[str, Any]:
    """The circuit breaker of the run's simulator build, keyed by its image digest."""
    candidates: list[str] = []
    for value in (gate_digest, image):
        if value:
            m = _DIGEST.search(str(value))
            digest = m.group(0) if m else str(value)
            candidates += [digest, digest.removeprefix("sha256:")]
    tried: list[str] = []
    for digest in dict.fromkeys(candidates):
        uri = breaker_uri(root, digest)
        tried.append(uri)
        doc = read_doc(uri)
        if doc is not None:
            keys = ("digest", "build_id", "state", "failures", "finished", "threshold", "opened_at", "reason")
            return {"available": True, **{k: doc.get(k) for k in keys}}
    where = "" if tried else " (no image digest in the manifest)"
    return {"available": False, "state": "closed", "message": f"no breaker record: never tripped{where}"}


def repairs(layout: RunLayout) -> list[dict[str, Any]]:
    """The repairs in place of the run's failed shard runs (a cleared ``shards`` task), oldest first."""
    from avsim.ledger.store import Ledger

    return [
        {k: r.get(k) for k in ("shard", "shard_run_id", "parent_try", "at", "cleared")}
        for r in Ledger(layout).repairs()
    ]


def triage(layout: RunLayout, base: str = "") -> dict[str, Any]:
    """The week's triage for the page: counts per verdict, each triaged case with a link to its page."""
    from avsim import urls
    from avsim.triage.store import triage_uri

    doc = read_doc(triage_uri(layout))
    if not doc:
        return {"available": False, "message": "no triage yet: it runs once every case has run once"}
    cases = [
        {
            "case_id": c.get("case_id"),
            "verdict": c.get("verdict"),
            "failing_phase": c.get("failing_phase"),
            "reason": c.get("reason"),
            "url": urls.case_page(layout.run_key, str(c.get("case_id")), base),
        }
        for c in doc.get("cases") or []
    ]
    return {
        "available": True,
        "counts": doc.get("counts") or {},
        "message": doc.get("message") or "",
        "cases": cases,
    }
