"""Who may see a week, on a real API server with the FAB auth manager and real logins.

A small weekly run (4 cases, one failed scenario) runs on the real scheduler, dag-processor,
triggerer and API server on PostgreSQL, with the FAB auth manager (docker-compose.yml's) and two
users whose roles are FAB's Viewer limited to some DAGs: ``weekly`` may read avsim_weekly (and its
shard DAG), ``adhoc`` avsim_adhoc only. Each logs in through the real login endpoint
(``POST /auth/token``) and asks every route of the avsim app for that week: ``weekly`` gets the
pages and data, ``adhoc`` a bare 403 on each and lists with nothing in them, exactly as Airflow's own
API answers them about the same run. Then a real browser (Playwright, /usr/bin/chromium) shows the
weekly-run tab inside the Airflow UI in its light and in its dark mode (screenshots of both).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.airflow_run import trigger, wait_for_run
from tests.support.stacks import fast_retries, weekly_stack

from avsim.artifacts import run_key_for
from avsim.devstack.stack import LocalStack, free_port
from avsim.manifest.sample import sample_manifest

pytestmark = pytest.mark.integration

RUN_ID = "it__access"
FAB = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
SERVICE = ("avsim-service", "svc-" + secrets.token_hex(8))
WEEKLY = ("weekly", "weekly-" + secrets.token_hex(8))
ADHOC = ("adhoc", "adhoc-" + secrets.token_hex(8))
#: Role -> the DAGs whose runs it may read.
ROLES = {"weekly-reader": ("avsim_weekly", "avsim_weekly_shard"), "adhoc-reader": ("avsim_adhoc",)}
CHROMIUM = "/usr/bin/chromium"

#: Each role is FAB's Viewer limited to some DAGs: Viewer's permissions but "can read on DAGs" (every
#: DAG), "can read on DAG:<id>" for each of its own, and "can read on Plugins", without which the
#: Airflow UI shows no plugin's tab or link (FAB gives it to Op and Admin only).
ROLES_SCRIPT = """
import json, sys
from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder
from avsim.service_role import Permission, sync_role
with get_application_builder() as appbuilder:
    viewer = [Permission(p.action.name, p.resource.name) for p in appbuilder.sm.find_role("Viewer").permissions]
assert Permission("can_read", "DAGs") in viewer
for role, dags in json.loads(sys.argv[1]).items():
    own = [Permission("can_read", f"DAG:{d}") for d in dags] + [Permission("can_read", "Plugins")]
    sync_role(role, [p for p in viewer if p.resource != "DAGs"] + own)
