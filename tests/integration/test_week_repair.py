"""The weekly run is the one place to watch and repair a week, on a real stack with real logins.

A 12-case week (no canary, shards of 4) runs on the real scheduler, dag-processor, triggerer and
API server on PostgreSQL, with the simple auth manager and named users (not the all-admins mode):
``engineer`` (role user) makes the clears, as an engineer would, and avsim's repair authenticates
as ``avsim-repair`` (role user) through the ``avsim_airflow_api`` connection, as in production.

One case of shard 1 and one of shard 2 crash in ``evaluate`` until a marker file exists (a broken
node pool that someone then fixes); a case of shard 3 fails its scenario (a result). The weekly run
must end failed with exactly those two ``shards`` map indexes failed and labelled; after the fix,
one clear of the weekly run's failed task instances (REST API in the first test, the Airflow UI's
"Clear → Only failed" in headless Chromium in the second) must rerun only those cases' failed
phases and their downstream, then the shards' summaries, then the report, and end the week
``success`` with the report saying it was repaired in place.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support import airflow_run
from tests.support.airflow_run import query, trigger, wait_for_run
from tests.support.stacks import fast_retries, read_json, weekly_stack

from avsim.artifacts import RunLayout, run_key_for
from avsim.devstack.stack import LocalStack, free_port
from avsim.manifest.sample import sample_manifest

pytestmark = pytest.mark.integration

ENGINEER, ENGINEER_PASSWORD = "engineer", "clears-failed-tasks"
BOT, BOT_PASSWORD = "avsim-repair", "least-privilege"
SHARD_SIZE = 4
SHARD_DAG = "avsim_weekly_shard"
CHROMIUM = "/usr/bin/chromium"
#: Screenshots of the UI steps (kept for a look after a failure).
SHOTS = Path("/tmp/avsim-test-shots")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    base = tmp_path_factory.mktemp("repair")
    passwords = base / "passwords.json"
    passwords.write_text(json.dumps({ENGINEER: ENGINEER_PASSWORD, BOT: BOT_PASSWORD}))
    env = {
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ENGINEER}:user,{BOT}:user",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
    }
    port = free_port()
    # The repair's connection: the API server's URL and the bot's login, as a deployment sets it.
    env["AIRFLOW_CONN_AVSIM_AIRFLOW_API"] = json.dumps(
        {
            "conn_type": "avsim_airflow_api",
            "host": "127.0.0.1",
            "port": port,
            "login": BOT,
            "password": BOT_PASSWORD,
        }
    )
    with weekly_stack(base, shard_size=SHARD_SIZE, max_active_shards=3, extra_env=env, port=port) as s:
        yield s


def token(stack: LocalStack) -> str:
    return airflow_run.token(stack, (ENGINEER, ENGINEER_PASSWORD))


def api(stack: LocalStack, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """The REST API as the engineer (role user) calls it."""
    return airflow_run.api(stack, method, path, body, login=(ENGINEER, ENGINEER_PASSWORD))


def start_broken_week(stack: LocalStack, run_id: str, then: Any = None) -> dict[str, Any]:
    """Trigger a week whose two crashing cases stay broken until ``marker`` exists; wait for it
    (calling ``then()`` once it is triggered)."""
    doc = sample_manifest(
        3 * SHARD_SIZE, time_scale=0.00002, scenario_fail_rate=0.0, crash_rate=0.0, canary={"enabled": False}
    )
    fast_retries(doc)  # the crashes' retries wait 1 s, not 30 s then 60 s
    marker = stack.home / f"{run_id}.fixed"
    standard = [i for i, c in enumerate(doc["cases"]) if c["graph"] == "standard"]
    crash_1 = next(i for i in standard if i < SHARD_SIZE)
    crash_2 = next(i for i in standard if SHARD_SIZE <= i < 2 * SHARD_SIZE)
    for i in (crash_1, crash_2):
        doc["cases"][i]["parameters"]["fakesim"] = {"evaluate": f"crash_until:file://{marker}"}
    scenario = 2 * SHARD_SIZE
    doc["cases"][scenario]["parameters"]["fakesim"] = {"simulate": "scenario_failed"}
    manifest = stack.home / f"{run_id}.json"
    manifest.write_text(json.dumps(doc))
    trigger(stack, "avsim_weekly", run_id, {"manifest": str(manifest)})
    if then is not None:
        then()
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=900) == "failed"
    return {
        "marker": marker,
        "crashed": {doc["cases"][crash_1]["id"]: 1, doc["cases"][crash_2]["id"]: 2},
        "scenario_failed": doc["cases"][scenario]["id"],
        "layout": RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for("avsim_weekly", run_id)),
    }


def parent_states(stack: LocalStack, run_id: str) -> dict[tuple[str, int], tuple[str, str | None]]:
    rows = query(
        stack,
        "SELECT task_id, map_index, state, rendered_map_index FROM task_instance "
        "WHERE dag_id = 'avsim_weekly' AND run_id = :r",
        r=run_id,
    )
    return {(t, m): (s, label) for t, m, s, label in rows}


def child_tries(stack: LocalStack, run_id: str) -> dict[tuple[str, str, int], tuple[int, str, str | None]]:
    rows = query(
        stack,
        "SELECT run_id, task_id, map_index, try_number, state, rendered_map_index FROM task_instance "
        "WHERE dag_id = :d AND position(:p in run_id) = 1",
        d=SHARD_DAG,
        p=f"{run_id}__",
    )
    return {(r, t, m): (n, s, label) for r, t, m, n, s, label in rows}


def check_failed_week(stack: LocalStack, run_id: str, week: dict[str, Any]) -> None:
    """The failure shows on the weekly run: which shards, how many, why; scenario failures stay green."""
    states = parent_states(stack, run_id)
    shards = {m: v for (t, m), v in states.items() if t == "shards"}
    assert shards == {
        0: ("failed", "shard 1 · 1 need attention"),
        1: ("failed", "shard 2 · 1 need attention"),
        2: ("success", "shard 3"),  # its scenario failure is a result
    }
    # The run-level phases and the report ran; the report failed after writing, naming the counts.
    assert states[("run_phases.weekly_summary", -1)][0] == "success"
    assert states[("report", -1)][0] == "failed"
    report = read_json(f"{week['layout'].report_dir}/report.json")
    assert report["verdict"]["state"] == "needs_attention" and report["verdict"]["shards"] == {
        "1": {"infra_failed": 1},
        "2": {"infra_failed": 1},
    }
    assert report["totals"]["scenario_failed"] == 1 and report["totals"]["infra_failed"] == 2
    runs = dict(query(stack, "SELECT run_id, state FROM dag_run WHERE dag_id = :d", d=SHARD_DAG))
    assert {r: s for r, s in runs.items() if r.startswith(f"{run_id}__")} == {
        f"{run_id}__shard_0001": "failed",
        f"{run_id}__shard_0002": "failed",
        f"{run_id}__shard_0003": "success",
    }
    logs = stack.home / "logs" / "dag_id=avsim_weekly" / f"run_id={run_id}" / "task_id=shards"
    text = (logs / "map_index=0" / "attempt=1.log").read_text()
    case = next(c for c, shard in week["crashed"].items() if shard == 1)
    assert f"shard 1: 1 of 4 cases need attention (infra_failed 1): {case}/evaluate" in text


def check_repaired_week(
    stack: LocalStack,
    run_id: str,
    week: dict[str, Any],
    before: dict[tuple[str, str, int], tuple[int, str, str | None]],
) -> None:
    """Only the crashed cases' failed phase and its downstream reran, then summarize; all green."""
    after = child_tries(stack, run_id)
    assert set(after) == set(before)
    new_tries = {k for k in after if after[k][0] != before[k][0]}
    expected = set()
    for case, shard in week["crashed"].items():
        shard_run = f"{run_id}__shard_{shard:04d}"
        [map_index] = {m for (r, t, m), v in before.items() if r == shard_run and v[2] == case}
        expected |= {
            (shard_run, "standard.evaluate", map_index),
            (shard_run, "standard.report", map_index),
            (shard_run, "summarize", -1),
        }
    assert new_tries == expected
    assert all(state in ("success", "skipped") for _n, state, _l in after.values())
    states = parent_states(stack, run_id)
    assert {m: v for (t, m), v in states.items() if t == "shards"} == {
        0: ("success", "shard 1"),
        1: ("success", "shard 2"),
        2: ("success", "shard 3"),
    }
    report = read_json(f"{week['layout'].report_dir}/report.json")
    assert report["verdict"]["state"] == "passed"
    assert report["totals"]["infra_failed"] == 0 and report["totals"]["passed"] == 11
    assert report["totals"]["scenario_failed"] == 1
    repairs = report["repairs"]
    assert [(r["shard"], r["parent_try"]) for r in repairs] == [(1, 2), (2, 2)] or [
        (r["shard"], r["parent_try"]) for r in sorted(repairs, key=lambda r: r["shard"])
    ] == [(1, 2), (2, 2)]
    assert all(r["cleared"] == 3 for r in repairs)
    html = Path(f"{week['layout'].report_dir}/report.html".removeprefix("file://")).read_text()
    assert "repaired in place" in html


