"""Where things are, as URL paths: the avsim app's pages and the Airflow UI's.

The avsim app is mounted at ``/avsim`` on the API server, which serves the Airflow UI at its
root; both sit under ``[api] base_url``'s path when the API server runs behind a prefix. Every
function here takes that ``base`` (``""`` at the root) and quotes each path segment.

Strings only, no import of avsim: the pages (``avsim.ui``) and the phases' extra link
(``avsim.links``, which the operators declare) both build their URLs here.
"""

from __future__ import annotations

from urllib.parse import quote

#: Where the plugin mounts the avsim app on the API server.
MOUNT = "/avsim"


def _q(value: object) -> str:
    return quote(str(value), safe="")


def app_base(base: str = "") -> str:
    return f"{base.rstrip('/')}{MOUNT}"


def progress_page(dag_id: str, run_id: str, base: str = "") -> str:
    return f"{app_base(base)}/dags/{_q(dag_id)}/runs/{_q(run_id)}"


def progress_api(dag_id: str, run_id: str, base: str = "") -> str:
    return f"{app_base(base)}/api/runs/{_q(dag_id)}/{_q(run_id)}/progress"


def case_page(run_key: str, case_id: str, base: str = "") -> str:
    return f"{app_base(base)}/runs/{_q(run_key)}/cases/{_q(case_id)}"


def run_file(run_key: str, relpath: str, base: str = "") -> str:
    """An artifact of a run (a file, or a folder when ``relpath`` ends with ``/``)."""
    parts = [p for p in relpath.split("/") if p]
    tail = "/".join(_q(p) for p in parts) + ("/" if relpath.endswith("/") and parts else "")
    return f"{app_base(base)}/runs/{_q(run_key)}/files/{tail}"


def phase_artifacts(run_key: str, case_id: str, phase: str, base: str = "") -> str:
    """The folder of every attempt of one phase of one case."""
    return run_file(run_key, f"cases/{case_id}/{phase}/", base)


def report_page(run_key: str, base: str = "") -> str:
    return f"{app_base(base)}/runs/{_q(run_key)}/report/"


def airflow_run(dag_id: str, run_id: str, base: str = "") -> str:
    """A DAG run in the Airflow 3 UI."""
    return f"{base.rstrip('/')}/dags/{_q(dag_id)}/runs/{_q(run_id)}"


def airflow_task_instance(dag_id: str, run_id: str, task_id: str, map_index: int = -1, base: str = "") -> str:
    """A task instance in the Airflow 3 UI (``.../mapped/<index>`` for one map index of a mapped task)."""
    url = f"{airflow_run(dag_id, run_id, base)}/tasks/{_q(task_id)}"
    return f"{url}/mapped/{int(map_index)}" if map_index is not None and int(map_index) >= 0 else url
