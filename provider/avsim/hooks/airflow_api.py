"""The few Airflow REST API calls avsim makes itself, with credentials from an Airflow connection.

Workers have no database access in Airflow 3: the deadline tracker raises a pool's slots, a cleared
``shards`` task clears its failed shard run's task instances, and ``triage`` stops its runs left at
the deadline through ``/api/v2``, as an engineer's client would. The connection (type
``avsim_airflow_api``) holds the API server's URL and a login and password (a token from
``POST /auth/token``) or ``extra.token`` (docs/deployment.md, "avsim's service account").
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseHook

from avsim.errors import AvsimError


class AirflowApiError(AvsimError):
    """The Airflow REST API could not be reached, refused the login, or refused a call (``status``: the
    HTTP status of a refusal, None when there was no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def collided(status: int, body: str) -> bool:
    """Whether an answer of the API server says two writers collided in the metadata database: a 5xx,
    or Airflow 3.3's 409 for an IntegrityError (``"Unique constraint violation"``), which two shards
    clearing the weekly run's report at once get (both write the report's task_instance_history row).
    Any other 409 (a real conflict) is not tried again."""
    return status >= 500 or (status == 409 and "Unique constraint violation" in body)


class AirflowApiHook(BaseHook):
    """A small client of Airflow's public REST API. Nothing is read or sent before the first call."""

    conn_name_attr = "airflow_api_conn_id"
    default_conn_name = "avsim_airflow_api"
    conn_type = "avsim_airflow_api"
    hook_name = "avsim: Airflow REST API"

    def __init__(self, airflow_api_conn_id: str = default_conn_name, timeout: float = 30.0) -> None:
        super().__init__()
        self.airflow_api_conn_id = airflow_api_conn_id
        self.timeout = timeout

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": ["schema"],
            "relabeling": {"host": "API server URL", "login": "User", "password": "Password"},
            "placeholders": {
                "host": "https://airflow.example.com",
                "extra": '{"token": "<a ready JWT, instead of user and password>"}',
            },
        }

    @property
    def conn_id(self) -> str:
        return self.airflow_api_conn_id

    @cached_property
    def _connection(self) -> Any:
        return self.get_connection(self.airflow_api_conn_id)

    @cached_property
    def base_url(self) -> str:
        conn = self._connection
        host = (conn.host or "").rstrip("/")
        if not host:
            raise AirflowApiError(
                f"connection {self.airflow_api_conn_id!r} has no host; set it to the Airflow API server's URL"
            )
        if "://" not in host:
            host = f"{conn.schema or 'http'}://{host}"
        if conn.port and host.count(":") < 2:
            host = f"{host}:{conn.port}"
        return host

    @cached_property
    def _client(self) -> Any:
        import httpx

        return httpx.Client(base_url=self.base_url, timeout=self.timeout, headers=self._auth_headers())

    def _auth_headers(self) -> dict[str, str]:
        import httpx

        conn = self._connection
        token = (conn.extra_dejson or {}).get("token")
        if token:
            return {"Authorization": f"Bearer {token}"}
        try:
            if conn.login:
                resp = httpx.post(
                    f"{self.base_url}/auth/token",
                    json={"username": conn.login, "password": conn.password or ""},
                    timeout=self.timeout,
                )
            else:  # the simple auth manager's all-admins mode hands out a token to anyone
                resp = httpx.get(f"{self.base_url}/auth/token", timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise AirflowApiError(
                f"the Airflow API at {self.base_url} (connection {self.airflow_api_conn_id!r}) cannot be "
                f"reached: {exc}"
            ) from None
        if resp.status_code >= 400:
            how = "refused the login of" if conn.login else "gave no token without a login to"
            raise AirflowApiError(
                f"the Airflow API at {self.base_url} {how} connection {self.airflow_api_conn_id!r} "
                f"(HTTP {resp.status_code}); check its login and password"
            )
        return {"Authorization": f"Bearer {resp.json()['access_token']}"}

    def _call(self, method: str, path: str, *, tries: int = 3, **kwargs: Any) -> Any:
        """One API call; an answer of two writers colliding in the database (:func:`collided`) is tried
        again, since every call avsim makes is idempotent (a clear of cleared task instances, a pool's
        slots)."""
        import time

        import httpx

        for attempt in range(1, tries + 1):
            try:
                resp = self._client.request(method, path, **kwargs)
            except httpx.HTTPError as exc:
                raise AirflowApiError(f"{method} {self.base_url}{path} failed: {exc}") from None
            if not collided(resp.status_code, resp.text) or attempt == tries:
                break
            self.log.warning("%s %s answered HTTP %d; trying again", method, path, resp.status_code)
            time.sleep(attempt)
        if resp.status_code >= 400:
            raise AirflowApiError(
                f"{method} {self.base_url}{path} answered HTTP {resp.status_code}: {resp.text[:300]}",
                status=resp.status_code,
            )
        return resp.json()

    # -- pools ----------------------------------------------------------------------------------
    def pool(self, name: str) -> dict[str, Any] | None:
        """A pool as the API returns it (name, slots, description, include_deferred, ...); None if absent."""
        resp = self._client.get(f"/api/v2/pools/{quote(name, safe='')}")
        if resp.status_code == 404:
            return None
        if resp.status_code >= 400:
            raise AirflowApiError(
                f"GET pool {name!r} at {self.base_url} answered HTTP {resp.status_code}: {resp.text[:300]}"
            )
        return dict(resp.json())

    def pool_slots(self, name: str) -> int | None:
        """A pool's slots, None when there is no such pool."""
        pool = self.pool(name)
        return None if pool is None else int(pool["slots"])

    def set_pool_slots(self, name: str, slots: int) -> int:
        """Change only a pool's slots (the API validates a whole pool body; the mask applies slots alone)."""
        current = self.pool(name)
        if current is None:
            raise AirflowApiError(f"there is no pool {name!r}; create it with 'avsim pools sync'")
        body = {
            "pool": name,
            "slots": slots,
            "description": current.get("description"),
            "include_deferred": bool(current.get("include_deferred")),
        }
        doc = self._call(
            "PATCH", f"/api/v2/pools/{quote(name, safe='')}", params={"update_mask": "slots"}, json=body
        )
        return int(doc["slots"])

    # -- task instances -------------------------------------------------------------------------
    def task_instance_state(
        self, dag_id: str, dag_run_id: str, task_id: str, map_index: int = -1
    ) -> str | None:
        """A task instance's state (None: not scheduled yet, or cleared)."""
        path = (
            f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/{quote(dag_run_id, safe='')}/taskInstances/"
            f"{quote(task_id, safe='')}"
        )
        if map_index >= 0:
            path += f"/{map_index}"
        state = self._call("GET", path).get("state")
        return None if state is None else str(state)

    def clear_task_instances(
        self,
        dag_id: str,
        dag_run_id: str,
        *,
        only_failed: bool = True,
        include_downstream: bool = True,
        task_ids: Sequence[str | tuple[str, int]] | None = None,
        reset_dag_runs: bool = True,
        note: str | None = None,
    ) -> list[dict[str, Any]]:
        """Clear task instances of one DAG run (not a dry run); returns the ones the API cleared.

        ``only_failed`` takes failed and upstream_failed task instances; ``include_downstream`` stays
        per map index; ``reset_dag_runs`` queues the run again when it had finished; ``note`` is set
        on every cleared task instance (the grid shows it)."""
        body: dict[str, Any] = {
            "dry_run": False,
            "dag_run_id": dag_run_id,
            "only_failed": only_failed,
            "include_downstream": include_downstream,
            "reset_dag_runs": reset_dag_runs,
        }
        if note is not None:
            body["note"] = note
        if task_ids is not None:
            body["task_ids"] = [list(t) if isinstance(t, tuple) else t for t in task_ids]
        doc = self._call("POST", f"/api/v2/dags/{quote(dag_id, safe='')}/clearTaskInstances", json=body)
        return list(doc.get("task_instances") or [])

    # -- DAG runs -------------------------------------------------------------------------------
    def create_dag_run(
        self,
        dag_id: str,
        dag_run_id: str,
        *,
        conf: dict[str, Any],
        logical_date: str | None = None,
        note: str | None = None,
    ) -> bool:
        """Create a DAG run (``logical_date`` ISO 8601 or None); True when this call created it, False
        when a run of that id was already there (HTTP 409)."""
        body: dict[str, Any] = {"dag_run_id": dag_run_id, "logical_date": logical_date, "conf": conf}
        if note:
            body["note"] = note[:1000]
        try:
            self._call("POST", f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns", json=body)
        except AirflowApiError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def stop_dag_run(self, dag_id: str, dag_run_id: str, note: str | None = None) -> str:
        """Mark a DAG run failed (its running task instances end, the rest are skipped); returns its
        state. A run that already ended keeps its state."""
        path = f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/{quote(dag_run_id, safe='')}"
        current = str(self._call("GET", path).get("state") or "")
        if current in ("success", "failed"):
            return current
        doc = self._call("PATCH", path, params={"update_mask": "state"}, json={"state": "failed"})
        if note:
            self._call("PATCH", path, params={"update_mask": "note"}, json={"note": note[:1000]})
        return str(doc.get("state") or "failed")