# Long tier: make test repairs a week through the REST API's clear in tests/integration/test_distributed.py
# (one failed shard, on the Celery stack with FAB logins); this one repairs two shards at once.
@pytest.mark.long
def test_one_clear_of_the_weekly_run_through_the_rest_api_repairs_every_failed_shard(
    stack: LocalStack,
) -> None:
    run_id = "it__repair_rest"
    week = start_broken_week(stack, run_id)
    check_failed_week(stack, run_id, week)
    before = child_tries(stack, run_id)

    week["marker"].write_text("the node pool is fixed")
    cleared = api(
        stack,
        "POST",
        "/api/v2/dags/avsim_weekly/clearTaskInstances",
        {"dag_run_id": run_id, "only_failed": True, "include_downstream": True, "dry_run": False},
    )
    assert {(t["task_id"], t["map_index"]) for t in cleared["task_instances"]} == {
        ("shards", 0),
        ("shards", 1),
        ("report", -1),
    }
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=600) == "success"
    check_repaired_week(stack, run_id, week, before)


def test_clear_only_failed_in_the_airflow_ui_repairs_the_week(stack: LocalStack, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(exist_ok=True)
    run_id = "it__repair_ui"
    week = start_broken_week(stack, run_id)
    check_failed_week(stack, run_id, week)
    before = child_tries(stack, run_id)
    week["marker"].write_text("the node pool is fixed")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            context.add_cookies([{"name": "_token", "value": token(stack), "url": stack.api_url}])
            page = context.new_page()
            page.goto(f"{stack.api_url}/dags/avsim_weekly/runs/{run_id}")
            # The run page's clear button (an icon labelled "Clear Dag Run", or its shortcut's tooltip
            # "Press shift+c to clear"), then "Clear only failed tasks" in its dialog, then "Confirm"
            # (the labels of Airflow 3.3's English UI).
            try:
                clear = page.get_by_role("button", name=re.compile(r"Clear Dag Run|shift\+c to clear"))
                clear.first.click(timeout=60_000)
                page.get_by_text("Clear only failed tasks").first.click(timeout=30_000)
                # The dialog's dry run: the two failed shards map indexes and the report.
                page.get_by_text("Affected Tasks: 3").first.wait_for(timeout=60_000)
                page.screenshot(path=str(SHOTS / "clear-dialog.png"))
                page.get_by_role("button", name="Confirm").first.click(timeout=30_000)
            except Exception:
                page.screenshot(path=str(SHOTS / "clear-failed.png"), full_page=True)
                raise
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                [(state,)] = query(
                    stack, "SELECT state FROM dag_run WHERE dag_id = 'avsim_weekly' AND run_id = :r", r=run_id
                )
                if state != "failed":
                    break
                time.sleep(0.5)
            assert state != "failed", "the UI's clear did not restart the run"
        finally:
            browser.close()
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=600) == "success"
    check_repaired_week(stack, run_id, week, before)


