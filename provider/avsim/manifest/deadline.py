"""When a run's deadline may fall: pure checks, one for any manifest and one for the moment a run starts.

* :func:`deadline_vs_week` (every manifest, at ``validate`` and at ``prepare``): the deadline is not
  before its ISO week starts (Monday 00:00 UTC), nor more than :data:`MAX_WEEKS_AFTER` weeks after
  the week ends: either is a typo of the week or of the year, not a plan.
* :func:`deadline_at_start` (at ``prepare``, against the time the run is prepared): a deadline that
  has already passed is refused, except for a rerun (``run.rerun_of``: it keeps the deadline of the
  week it reruns) or when ``[avsim] manifest_allow_past_deadline`` is set (replaying an old week).
"""

from __future__ import annotations

import datetime as dt

#: A deadline this many weeks after its ISO week ends is refused as a typo.
MAX_WEEKS_AFTER = 8
_WEEK = dt.timedelta(days=7)


def iso_week_of(when: dt.datetime) -> str:
    """The ISO week (``YYYY-Www``) ``when`` falls in, in UTC (an aware ``when``)."""
    year, week, _ = when.astimezone(dt.UTC).isocalendar()
    return f"{year}-W{week:02d}"


def week_start(iso_week: str) -> dt.datetime | None:
    """Monday 00:00 UTC of ``YYYY-Www``; None if it is no ISO week (the model reports that)."""
    try:
        year, week = int(iso_week[:4]), int(iso_week[6:])
        if iso_week[4:6] != "-W" or len(iso_week) != 8:
            return None
        return dt.datetime.combine(dt.date.fromisocalendar(year, week, 1), dt.time(0), tzinfo=dt.UTC)
    except ValueError:
        return None


def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def deadline_vs_week(deadline: dt.datetime, iso_week: str) -> str | None:
    """Why ``deadline`` cannot be the deadline of ``iso_week``, or None."""
    start = week_start(iso_week)
    if start is None or deadline.tzinfo is None:
        return None
    if deadline < start:
        return (
            f"deadline {_iso(deadline)} is before ISO week {iso_week} starts ({_iso(start)}); the run of a "
            "week ends in or after that week: fix the deadline or run.iso_week"
        )
    latest = start + _WEEK * (1 + MAX_WEEKS_AFTER)
    if deadline > latest:
        return (
            f"deadline {_iso(deadline)} is more than {MAX_WEEKS_AFTER} weeks after ISO week {iso_week} ends "
            f"(latest {_iso(latest)}); fix the deadline or run.iso_week"
        )
    return None


def deadline_at_start(
    deadline: dt.datetime, now: dt.datetime, *, rerun: bool, allow_past: bool
) -> str | None:
    """Why a run with ``deadline`` may not start at ``now``, or None."""
    if rerun or allow_past or deadline > now:
        return None
    return (
        f"deadline {_iso(deadline)} has already passed (the run is prepared at {_iso(now)}); give the run "
        "a deadline in the future, or set [avsim] manifest_allow_past_deadline = True to replay a past week"
    )
