"""The REST API hook the repairs use, against a loopback HTTP server that answers as Airflow 3.3.2's API
server did in tests/integration/test_week_repair.py (the boundary replaced: the API server).

Two shards repairing at once both clear the weekly run's report; the second clear's write of the
report's task_instance_history row hits the unique constraint, and Airflow answers HTTP 409
"Unique constraint violation". That is a collision, tried again like a 5xx; any other 409 is not."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from avsim.hooks.airflow_api import AirflowApiError, AirflowApiHook, collided

#: What Airflow 3.3.2's API server answered (api_fastapi/common/exceptions.py), seen in the test above.
UNIQUE_VIOLATION = json.dumps(
    {
        "detail": {
            "reason": "Unique constraint violation",
            "statement": "hidden",
            "orig_error": "hidden",
            "message": "Serious error when handling your request. Check logs for more details",
        }
    }
)


class _Server:
    def __init__(self, answers: list[tuple[int, str]]) -> None:
        self.answers = answers
        self.bodies: list[Any] = []


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Server]:
    state = _Server([])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            state.bodies.append(json.loads(self.rfile.read(length) or b"null"))
            status, body = state.answers.pop(0)
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    conn = {"conn_type": "avsim_airflow_api", "host": "127.0.0.1", "port": httpd.server_port}
    conn["extra"] = json.dumps({"token": "t"})  # type: ignore[assignment]
    monkeypatch.setenv("AIRFLOW_CONN_TEST_API", json.dumps(conn))
    monkeypatch.setattr("time.sleep", lambda s: None)
    try:
        yield state
    finally:
        httpd.shutdown()


def test_a_clear_that_collided_on_the_unique_constraint_is_tried_again(server: _Server) -> None:
    cleared = {"task_instances": [{"task_id": "report", "map_index": -1}], "total_entries": 1}
    server.answers = [(409, UNIQUE_VIOLATION), (200, json.dumps(cleared))]
    got = AirflowApiHook("test_api").clear_task_instances(
        "avsim_weekly", "w1", only_failed=False, include_downstream=False, task_ids=["report"]
    )
    assert got == cleared["task_instances"]
    assert len(server.bodies) == 2 and server.bodies[0] == server.bodies[1]


def test_another_conflict_is_not_tried_again(server: _Server) -> None:
    server.answers = [(409, json.dumps({"detail": "The Dag Run is already running"}))]
    with pytest.raises(AirflowApiError, match="409"):
        AirflowApiHook("test_api").clear_task_instances("avsim_weekly", "w1")
    assert len(server.bodies) == 1


def test_collided() -> None:
    assert collided(500, "") and collided(503, "x") and collided(409, UNIQUE_VIOLATION)
    assert not collided(409, "conflict") and not collided(404, UNIQUE_VIOLATION) and not collided(200, "")


def test_creating_a_dag_run_that_exists_says_so_and_any_other_refusal_raises(server: _Server) -> None:
    """The admission trigger creates a shard run; another try may have created it: HTTP 409 is False."""
    exists = json.dumps({"detail": "DAG Run with id 'w1__shard_0003' already exists"})
    server.answers = [(200, json.dumps({"dag_run_id": "w1__shard_0003"})), (409, exists), (400, "{}")]
    hook = AirflowApiHook("test_api")
    args = {"conf": {"shard": 3}, "logical_date": "2026-12-07T06:00:00.000003+00:00", "note": "n"}
    assert hook.create_dag_run("avsim_weekly_shard", "w1__shard_0003", **args) is True
    assert server.bodies[0] == {"dag_run_id": "w1__shard_0003", **args}
    assert hook.create_dag_run("avsim_weekly_shard", "w1__shard_0003", **args) is False
    with pytest.raises(AirflowApiError) as refused:
        hook.create_dag_run("avsim_weekly_shard", "w1__shard_0003", **args)
    assert refused.value.status == 400
