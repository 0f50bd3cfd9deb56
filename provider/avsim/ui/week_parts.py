"""The parts of the weekly-run page's document (:func:`avsim.ui.week.week_progress` puts them
together): phases, cases, shards, GPU-hours, the failed cases' page, the timeline, the run-level phases.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from avsim import urls
from avsim.artifacts import RUN_LEVEL_CASE, RunLayout
from avsim.phases.contract import NOT_RUN, RESULTS, Outcome, values
from avsim.ui import ended
from avsim.ui.progress import CASE_CLASSES, FAILURE_ORDER, RUNNING, SKIPPED, WAITING, Digest, ShardRun
from avsim.verdict import needs_attention

if TYPE_CHECKING:
    from avsim.ui.week import WeekRef

PHASE_ORDER = ("prepare", "simulate", "perceive", "evaluate", "render", "report")


def iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def phase_order(head_graphs: Mapping[str, Any] | None, names: Iterable[str]) -> list[str]:
    order: list[str] = []
    for graph in (head_graphs or {}).values():
        for phase in (graph.get("phases") or {}) if isinstance(graph, Mapping) else {}:
            if phase not in order:
                order.append(phase)
    rank = {p: i for i, p in enumerate(order or PHASE_ORDER)}
    return sorted(set(names), key=lambda p: (rank.get(p, len(rank)), p))


#: A phase's classes that spent no time of their own: not over, or never ran.
UNTIMED = (RUNNING, WAITING, Outcome.UPSTREAM_FAILED.value, NOT_RUN, SKIPPED)


def phases_doc(digests: Iterable[Digest], head_graphs: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    per: dict[str, dict[str, Any]] = {}
    for d in digests:
        for (phase, cls), (n, seconds) in d.phases.items():
            p = per.setdefault(phase, {"total": 0, "by_class": Counter(), "seconds": 0.0, "timed": 0})
            p["total"] += n
            p["by_class"][cls] += n
            if cls not in UNTIMED:
                p["seconds"] += seconds
                p["timed"] += n
    out = []
    for phase in phase_order(head_graphs, per):
        p = per[phase]
        by_class: Counter[str] = p["by_class"]
        running, waiting = by_class.get(RUNNING, 0), by_class.get(WAITING, 0)
        out.append(
            {
                "phase": phase,
                "total": p["total"],
                "done": p["total"] - running - waiting,
                "running": running,
                "waiting": waiting,
                "by_class": {k: v for k, v in sorted(by_class.items()) if k not in (RUNNING, WAITING)},
                "mean_seconds": round(p["seconds"] / p["timed"], 1) if p["timed"] else None,
            }
        )
    return out


def cases_doc(digests: Iterable[Digest], planned: int | None, stopped_because: str = "") -> dict[str, Any]:
    """Cases by status and done cases by class.

    ``attention`` counts the done cases whose class needs an engineer (:func:`avsim.verdict.needs_attention`):
    failed scenarios are results, in ``results`` with the passed cases, never in the red count.
    ``stopped_because``: the week has ended with cases not started (:func:`avsim.ui.ended.stop_reason`);
    they are ``not_started``, not ``waiting``.
    """
    status: Counter[str] = Counter()
    by_class: Counter[str] = Counter()
    for d in digests:
        for (st, cls), n in d.cases.items():
            status[st] += n
            if st == "done":
                by_class[cls] += n
    known = sum(status.values())
    waiting = status["waiting"] + max(0, (planned or 0) - known)
    ordered = {c: by_class[c] for c in CASE_CLASSES if by_class.get(c)}
    results = values(RESULTS)
    return {
        "planned": planned,
        "done": status["done"],
        "running": status["running"],
        "waiting": 0 if stopped_because else waiting,
        "not_started": waiting if stopped_because else 0,
        "stopped_because": stopped_because if waiting else "",
        "attention": sum(n for c, n in by_class.items() if needs_attention(c)),
        "results": {c: by_class.get(c, 0) for c in results},
        "by_class": ordered,
    }


def shards_doc(runs: Sequence[ShardRun], planned: int | None, ref: WeekRef, base: str) -> dict[str, Any]:
    shards = [r for r in runs if r.kind == "shard"]
    states = Counter(
        "done" if r.state in ("success", "failed") else "running" if r.state == "running" else "queued"
        for r in shards
    )
    total = planned if isinstance(planned, int) else None
    return {
        "planned": total,
        "done": states["done"],
        "running": states["running"],
        "queued": states["queued"],
        "not_started": max(0, total - len(shards)) if total is not None else None,
        "active": [
            {
                "run_id": r.run_id,
                "shard": r.index,
                "state": r.state,
                "url": urls.airflow_run(ref.shard_dag_id, r.run_id, base),
            }
            for r in shards
            if not r.finished
        ],
    }


def gpu_doc(digests: Iterable[Digest], running: tuple[int, float], plan: Mapping[str, Any]) -> dict[str, Any]:
    by_pool: dict[str, float] = {}
    for d in digests:
        for pool, seconds in d.gpu_seconds.items():
            by_pool[pool] = by_pool.get(pool, 0.0) + seconds
    held, in_flight = running
    spent = sum(by_pool.values()) + in_flight
    planned = plan.get("gpu_seconds") if plan.get("available") else None
    planned_s = float(planned) if isinstance(planned, int | float) else None
    return {
        "spent_hours": round(spent / 3600, 2),
        "ended_hours_by_pool": {k: round(v / 3600, 2) for k, v in sorted(by_pool.items())},
        "running_hours": round(in_flight / 3600, 2),
        "gpus_in_use": held,
        "planned_hours": round(planned_s / 3600, 2) if planned_s is not None else None,
        "spent_of_planned": round(spent / planned_s, 4) if planned_s else None,
    }


def ledger_outcomes(layout: RunLayout, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Any]:
    """Committed outcome records of a few (case, phase) pairs, read in parallel on object stores."""
    from avsim.ledger.store import Ledger

    if not keys:
        return {}
    ledger = Ledger(layout)

    def read(key: tuple[str, str]) -> Any:
        try:
            return ledger.outcome(*key)
        except Exception:  # an unreadable record: listed without its reason
            return None

    if ledger.is_local:
        found = [read(k) for k in keys]
    else:
        with ThreadPoolExecutor(max_workers=min(16, len(keys)), thread_name_prefix="avsim-ui") as ex:
            found = list(ex.map(read, keys))
    return dict(zip(keys, found, strict=True))


def failed_doc(
    digests: Mapping[str, Digest], ref: WeekRef, base: str, offset: int, limit: int
) -> dict[str, Any]:
    rank = {c: i for i, c in enumerate(FAILURE_ORDER)}
    rows = [f for d in digests.values() for f in d.failures]
    never = dt.datetime.min.replace(tzinfo=dt.UTC)
    rows.sort(key=lambda f: f["end_date"] or never, reverse=True)
    rows.sort(key=lambda f: rank.get(f["cls"], len(rank)))
    page = rows[offset : offset + limit]
    need = [(str(f["case_id"]), str(f["phase"])) for f in page if not f["reason"] or f["cls"] == "failed"]
    records = ledger_outcomes(ref.layout, need)
    items = []
    for f in page:
        family, phase = str(f["task_id"]).partition(".")[0], str(f["phase"])
        case_id = str(f["case_id"]) if f["case_id"] is not None else f"map index {f['map_index']}"
        rec = records.get((case_id, phase))
        cls = f["cls"]
        if cls == "failed" and rec is not None:
            cls = rec.outcome.value
        items.append(
            {
                "case_id": case_id,
                "graph": family,
                "phase": phase,
                "task_id": f["task_id"],
                "class": cls,
                "state": f["state"],
                "try_number": f["try_number"],
                "ended_at": iso(f["end_date"]),
                "reason": f["reason"] or (rec.reason if rec is not None else ""),
                "links": {
                    "task_instance": urls.airflow_task_instance(
                        ref.shard_dag_id, f["run_id"], f["task_id"], f["map_index"], base
                    ),
                    "case": urls.case_page(ref.run_key, case_id, base),
                    "artifacts": urls.phase_artifacts(ref.run_key, case_id, phase, base),
                },
            }
        )
    by_class = Counter(f["cls"] for f in rows)
    return {
        "total": len(rows),
        "by_class": dict(by_class),
        "attention": sum(n for c, n in by_class.items() if needs_attention(c)),
        "offset": offset,
        "limit": limit,
        "items": items,
    }


def timeline_doc(
    layout: RunLayout, cache: Any, deadline: Any, planned: int | None, now: dt.datetime, ended_at: Any
) -> dict[str, Any]:
    """Progress over time from the ledger (:mod:`avsim.ui.timeline`); not available when unreadable."""
    from avsim.ui.timeline import TimelineCache, timeline_doc

    try:
        found = (cache or TimelineCache(ttl=0)).get(layout, deadline, planned)
    except Exception as exc:  # the ledger unreadable now: the rest of the page still shows
        return {"available": False, "message": f"progress over time not available: {exc}"}
    return {"available": not found.empty, **timeline_doc(found, now=now, ended_at=ended_at)}


def run_phases_doc(
    layout: RunLayout,
    head_doc: Mapping[str, Any],
    tasks: Mapping[str, Mapping[str, int]],
    cases: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """The run-level phases (the weekly summary): task state and committed outcome (:func:`ended.run_phase_view`)."""
    names = list(head_doc.get("run_phases") or {}) if isinstance(head_doc.get("run_phases"), Mapping) else []
    if not names:
        return []
    records = ledger_outcomes(layout, [(RUN_LEVEL_CASE, n) for n in names])
    return [
        ended.run_phase_view(
            name,
            tasks.get(f"run_phases.{name}") or {},
            records.get((RUN_LEVEL_CASE, name)),
            cases.get("stopped_because") or "",
            int(cases.get("not_started") or 0),
        )
        for name in names
    ]
