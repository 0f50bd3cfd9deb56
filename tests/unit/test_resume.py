"""A trigger fires only after two scheduler heartbeats later than the deferring try's exit report.

The scheduler's heartbeat is the boundary: a reader that replays a scheduler whose loops take a given
time (its heartbeat written at the end of each loop), or the health endpoint served on loopback as
the API server serves it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import http.server
import json
import threading
import time
from collections.abc import Iterator

import pytest

from avsim import resume


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resume, "EXIT_REPORT_SECONDS", 0.3)
    monkeypatch.setattr(resume, "POLL_SECONDS", 0.02)


def _scheduler(loop_seconds: float, stalled_after: float | None = None) -> resume.HeartbeatReader:
    """A scheduler whose loops take ``loop_seconds``: its heartbeat is the end of its last loop."""
    start = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()

    async def beat() -> dt.datetime:
        elapsed = time.monotonic() - t0
        if stalled_after is not None:
            elapsed = min(elapsed, stalled_after)
        loops = int(elapsed // loop_seconds)
        return start + dt.timedelta(seconds=loops * loop_seconds)

    return beat


def _waited(reader: resume.HeartbeatReader, min_wait: float = 15.0) -> float:
    began = time.monotonic()
    asyncio.run(resume.resume_not_before(began, min_wait, heartbeat=reader))
    return time.monotonic() - began


def test_the_wait_follows_the_schedulers_loop(fast: None) -> None:
    # Loops of 0.2 s: the exit (0.3 s) then two heartbeats after it: about 0.7 s.
    short = _waited(_scheduler(0.2))
    assert 0.5 <= short < 1.2, short
    # Loops of 1 s (a loaded scheduler): the same rule waits two of them past the exit report.
    long = _waited(_scheduler(1.0))
    assert 2.0 <= long < 3.5, long


def test_a_scheduler_whose_heartbeat_stops_holds_the_event(
    fast: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resume, "MAX_WAIT_SECONDS", 1.5)
    waited = _waited(_scheduler(0.2, stalled_after=0.35))  # one heartbeat after the exit, then none
    assert 1.5 <= waited < 2.0, waited


def test_an_unreadable_heartbeat_waits_the_fixed_bound(fast: None) -> None:
    async def unread() -> None:
        return None

    assert 0.8 <= _waited(unread, min_wait=0.8) < 1.3


def test_no_wait_when_asked_for_none() -> None:
    assert _waited(_scheduler(10.0), min_wait=0) < 0.1


@pytest.fixture
def health() -> Iterator[tuple[str, dict[str, object]]]:
    body: dict[str, object] = {
        "metadatabase": {"status": "healthy"},
        "scheduler": {"status": "healthy", "latest_scheduler_heartbeat": "2026-12-07T06:00:00.123456+00:00"},
    }

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = json.dumps(body).encode() if self.path == "/api/v2/monitor/health" else b"{}"
            self.send_response(200 if self.path == "/api/v2/monitor/health" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/api/v2/monitor/health", body
    finally:
        server.shutdown()


def test_the_heartbeat_is_read_from_the_api_servers_health_endpoint(
    health: tuple[str, dict[str, object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, body = health
    assert resume.read_scheduler_heartbeat(url) == dt.datetime(2026, 12, 7, 6, 0, 0, 123456, tzinfo=dt.UTC)
    body["scheduler"] = {"status": "unhealthy", "latest_scheduler_heartbeat": None}
    assert resume.read_scheduler_heartbeat(url) is None
    assert resume.read_scheduler_heartbeat(url.replace("/health", "/nope")) is None
    # Beside the Execution API the triggerer is configured with.
    base = url.removesuffix("/api/v2/monitor/health")
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTION_API_SERVER_URL", f"{base}/execution/")
    assert resume.health_url() == url
