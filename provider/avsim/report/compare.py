"""This week against the week before: which scenarios newly fail, which newly pass.

The previous week's run is found through the week index (``weeks/<iso week>.json``, written by
each weekly run's prepare) and its ``report/cases.csv``. A case is matched by its id, and a case
whose id is new this week by its scenario URI (a renamed case that runs the same scenario).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from avsim.artifacts import RunLayout, week_index_uri
from avsim.phases.contract import Outcome
from avsim.report.cases import from_csv

#: The most entries of each list kept in report.json (the counts are always complete).
MAX_LISTED = 5000
_ISO_WEEK = re.compile(r"^(\d{4})-W(\d{2})$")


def previous_iso_week(iso_week: str) -> str | None:
    """``2026-W01`` -> ``2025-W52`` (or ``W53``); None for anything that is not an ISO week."""
    m = _ISO_WEEK.match(iso_week or "")
    if not m:
        return None
    try:
        monday = dt.date.fromisocalendar(int(m.group(1)), int(m.group(2)), 1)
    except ValueError:
        return None
    year, week, _ = (monday - dt.timedelta(days=7)).isocalendar()
    return f"{year}-W{week:02d}"


def _entry(row: Mapping[str, Any], before: Mapping[str, Any], matched_by: str) -> dict[str, Any]:
    """A case of this week beside its match of last week, as the comparison lists it."""
    return {
        "case_id": str(row.get("case_id")),
        "previous_case_id": str(before.get("case_id")),
        "scenario_uri": str(row.get("scenario_uri") or "") or str(before.get("scenario_uri") or ""),
        "graph": str(row.get("graph") or ""),
        "outcome": str(row.get("outcome") or ""),
        "previous_outcome": str(before.get("outcome") or ""),
        "failing_phase": str(row.get("failing_phase") or ""),
        "reason": str(row.get("reason") or ""),
        "matched_by": matched_by,
    }


def compare_cases(
    current: Sequence[Mapping[str, Any]], previous: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Newly failing and newly passing cases of ``current`` against ``previous`` (rows of cases.csv)."""
    by_id = {str(r.get("case_id")): r for r in previous}
    by_scenario: dict[str, Mapping[str, Any]] = {}
    for r in previous:
        uri = str(r.get("scenario_uri") or "")
        if uri:
            by_scenario.setdefault(uri, r)
    newly_failing: list[dict[str, Any]] = []
    newly_passing: list[dict[str, Any]] = []
    counts = {"matched": 0, "by_case_id": 0, "by_scenario_uri": 0, "new": 0, "still_failing": 0}
    for row in current:
        cid = str(row.get("case_id"))
        uri = str(row.get("scenario_uri") or "")
        before = by_id.get(cid)
        matched_by = "case_id"
        if before is None and uri:
            before, matched_by = by_scenario.get(uri), "scenario_uri"
        if before is None:
            counts["new"] += 1
            continue
        counts["matched"] += 1
        counts[f"by_{matched_by}"] += 1
        now_ok = row.get("outcome") == Outcome.PASSED.value
        was_ok = before.get("outcome") == Outcome.PASSED.value
        entry = _entry(row, before, matched_by)
        if was_ok and not now_ok:
            newly_failing.append(entry)
        elif now_ok and not was_ok:
            newly_passing.append(entry)
        elif not now_ok:
            counts["still_failing"] += 1
    current_ids = {str(r.get("case_id")) for r in current}
    current_uris = {str(r.get("scenario_uri") or "") for r in current} - {""}
    counts["dropped"] = sum(
        1
        for r in previous
        if str(r.get("case_id")) not in current_ids and str(r.get("scenario_uri") or "") not in current_uris
    )
    key = lambda e: (e["outcome"], e["graph"], e["case_id"])  # noqa: E731
    newly_failing.sort(key=key)
    newly_passing.sort(key=key)
    counts["newly_failing"] = len(newly_failing)
    counts["newly_passing"] = len(newly_passing)
    return {
        "counts": counts,
        "newly_failing": newly_failing[:MAX_LISTED],
        "newly_passing": newly_passing[:MAX_LISTED],
    }


def previous_week(
    root: str,
    iso_week: str,
    current: Sequence[Mapping[str, Any]],
    read_text: Callable[[str], str | None],
) -> dict[str, Any]:
    """The ``comparison`` section of the report; ``available`` is False (with why) when there is none.

    ``read_text(uri)`` returns a document's text, or None when it does not exist.
    """
    import json

    week = previous_iso_week(iso_week)
    if week is None:
        return {"available": False, "message": f"the run's ISO week {iso_week!r} is not of the form YYYY-Www"}
    index_uri = week_index_uri(root, week)
    text = read_text(index_uri)
    if text is None:
        return {
            "available": False,
            "week": week,
            "message": f"no weekly run recorded for {week} ({index_uri})",
        }
    try:
        entry = json.loads(text)
        layout = RunLayout(root, str(entry["run_key"]))
    except (ValueError, KeyError, TypeError):
        return {"available": False, "week": week, "message": f"unreadable week index {index_uri}"}
    previous = {
        "iso_week": week,
        "run_key": layout.run_key,
        "run_id": entry.get("run_id"),
        "dag_id": entry.get("dag_id"),
        "build_id": entry.get("build_id"),
        "image": entry.get("image"),
        "manifest_sha256": entry.get("manifest_sha256"),
    }
    csv_uri = f"{layout.report_dir}/cases.csv"
    rows = read_text(csv_uri)
    if rows is None:
        return {
            "available": False,
            "week": week,
            "previous": previous,
            "message": f"the {week} run has no cases.csv yet ({csv_uri}); regenerate its report",
        }
    return {"available": True, "week": week, "previous": previous, **compare_cases(current, from_csv(rows))}
