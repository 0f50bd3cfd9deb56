"""One row per case: what ``cases.csv`` holds and what the week-over-week comparison reads back.

A row is built from a case of a shard summary (:class:`avsim.contracts.week.CaseSummary`) and the
run's head (for the GPUs of each phase); the scenario of the case comes from the shard's case list,
which the weekly run wrote when it cut the week into shards.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from avsim.contracts.week import CaseSummary, PhaseSummary
from avsim.phases.contract import ENDED as ENDED_OUTCOMES
from avsim.phases.contract import Outcome

#: The fixed columns of ``cases.csv``; then one ``<phase>_seconds`` column per phase seen in the week.
BASE_COLUMNS = (
    "case_id",
    "graph",
    "scenario_uri",
    "scenario_version",
    "outcome",
    "failing_phase",
    "failing_class",
    "reason",
    "attempts",
    "retried_phases",
    "seconds",
    "gpu_seconds",
    "started_at",
    "finished_at",
    "shard",
)


def parse_time(value: Any) -> dt.datetime | None:
    """An ISO timestamp (or a datetime) as an aware datetime (naive ones are UTC), or None."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if not value:
        return None
    try:
        when = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def phase_gpus(head: Mapping[str, Any], graph: str, phase: str, entry: PhaseSummary) -> int:
    """GPUs the phase held: the summary's own ``gpus`` when it has it, else the graph's resources."""
    if entry.gpus is not None:
        return entry.gpus
    graphs = head.get("graphs")
    spec = graphs.get(graph, {}).get("phases", {}).get(phase, {}) if isinstance(graphs, Mapping) else {}
    resources = spec.get("resources", {}) if isinstance(spec, Mapping) else {}
    try:
        return int(resources.get("gpus", 0) or 0)
    except (TypeError, ValueError):
        return 0


def case_row(
    case: CaseSummary,
    head: Mapping[str, Any],
    failing: tuple[str, PhaseSummary | None],
    shard: int | None,
) -> dict[str, Any]:
    """The row of one case of a shard summary. ``failing``: its failing phase and that phase's entry."""
    graph = case.graph
    attempts = retried = 0
    seconds = gpu_seconds = 0.0
    durations: dict[str, float | None] = {}
    starts: list[dt.datetime] = []
    ends: list[dt.datetime] = []
    for name, entry in case.phases.items():
        n = entry.attempts
        attempts += n
        retried += 1 if n > 1 else 0
        took = entry.duration_seconds
        if entry.outcome in ENDED_OUTCOMES and took is not None:
            durations[name] = round(took, 3)
            seconds += took
            gpu_seconds += took * phase_gpus(head, graph, name, entry)
        else:
            durations[name] = None
        for stamp, into in ((entry.started_at, starts), (entry.ended_at, ends)):
            when = parse_time(stamp)
            if when is not None:
                into.append(when)
    phase, failed_entry = failing
    failed = case.outcome is not Outcome.PASSED
    return {
        "case_id": case.case_id,
        "graph": graph,
        "scenario_uri": "",
        "scenario_version": "",
        "outcome": case.outcome_name,
        "failing_phase": phase if failed else "",
        "failing_class": failed_entry.outcome_name if failed and failed_entry is not None else "",
        "reason": failed_entry.reason if failed and failed_entry is not None else "",
        "attempts": attempts,
        "retried_phases": retried,
        "seconds": round(seconds, 3),
        "gpu_seconds": round(gpu_seconds, 3),
        "started_at": min(starts).isoformat() if starts else "",
        # The last phase that ran ended then; phases after a failure never run.
        "finished_at": max(ends).isoformat() if ends else "",
        "shard": shard if shard is not None else "",
        "durations": durations,
    }


def scenarios_of(shard_docs: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
    """case id -> (scenario uri, scenario version), from shard case lists (``manifest/shards/<k>.json``)."""
    found: dict[str, tuple[str, str]] = {}
    for doc in shard_docs:
        for entries in (doc.get("by_family") or {}).values():
            for e in entries:
                if isinstance(e, Mapping) and e.get("case_id") is not None:
                    found[str(e["case_id"])] = (
                        str(e.get("scenario_uri") or ""),
                        str(e.get("scenario_version") or ""),
                    )
    return found


def columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    phases: dict[str, None] = {}
    for row in rows:
        for name in row.get("durations") or {}:
            phases.setdefault(name, None)
    return [*BASE_COLUMNS, *(f"{p}_seconds" for p in phases)]


def to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """``cases.csv``: a header, then one row per case; empty cells for phases that did not run."""
    out = io.StringIO()
    head = columns(rows)
    writer = csv.DictWriter(out, fieldnames=head, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        flat = {k: v for k, v in row.items() if k != "durations"}
        for name, seconds in (row.get("durations") or {}).items():
            flat[f"{name}_seconds"] = "" if seconds is None else seconds
        writer.writerow(flat)
    return out.getvalue()


def from_csv(text: str) -> list[dict[str, str]]:
    """Rows of a ``cases.csv`` (any version of it: columns are read by name)."""
    return [dict(r) for r in csv.DictReader(io.StringIO(text))]
