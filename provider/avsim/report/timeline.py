"""Progress over time, from the ledger: cases finished against the planned pace, and GPUs busy.

Pure functions over frozen values (:func:`build_timeline`), fed by the ledger's attempt records and the
shard summaries; the weekly report (:mod:`avsim.report.plots`) and the avsim page
(:mod:`avsim.ui.timeline`) only draw the result. A case is finished when its shard run summarized it;
the planned pace runs from the run's first attempt to every planned case at the deadline; GPUs busy is
each interval's peak. docs/operations.md, "Watch it".
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from avsim.report.cases import parse_time

#: Most points per series (the page and report.json stay small at 60,000 attempts).
MAX_POINTS = 200


@dataclass(frozen=True)
class Span:
    """When one attempt ran, and on how many GPUs; ``end`` None while it runs."""

    case_id: str
    phase: str
    start: dt.datetime
    end: dt.datetime | None
    gpus: int = 0


@dataclass(frozen=True)
class PlanLine:
    """What the run planned: its cases and its deadline (the manifest's ``run.deadline``)."""

    planned_cases: int | None
    deadline: dt.datetime | None


@dataclass(frozen=True)
class Timeline:
    """The series, each a tuple of (time, value) points in time order."""

    start: dt.datetime | None
    now: dt.datetime
    deadline: dt.datetime | None
    planned_cases: int | None
    finished_cases: int
    finished: tuple[tuple[dt.datetime, int], ...]
    planned: tuple[tuple[dt.datetime, float], ...]
    gpus_busy: tuple[tuple[dt.datetime, int], ...]

    @property
    def empty(self) -> bool:
        return self.start is None

    @property
    def peak_gpus(self) -> int:
        return max((n for _, n in self.gpus_busy), default=0)

    def planned_at(self, when: dt.datetime) -> float | None:
        """Cases the planned pace expects finished by ``when`` (None without a plan)."""
        if self.start is None or self.deadline is None or not self.planned_cases:
            return None
        total = (self.deadline - self.start).total_seconds()
        if total <= 0:
            return float(self.planned_cases)
        done = (when - self.start).total_seconds() / total
        return round(self.planned_cases * min(1.0, max(0.0, done)), 1)

    def to_json(self) -> dict[str, Any]:
        expected = self.planned_at(self.now)
        return {
            "start": _iso(self.start),
            "now": self.now.isoformat(),
            "deadline": _iso(self.deadline),
            "planned_cases": self.planned_cases,
            "finished_cases": self.finished_cases,
            "planned_by_now": expected,
            "ahead_by_cases": round(self.finished_cases - expected, 1) if expected is not None else None,
            "peak_gpus": self.peak_gpus,
            "finished": [[t.isoformat(), n] for t, n in self.finished],
            "planned": [[t.isoformat(), n] for t, n in self.planned],
            "gpus_busy": [[t.isoformat(), n] for t, n in self.gpus_busy],
            "definitions": DEFINITIONS,
        }


DEFINITIONS = {
    "finished": "cases of summarized shard runs, each at the end of its last attempt",
    "planned": "straight line from the first attempt's start (0 cases) to every planned case at the deadline",
    "gpus_busy": "GPUs of the attempts running at each moment (peak per interval)",
}


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def span_of(record: Mapping[str, Any]) -> Span | None:
    """The span of one attempt record's JSON (as the ledger stores it), or None without a start."""
    start = parse_time(record.get("started_at"))
    if start is None or not record.get("case_id"):
        return None
    ended = str(record.get("state", "ended")) == "ended"
    end = parse_time(record.get("ended_at")) if ended else None
    if ended and end is None:
        end = start + dt.timedelta(seconds=float(record.get("duration_seconds") or 0.0))
    try:
        gpus = int(record.get("gpus") or 0)
    except (TypeError, ValueError):
        gpus = 0
    return Span(str(record["case_id"]), str(record.get("phase", "")), start, end, gpus)


def case_finish_times(spans: Iterable[Span], finished_cases: Iterable[str]) -> dict[str, dt.datetime]:
    """Each finished case's finish: the end of its last ended attempt (cases without one left out)."""
    wanted = set(finished_cases)
    out: dict[str, dt.datetime] = {}
    for s in spans:
        if s.case_id in wanted and s.end is not None and (s.case_id not in out or s.end > out[s.case_id]):
            out[s.case_id] = s.end
    return out


def _thin(points: Sequence[tuple[dt.datetime, int]], limit: int) -> list[tuple[dt.datetime, int]]:
    """Every ``k``-th point of a rising count, keeping the last, at most ``limit`` points."""
    if len(points) <= limit:
        return list(points)
    step = math.ceil(len(points) / limit)
    kept = list(points[step - 1 :: step])
    if kept[-1] != points[-1]:
        kept.append(points[-1])
    return kept


def _busy(spans: Sequence[Span], now: dt.datetime, limit: int) -> list[tuple[dt.datetime, int]]:
    """GPUs busy as a step series: the change points, or each interval's peak when too many."""
    events: list[tuple[dt.datetime, int]] = []
    for s in spans:
        if s.gpus <= 0:
            continue
        end = s.end if s.end is not None else max(now, s.start)
        events += [(s.start, s.gpus), (end, -s.gpus)]
    if not events:
        return []
    events.sort(key=lambda e: (e[0], e[1]))  # ends before starts at the same instant
    steps: list[tuple[dt.datetime, int]] = []
    level = 0
    for when, change in events:
        level += change
        if steps and steps[-1][0] == when:
            steps[-1] = (when, level)
        else:
            steps.append((when, level))
    if len(steps) <= limit:
        return steps
    first, last = steps[0][0], steps[-1][0]
    width = (last - first) / (limit - 1)
    peaks: dict[int, int] = {}
    current = 0
    for when, value in steps:  # a bin's peak: the highest level reached in it
        i = min(limit - 2, int((when - first) / width)) if width else 0
        current = value
        peaks[i] = max(peaks.get(i, 0), current)
    out = [(first + width * i, peaks[i]) for i in sorted(peaks)]
    out.append((last, steps[-1][1]))
    return out


def build_timeline(
    spans: Sequence[Span],
    finished_cases: Iterable[str],
    plan: PlanLine,
    now: dt.datetime,
    *,
    points: int = MAX_POINTS,
) -> Timeline:
    """The run's progress over time (see the module doc for what each series means)."""
    start = min((s.start for s in spans), default=None)
    finish = sorted(case_finish_times(spans, finished_cases).values())
    cumulative = [(t, i + 1) for i, t in enumerate(finish)]
    finished = ([(start, 0)] if start is not None and cumulative else []) + _thin(cumulative, points - 1)
    planned: tuple[tuple[dt.datetime, float], ...] = ()
    if start is not None and plan.deadline is not None and plan.planned_cases:
        end = max(plan.deadline, start)
        planned = ((start, 0.0), (end, float(plan.planned_cases)))
    return Timeline(
        start=start,
        now=now,
        deadline=plan.deadline,
        planned_cases=plan.planned_cases,
        finished_cases=len(finish),
        finished=tuple(finished),
        planned=planned,
        gpus_busy=tuple(_busy(spans, now, max(2, points))),
    )
