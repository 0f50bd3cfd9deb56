"""One row per case: what ``cases.csv`` holds and what the week-over-week comparison reads back.

A row is built from a case of a shard summary (:func:`avsim.ledger.store.summarize_shard`) and the
run's head (for the GPUs of each phase); the scenario of the case comes from the shard's case list,
which the weekly run wrote when it cut the week into shards.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from avsim.phases.contract import ENDED as ENDED_OUTCOMES
from avsim.phases.contract import Outcome, values

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
#: Phase outcomes after which a phase counts as having ended (and its attempt as having run).
ENDED = values(ENDED_OUTCOMES)
_PASSED = Outcome.PASSED.value


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


def phase_gpus(head: Mapping[str, Any], graph: str, phase: str, entry: Mapping[str, Any]) -> int:
    """GPUs the phase held: the summary's own ``gpus`` when it has it, else the graph's resources."""
    if isinstance(entry.get("gpus"), int):
        return int(entry["gpus"])
    graphs = head.get("graphs")
    spec = graphs.get(graph, {}).get("phases", {}).get(phase, {}) if isinstance(graphs, Mapping) else {}
    resources = spec.get("resources", {}) if isinstance(spec, Mapping) else {}
    try:
        return int(resources.get("gpus", 0) or 0)
    except (TypeError, ValueError):
        return 0


def case_row(
    case: Mapping[str, Any],
    head: Mapping[str, Any],
    failing: tuple[str, Mapping[str, Any]],
    shard: Any,
) -> dict[str, Any]:
    """The row of one case of a shard summary. ``failing``: its failing phase and that phase's entry."""
    graph = str(case.get("graph") or "")
    phases: Mapping[str, Any] = case.get("phases") or {}
    attempts = retried = 0
    seconds = gpu_seconds = 0.0
    durations: dict[str, float | None] = {}
    starts: list[dt.datetime] = []
    ends: list[dt.datetime] = []
    for name, entry in phases.items():
        if not isinstance(entry, Mapping):
            continue
        n = int(entry.get("attempts") or 0)
        attempts += n
        retried += 1 if n > 1 else 0
        took = entry.get("duration_seconds")
        if entry.get("outcome") in ENDED and isinstance(took, int | float):
            durations[str(name)] = round(float(took), 3)
            seconds += float(took)
            gpu_seconds += float(took) * phase_gpus(head, graph, str(name), entry)
        else:
            durations[str(name)] = None
        for key, into in (("started_at", starts), ("ended_at", ends)):
            when = parse_time(entry.get(key))
            if when is not None:
                into.append(when)
    phase, entry = failing
    outcome = str(case.get("outcome") or "")
    return {
        "case_id": str(case.get("case_id")),
        "graph": graph,
        "scenario_uri": "",
        "scenario_version": "",
        "outcome": outcome,
        "failing_phase": phase if outcome != _PASSED else "",
        "failing_class": str(entry.get("outcome") or "") if outcome != _PASSED else "",
        "reason": str(entry.get("reason") or "") if outcome != _PASSED else "",
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