def task_log(stack: LocalStack, run_id: str, task_id: str, map_index: int) -> str:
    logs = stack.home / "logs" / "dag_id=avsim_weekly" / f"run_id={run_id}" / f"task_id={task_id}"
    return (logs / f"map_index={map_index}" / "attempt=1.log").read_text()


def run_state(stack: LocalStack, run_id: str) -> str:
    [(state,)] = query(
        stack, "SELECT state FROM dag_run WHERE dag_id = 'avsim_weekly' AND run_id = :r", r=run_id
    )
    return str(state)


# Long tier: two weeks, about 5 minutes on 2 cores.
@pytest.mark.long
def test_a_repair_of_last_week_runs_at_once_beside_this_week_and_below_it(stack: LocalStack) -> None:
    """Issue 31 item 9. Last week fails (two cases crash until the pool is fixed) while this week, a
    slower one, has started after it. The clear of last week's failed task instances must start it at
    once (not queue it behind this week, as max_active_runs=1 did), and its repaired phases must rank
    below this week's (the scheduler orders by weight, then logical date, which the older week wins)."""
    last, this = "it__last_week", "it__this_week"
    doc = sample_manifest(
        3 * SHARD_SIZE, time_scale=0.04, scenario_fail_rate=0.0, crash_rate=0.0, canary={"enabled": False}
    )
    manifest = stack.home / f"{this}.json"
    manifest.write_text(json.dumps(doc))
    # Last week first (its run_after is earlier), this week right after it.
    week = start_broken_week(
        stack, last, then=lambda: trigger(stack, "avsim_weekly", this, {"manifest": str(manifest)})
    )
    check_failed_week(stack, last, week)
    before = child_tries(stack, last)
    # With one active weekly run, this week stayed queued behind last week (seen before the fix).
    assert run_state(stack, this) == "running", "this week is not running beside last week"

    week["marker"].write_text("the node pool is fixed")
    api(
        stack,
        "POST",
        "/api/v2/dags/avsim_weekly/clearTaskInstances",
        {"dag_run_id": last, "only_failed": True, "include_downstream": True, "dry_run": False},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and run_state(stack, last) != "running":
        time.sleep(0.5)
    # At once, beside this week (with one active weekly run it stayed queued until this week ended).
    assert (run_state(stack, last), run_state(stack, this)) == ("running", "running")

    # The repaired phases (the crashed cases' evaluate, cleared by the shards' repair) rank below every
    # phase of this week of the same task: the same path part, the earlier week's base.
    crashed = {
        (r, m): n
        for (r, t, m), (n, _s, label) in before.items()
        if t == "standard.evaluate" and label in week["crashed"]
    }
    assert len(crashed) == 2
    deadline = time.monotonic() + 120
    repaired: list[int] = []
    while time.monotonic() < deadline and len(repaired) < 2:
        rows = query(
            stack,
            "SELECT run_id, map_index, try_number, priority_weight FROM task_instance WHERE dag_id = :d "
            "AND position(:p in run_id) = 1 AND task_id = 'standard.evaluate'",
            d=SHARD_DAG,
            p=f"{last}__",
        )
        repaired = [w for r, m, n, w in rows if (r, m) in crashed and n > crashed[r, m]]
        time.sleep(1)
    current = [
        w
        for (w,) in query(
            stack,
            "SELECT priority_weight FROM task_instance WHERE dag_id = :d AND position(:p in run_id) = 1 "
            "AND task_id = 'standard.evaluate'",
            d=SHARD_DAG,
            p=f"{this}__",
        )
    ]
    assert len(repaired) == 2 and current
    from avsim.priority import EARLIER_WEEK_BASE, WEEKLY_BASE

    assert max(repaired) < min(current)
    assert {w - EARLIER_WEEK_BASE for w in repaired} == {w - WEEKLY_BASE for w in current}

    assert wait_for_run(stack, "avsim_weekly", last, timeout=600) == "success"
    check_repaired_week(stack, last, week, before)
    assert wait_for_run(stack, "avsim_weekly", this, timeout=600) == "success"
    # Every shard run was created by its shard_start task (or that task's admission trigger), and its
    # shards task waited on the bounded trigger (item 10), not on a plain DagStateTrigger of Airflow's
    # task runner.
    assert f"shard run {this}__shard_0001 created" in task_log(stack, this, "shard_start", 0)
    assert "Triggering Dag Run" not in task_log(stack, this, "shards", 0)