"""


def _airflow(stack: LocalStack, *args: str) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).with_name("airflow")), *args],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])


def _user(stack: LocalStack, login: tuple[str, str], role: str) -> None:
    _airflow(stack, "users", "create", "--username", login[0], "--password", login[1], "--role", role,
             "--firstname", login[0], "--lastname", "test", "--email", f"{login[0]}@example.com")  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    base = tmp_path_factory.mktemp("access")
    port = free_port()
    conn = {"conn_type": "avsim_airflow_api", "host": "127.0.0.1", "port": port}
    env = {
        "AIRFLOW__CORE__AUTH_MANAGER": FAB,
        # avsim's own REST calls (prepare's pools, the deadline tracker) log in as its service account.
        "AIRFLOW_CONN_AVSIM_AIRFLOW_API": json.dumps({**conn, "login": SERVICE[0], "password": SERVICE[1]}),
    }
    with weekly_stack(base, shard_size=2, max_active_shards=2, extra_env=env, port=port) as s:
        yield s


@pytest.fixture(scope="module")
def week(stack: LocalStack) -> dict[str, Any]:
    run = subprocess.run(
        [sys.executable, "-c", ROLES_SCRIPT, json.dumps(ROLES)],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    done = subprocess.run(
        [str(Path(sys.executable).with_name("avsim")), "service-role", "sync", "--role", "avsim-service"],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    _user(stack, SERVICE, "avsim-service")
    _user(stack, WEEKLY, "weekly-reader")
    _user(stack, ADHOC, "adhoc-reader")
    doc = fast_retries(sample_manifest(4, time_scale=0.00002, scenario_fail_rate=0.0, crash_rate=0.0))
    doc["cases"][1]["parameters"]["fakesim"] = {"simulate": "scenario_failed"}
    manifest = stack.home / "access-week.json"
    manifest.write_text(json.dumps(doc))
    trigger(stack, "avsim_weekly", RUN_ID, {"manifest": str(manifest)})
    state = wait_for_run(stack, "avsim_weekly", RUN_ID, timeout=900)
    return {
        "state": state,
        "failed_case": doc["cases"][1]["id"],
        "run_key": run_key_for("avsim_weekly", RUN_ID),
    }


def login(stack: LocalStack, who: tuple[str, str]) -> str:
    """A JWT from the real login endpoint, as a script or the UI's login gets one."""
    req = urllib.request.Request(
        f"{stack.api_url}/auth/token",
        data=json.dumps({"username": who[0], "password": who[1]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return str(json.loads(resp.read())["access_token"])


def get(stack: LocalStack, path: str, token: str) -> tuple[int, str]:
    """(status, body) of a GET with the bearer token, redirects not followed."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    req = urllib.request.Request(f"{stack.api_url}{path}", headers={"Authorization": f"Bearer {token}"})
    try:
        with opener.open(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def week_routes(stack: LocalStack, week: dict[str, Any], token: str) -> list[str]:
    """One URL of every route of the avsim app that shows something of the week."""
    q = urllib.parse.quote
    key, case_id = week["run_key"], week["failed_case"]
    status, body = get(stack, f"/avsim/api/runs/{key}/cases/{case_id}", token)
    assert status == 200, body[:500]
    ti = next(p["task_instance"] for p in json.loads(body)["phases"] if p["phase"] == "simulate")
    tab = f"/avsim/dags/avsim_weekly_shard/runs/{q(ti['run_id'])}/tasks/{ti['task_id']}/mapped/{ti['map_index']}"
    return [
        f"/avsim/dags/avsim_weekly/runs/{RUN_ID}",
        f"/avsim/api/runs/avsim_weekly/{RUN_ID}/progress",
        f"/avsim/dags/avsim_weekly_shard/runs/{q(ti['run_id'])}",
        f"/avsim/dags/avsim_weekly/runs/{RUN_ID}/report",
        tab,
        f"/avsim/runs/{key}/cases/{case_id}",
        f"/avsim/api/runs/{key}/cases/{case_id}",
        f"/avsim/runs/{key}/report",
        f"/avsim/runs/{key}/report/",
        f"/avsim/runs/{key}/files/",
        f"/avsim/runs/{key}/files/report/cases.csv",
    ]


def test_a_user_without_access_to_the_weekly_dag_gets_403_and_nothing(
    stack: LocalStack, week: dict[str, Any]
) -> None:
    assert week["state"] == "success"
    weekly, adhoc = login(stack, WEEKLY), login(stack, ADHOC)
    routes = week_routes(stack, week, weekly)
    for path in routes:
        status, body = get(stack, path, weekly)
        assert status in (200, 307), (path, status, body[:300])
        status, body = get(stack, path, adhoc)
        assert (status, json.loads(body)) == (403, {"detail": "Forbidden"}), (path, status, body[:300])
    # Airflow's own API says the same about this run to the same two users.
    run = f"/api/v2/dags/avsim_weekly/dagRuns/{RUN_ID}"
    assert get(stack, run, weekly)[0] == 200 and get(stack, run, adhoc)[0] == 403
    # The lists hold only what each may read.
    assert get(stack, "/avsim/runs", weekly) == (200, json.dumps([week["run_key"]], separators=(",", ":")))
    assert get(stack, "/avsim/runs", adhoc) == (200, "[]")
    _status, index = get(stack, "/avsim/", adhoc)
    assert RUN_ID not in index and week["run_key"] not in index and "No weekly run yet." in index
    _status, index = get(stack, "/avsim/", weekly)
    assert f"/avsim/dags/avsim_weekly/runs/{RUN_ID}" in index
    # The progress data the first user reads is the week's; the second learns nothing of it.
    doc = json.loads(get(stack, f"/avsim/api/runs/avsim_weekly/{RUN_ID}/progress", weekly)[1])
    assert doc["cases"]["done"] == 4 and doc["failed"]["items"][0]["case_id"] == week["failed_case"]


def test_the_weekly_run_tab_follows_the_airflow_uis_light_and_dark_mode(
    stack: LocalStack, week: dict[str, Any], tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    backgrounds = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            for mode in ("light", "dark"):
                context = browser.new_context(viewport={"width": 1400, "height": 1000})
                context.add_cookies([{"name": "_token", "value": login(stack, WEEKLY), "url": stack.api_url}])
                # The Airflow UI keeps the user's choice in localStorage["theme"].
                context.add_init_script(f"window.localStorage.setItem('theme', '{mode}')")
                page = context.new_page()
                page.goto(f"{stack.api_url}/dags/avsim_weekly/runs/{RUN_ID}/plugin/avsim-progress")
                try:
                    page.frame_locator("iframe").locator("body[data-loaded=true]").wait_for(timeout=90_000)
                finally:
                    page.screenshot(path=str(tmp_path / f"weekly-run-tab-{mode}.png"))
                assert page.evaluate("document.documentElement.classList.contains('dark')") == (
                    mode == "dark"
                )
                inner = next(
                    f for f in page.frames if f.url.endswith(f"/avsim/dags/avsim_weekly/runs/{RUN_ID}")
                )
                assert inner.evaluate("document.documentElement.dataset.theme") == mode
                backgrounds[mode] = inner.evaluate("getComputedStyle(document.body).backgroundColor")
                context.close()
        finally:
            browser.close()
    assert backgrounds == {"light": "rgb(255, 255, 255)", "dark": "rgb(9, 9, 11)"}
