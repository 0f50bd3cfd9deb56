"""Helpers for tests that drive a real Airflow stack: trigger a run, wait for it, read the database."""

from __future__ import annotations

import json
import time
from typing import Any

import sqlalchemy
from sqlalchemy import text

from avsim.devstack.stack import LocalStack


def trigger(stack: LocalStack, dag_id: str, run_id: str, conf: dict[str, Any]) -> None:
    stack.airflow("dags", "trigger", dag_id, "--run-id", run_id, "--conf", json.dumps(conf))


def wait_for_run(stack: LocalStack, dag_id: str, run_id: str, timeout: float = 600) -> str:
    engine = sqlalchemy.create_engine(stack.conn)
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        with engine.connect() as c:
            state = c.execute(
                text("SELECT state FROM dag_run WHERE dag_id = :d AND run_id = :r"),
                {"d": dag_id, "r": run_id},
            ).scalar()
        if state in ("success", "failed"):
            return str(state)
        time.sleep(1)
    logs = "\n".join(
        f"--- {name}.log ---\n" + (stack.home / "logs" / f"{name}.log").read_text()[-3000:]
        for name in ("scheduler", "triggerer")
        if (stack.home / "logs" / f"{name}.log").exists()
    )
    raise TimeoutError(f"{dag_id} run {run_id} still {state} after {timeout:.0f}s\n{logs}")


def query(stack: LocalStack, sql: str, **params: Any) -> list[Any]:
    engine = sqlalchemy.create_engine(stack.conn)
    with engine.connect() as c:
        return list(c.execute(text(sql), params).all())


def run_descriptor(stack: LocalStack, run_id: str, dag_id: str = "avsim_weekly") -> dict[str, Any]:
    """The run descriptor ``prepare`` pushed for run ``run_id`` (its XCom ``run``), as JSON."""
    [(value,)] = query(
        stack,
        "SELECT value FROM xcom WHERE dag_id = :d AND run_id = :r AND task_id = 'prepare' AND key = 'run'",
        d=dag_id,
        r=run_id,
    )
    return value if isinstance(value, dict) else json.loads(value)


def token(stack: LocalStack, login: tuple[str, str] | None = None) -> str:
    """A JWT from the API server: for ``login`` (user, password), else the all-admins mode's."""
    import urllib.request

    if login is None:
        req = urllib.request.Request(f"{stack.api_url}/auth/token")
    else:
        req = urllib.request.Request(
            f"{stack.api_url}/auth/token",
            data=json.dumps({"username": login[0], "password": login[1]}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return str(json.loads(resp.read())["access_token"])


def api(
    stack: LocalStack,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    login: tuple[str, str] | None = None,
) -> Any:
    """Call the REST API as an engineer would: as ``login`` (user, password), else as the simple
    auth manager's all-admins user."""
    import urllib.request

    req = urllib.request.Request(
        f"{stack.api_url}{path}",
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token(stack, login)}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read() or b"null")
