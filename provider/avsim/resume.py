"""When a trigger of avsim may fire: not before the scheduler has seen the deferring try end.

Airflow 3.3's scheduler fails a task instance resumed before it processed the exit of the try that
deferred (docs/design.md, "Every wait is bounded"). A loop of its processes that exit after
scheduling, and its heartbeat, written at the end of a loop (at most every few seconds), dates the
loop. So a trigger waits for the exit's report (:data:`EXIT_REPORT_SECONDS`), then for two scheduler
heartbeats after it: the loop that began after the first has processed the exit by the second, however
long the scheduler's loops take. Without a heartbeat to read it waits the fixed bound instead.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Awaitable, Callable

#: How long after a deferral the deferring try's exit may reach the scheduler: the task supervisor's
#: ``[workers] min_heartbeat_interval`` (5 s) and a second of margin.
EXIT_REPORT_SECONDS = 6.0
#: The bound used when the scheduler's heartbeat cannot be read: one heartbeat and a short loop.
FALLBACK_SECONDS = 15.0
#: The longest a trigger holds its event for the scheduler (a scheduler that is down processes
#: nothing either way).
MAX_WAIT_SECONDS = 300.0
#: How often the heartbeat is read while a trigger holds its event.
POLL_SECONDS = 1.0

HeartbeatReader = Callable[[], Awaitable[dt.datetime | None]]


def health_url() -> str:
    """The API server's public health endpoint, beside the Execution API the triggerer talks to."""
    from avsim.settings import airflow_config

    execution = airflow_config("core", "execution_api_server_url", "")
    base = execution.rstrip("/").removesuffix("/execution")
    if not base:
        base = (airflow_config("api", "base_url", "") or "http://localhost:8080").rstrip("/")
    return f"{base}/api/v2/monitor/health"


def read_scheduler_heartbeat(url: str, timeout: float = 5.0) -> dt.datetime | None:
    """The latest scheduler heartbeat the health endpoint at ``url`` reports (None when unread)."""
    import httpx

    try:
        found = httpx.get(url, timeout=timeout).json()["scheduler"]["latest_scheduler_heartbeat"]
        beat = dt.datetime.fromisoformat(str(found))
    except Exception:
        return None
    return beat if beat.tzinfo else beat.replace(tzinfo=dt.UTC)


async def scheduler_heartbeat() -> dt.datetime | None:
    """The scheduler's latest heartbeat, read from the API server (None when it cannot be read)."""
    return await asyncio.to_thread(read_scheduler_heartbeat, health_url())


async def resume_not_before(
    began: float,
    min_wait_seconds: float = FALLBACK_SECONDS,
    *,
    heartbeat: HeartbeatReader = scheduler_heartbeat,
) -> None:
    """Sleep until the event of a trigger that started at ``began`` (``time.monotonic()``) cannot be
    lost: two scheduler heartbeats later than :data:`EXIT_REPORT_SECONDS` after it. ``min_wait_seconds``
    is the bound when no heartbeat can be read; 0 fires at once (tests)."""
    if min_wait_seconds <= 0:
        return
    now = time.monotonic()
    exit_reported = (
        dt.datetime.now(dt.UTC)
        - dt.timedelta(seconds=now - began)
        + dt.timedelta(seconds=EXIT_REPORT_SECONDS)
    )
    await asyncio.sleep(max(0.0, began + EXIT_REPORT_SECONDS - now))
    seen: list[dt.datetime] = []
    while time.monotonic() - began < MAX_WAIT_SECONDS:
        beat = await heartbeat()
        if beat is None:  # unreadable: the fixed bound
            await asyncio.sleep(max(0.0, began + min_wait_seconds - time.monotonic()))
            return
        if beat > exit_reported and beat not in seen:
            seen.append(beat)
            if len(seen) >= 2:
                return
        await asyncio.sleep(POLL_SECONDS)
