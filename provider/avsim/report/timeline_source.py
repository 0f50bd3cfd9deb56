"""What :func:`avsim.report.timeline.build_timeline` needs, read from a run's artifact store.

The attempt records (one recursive listing, read in parallel), the finished cases (the shard summaries'
case ids) and the plan (``manifest/plan.json``'s ``cases`` and ``deadline``). :class:`SpanCache` keeps
the records read as ended (they never change), so the avsim page re-reads only what is new.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from avsim.artifacts import RunLayout
from avsim.report.cases import parse_time
from avsim.report.timeline import MAX_POINTS, PlanLine, Span, Timeline, build_timeline, span_of

READ_THREADS = 16


class SpanCache:
    """Spans of ended attempt records, by record path, for one process (the API server)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended: dict[str, dict[str, Span]] = {}

    def known(self, run_key: str) -> dict[str, Span]:
        with self._lock:
            return dict(self._ended.get(run_key, {}))

    def keep(self, run_key: str, found: dict[str, Span]) -> None:
        with self._lock:
            self._ended.setdefault(run_key, {}).update({k: s for k, s in found.items() if s.end is not None})
            if len(self._ended) > 20:  # a few weeks at most
                del self._ended[next(iter(self._ended))]


def _parallel(fn: Callable[[Any], Any], items: Sequence[Any], local: bool) -> list[Any]:
    if local or len(items) < 2:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(
        max_workers=min(READ_THREADS, len(items)), thread_name_prefix="avsim-timeline"
    ) as ex:
        return list(ex.map(fn, items))


def _read_json(p: Any) -> Any:
    try:
        return json.loads(p.read_text())
    except (FileNotFoundError, ValueError, OSError):
        return None


def _glob(base: Any, pattern: str) -> list[Any]:
    try:
        return sorted(base.glob(pattern), key=str)
    except FileNotFoundError:
        return []


def read_spans(layout: RunLayout, cache: SpanCache | None = None) -> list[Span]:
    """Every attempt's span in the run's ledger (new or still-running records read, the rest cached)."""
    from avsim.storage import path

    base = path(f"{layout.ledger}/attempts")
    local = str(base.protocol) in ("file", "local", "")
    paths = _glob(base, "*/*/*.json")
    known = cache.known(layout.run_key) if cache else {}
    todo = [p for p in paths if str(p) not in known]
    docs = _parallel(_read_json, todo, local)
    fresh: dict[str, Span] = {}
    for p, doc in zip(todo, docs, strict=True):
        span = span_of(doc) if isinstance(doc, dict) else None
        if span is not None:
            fresh[str(p)] = span
    if cache:
        cache.keep(layout.run_key, fresh)
    return [
        known[str(p)] if str(p) in known else fresh[str(p)]
        for p in paths
        if str(p) in known or str(p) in fresh
    ]


def finished_cases(layout: RunLayout) -> set[str]:
    """Case ids of every shard summary written so far."""
    from avsim.storage import path

    base = path(f"{layout.ledger}/shards")
    local = str(base.protocol) in ("file", "local", "")
    docs = _parallel(_read_json, _glob(base, "*/result.json"), local)
    return {
        str(c["case_id"])
        for d in docs
        if isinstance(d, dict)
        for c in d.get("cases") or []
        if isinstance(c, dict) and c.get("case_id") is not None
    }


def plan_line(layout: RunLayout, fallback_deadline: Any = None, fallback_cases: Any = None) -> PlanLine:
    """The planned cases and the deadline, from ``plan.json`` (else the fallbacks, e.g. the head's)."""
    from avsim.storage import path

    doc = _read_json(path(layout.plan_uri)) or {}
    cases = doc.get("cases") if isinstance(doc, dict) else None
    cases = cases if isinstance(cases, int) else fallback_cases if isinstance(fallback_cases, int) else None
    deadline = parse_time((doc.get("deadline") if isinstance(doc, dict) else None) or fallback_deadline)
    return PlanLine(planned_cases=cases, deadline=deadline)


def week_timeline(
    layout: RunLayout,
    *,
    now: dt.datetime | None = None,
    cache: SpanCache | None = None,
    finished: set[str] | None = None,
    fallback_deadline: Any = None,
    fallback_cases: Any = None,
    points: int = MAX_POINTS,
) -> Timeline:
    """The run's :class:`~avsim.report.timeline.Timeline` from its artifact store."""
    return build_timeline(
        read_spans(layout, cache),
        finished_cases(layout) if finished is None else finished,
        plan_line(layout, fallback_deadline, fallback_cases),
        now or dt.datetime.now(dt.UTC),
        points=points,
    )
