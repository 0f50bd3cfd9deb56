"""The weekly-run page in a real browser, on a real stack with real authentication.

A small weekly run (10 cases: a canary shard run and two shard runs; a forced scenario failure,
a forced crash) runs on the real scheduler, dag-processor, triggerer and API server on
PostgreSQL, with the simple auth manager and a viewer account (not the all-admins mode).
Headless Chromium (Playwright driving /usr/bin/chromium) opens the page with that user's session
cookie and must show the ledger's counts, the failed cases and links that work. Requests without
a token, or with a forged one, are refused. Every phase task instance that ran carries the extra
link Airflow stores as an XCom (``_link_AvsimArtifactsLink``), the API returns it, the task
instance's page in the Airflow UI shows it and it opens; the task instance's *avsim case* tab shows
its case page.

A second week on the same stack is stopped by the canary gate (its build crashes in every first
phase): its page says the cases that never started are not started (not waiting), makes no pace
or finish claim for the ended run, does not show the run-level summary as the bad build's victim,
and draws the five-minute week across the chart with the far deadline as an annotation.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support import airflow_run
from tests.support.airflow_run import query, trigger, wait_for_run
from tests.support.stacks import fast_retries, read_json, weekly_stack

from avsim.artifacts import RunLayout, run_key_for
from avsim.devstack.stack import LocalStack
from avsim.ledger.store import Ledger
from avsim.manifest.sample import sample_manifest

# Long: a stack and four weeks in Chromium, about 2.5 minutes on 2 cores (test_ui_access keeps the
# browser and the page in make test).
pytestmark = [pytest.mark.integration, pytest.mark.long]

RUN_ID = "it__ui"
STOPPED_RUN_ID = "it__ui_stopped"
SHARD_DAG = "avsim_weekly_shard"
LINK_KEYS = {"_link_AvsimArtifactsLink": "artifacts"}
USER, PASSWORD = "engineer", "week-watcher"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    base = tmp_path_factory.mktemp("ui")
    passwords = base / "passwords.json"
    passwords.write_text(json.dumps({USER: PASSWORD}))
    env = {
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:viewer",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        # The tracker ends with the shard runs at its next pass: keep the week (and this test) short.
        "AIRFLOW__AVSIM__DEADLINE_INTERVAL_SECONDS": "5",
    }
    with weekly_stack(base, shard_size=4, max_active_shards=2, extra_env=env) as s:
        yield s


@pytest.fixture(scope="module")
def week(stack: LocalStack) -> dict[str, Any]:
    doc = sample_manifest(
        10,
        time_scale=0.00002,
        scenario_fail_rate=0.0,
        crash_rate=0.0,
        canary={"share": 0.3, "min_cases": 3, "max_failure_rate": 0.9},
    )
    fast_retries(doc)  # the crashing case's retries wait 1 s, not 30 s then 60 s
    doc["cases"][7]["parameters"]["fakesim"] = {"simulate": "scenario_failed"}
    doc["cases"][8]["parameters"]["fakesim"] = {"evaluate": "crash"}
    manifest = stack.home / "ui-week.json"
    manifest.write_text(json.dumps(doc))
    trigger(stack, "avsim_weekly", RUN_ID, {"manifest": str(manifest)})
    # The crashed case needs attention: its shard run and the weekly run end failed.
    assert wait_for_run(stack, "avsim_weekly", RUN_ID, timeout=900) == "failed"
    layout = RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for("avsim_weekly", RUN_ID))
    # The ledger's committed case classes: what the page must count.
    ledger_classes: dict[str, int] = {}
    for summary in Ledger(layout).shard_summaries():
        for case in summary.cases:
            ledger_classes[case.outcome_name] = ledger_classes.get(case.outcome_name, 0) + 1
    return {
        "layout": layout,
        "ledger": ledger_classes,
        "report": read_json(f"{layout.report_dir}/report.json"),
        "scenario_failed": doc["cases"][7]["id"],
        "crashed": doc["cases"][8]["id"],
    }


def token(stack: LocalStack) -> str:
    return airflow_run.token(stack, (USER, PASSWORD))


def status(stack: LocalStack, path: str, bearer: str | None = None, cookie: str | None = None) -> int:
    headers = {}
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    if cookie is not None:
        headers["Cookie"] = f"_token={cookie}"
    try:
        with urllib.request.urlopen(
            urllib.request.Request(f"{stack.api_url}{path}", headers=headers), timeout=60
        ):
            return 200
    except urllib.error.HTTPError as exc:
        return exc.code


def forge(real: str) -> str:
    """The real token with its claims changed (user "admin"): the signature no longer matches."""
    head, body, sig = real.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["sub"] = "admin"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"{head}.{forged}.{sig}"


def test_the_page_refuses_requests_without_a_valid_token(stack: LocalStack, week: dict[str, Any]) -> None:
    api = f"/avsim/api/runs/avsim_weekly/{RUN_ID}/progress"
    page = f"/avsim/dags/avsim_weekly/runs/{RUN_ID}"
    files = f"/avsim/runs/{week['layout'].run_key}/files/manifest/head.json"
    real = token(stack)
    for path in (api, page, files, "/avsim/"):
        assert status(stack, path) == 401, path
        assert status(stack, path, bearer="not-a-jwt") == 403, path
        assert status(stack, path, bearer=forge(real)) == 403, path
        assert status(stack, path, cookie=forge(real)) == 403, path
        assert status(stack, path, bearer=real) == 200, path
        assert status(stack, path, cookie=real) == 200, path
    # Airflow's own API answers the same way: the page is behind Airflow's authentication.
    assert status(stack, "/api/v2/dags") == 401 and status(stack, "/api/v2/dags", bearer=forge(real)) == 403


CASE_CLASSES = ("passed", "scenario_failed", "bad_input", "infra_failed", "preempted", "bad_build")


def launch(pw: Any) -> Any:
    return pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


def signed_in(browser: Any, stack: LocalStack) -> Any:
    """A browser context with the viewer's session cookie, as the Airflow UI's login leaves it."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_cookies([{"name": "_token", "value": token(stack), "url": stack.api_url}])
    return context


def test_the_page_in_a_browser_shows_the_ledgers_counts_and_working_links(
    stack: LocalStack, week: dict[str, Any], tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    ledger = week["ledger"]
    assert sum(ledger.values()) == 10 and ledger.get("scenario_failed", 0) >= 1
    assert ledger.get("infra_failed", 0) >= 1
    assert {k: v for k, v in week["report"]["totals"].items() if k in CASE_CLASSES and v} == ledger
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            context = signed_in(browser, stack)
            page = context.new_page()
            page.goto(f"{stack.api_url}/avsim/dags/avsim_weekly/runs/{RUN_ID}")
            page.wait_for_selector("body[data-loaded=true]", timeout=60_000)

            def count(key: str) -> int:
                return int(page.locator(f'[data-count="{key}"] .n').inner_text().replace(",", ""))

            assert count("planned") == 10 and count("done") == 10
            assert count("running") == 0 and count("waiting") == 0
            for cls in CASE_CLASSES:  # a card per class the ledger has, none for the others
                if ledger.get(cls):
                    assert count(f"class-{cls}") == ledger[cls], cls
                else:
                    assert page.locator(f'[data-count="class-{cls}"]').count() == 0, cls
            # Failed scenarios are results: their own neutral card; red only for what needs attention.
            attention = sum(n for c, n in ledger.items() if c not in ("passed", "scenario_failed"))
            assert count("attention") == attention >= 1
            assert count("scenario_failed") == ledger["scenario_failed"]
            assert "attention" in (page.locator('[data-count="attention"] .n').get_attribute("class") or "")
            assert "calm" in (page.locator('[data-count="scenario_failed"] .n').get_attribute("class") or "")
            # Per-phase progress: every case ran prepare and evaluate; the crash is evaluate's.
            evaluate = page.locator('tr[data-phase="evaluate"]').inner_text()
            assert "10 / 10" in evaluate and "infra_failed 1" in evaluate
            assert "scenario_failed 1" in page.locator('tr[data-phase="simulate"]').inner_text()
            assert "upstream_failed" in page.locator('tr[data-phase="report"]').inner_text()
            # Budget, deadline, canary, breaker and shards, from the run's documents.
            assert float(page.locator('[data-count="gpu-planned"] .n').inner_text().replace(",", "")) > 0
            # The run has ended: the tracker's last estimate is no longer a claim the page makes.
            assert "no finish estimate" in page.locator("#deadline-note").inner_text()
            assert page.locator("[data-verdict]").first.get_attribute("data-verdict") == "ended"
            assert page.locator("[data-canary]").first.get_attribute("data-canary") == "passed"
            assert page.locator("[data-breaker]").first.get_attribute("data-breaker") == "closed"
            assert page.locator("#shards").inner_text().startswith("2 done · 0 running · 0 queued")
            rows = page.locator("#failed-table tbody tr")
            listed = {rows.nth(i).get_attribute("data-case") for i in range(rows.count())}
            assert {week["scenario_failed"], week["crashed"]} <= listed
            page.screenshot(path=str(tmp_path / "weekly-run-page.png"), full_page=True)

            crashed = page.locator(f'tr[data-case="{week["crashed"]}"]')
            assert "infra_failed" in crashed.inner_text() and "evaluate" in crashed.inner_text()
            artifacts = crashed.get_by_role("link", name="artifacts").get_attribute("href")
            ti_link = crashed.get_by_role("link", name="task instance").get_attribute("href")
            assert artifacts and ti_link and "/mapped/" in ti_link

            # The artifacts link lists the attempts of the crashed phase.
            listing = context.request.get(f"{stack.api_url}{artifacts}")
            assert listing.ok and "attempt-1/" in listing.text()

            # The case link opens the case page: the phases, the crashed attempts, their reason.
            crashed.get_by_role("link", name=week["crashed"]).click()
            page.wait_for_selector('section[data-phase="evaluate"]', timeout=30_000)
            evaluate = page.locator('section[data-phase="evaluate"]').inner_text()
            assert "infra_failed" in evaluate and "failed, try" in evaluate
            page.screenshot(path=str(tmp_path / "case-page.png"), full_page=True)

            # The task-instance link opens that mapped task instance in the Airflow UI.
            page.goto(f"{stack.api_url}{ti_link}")
            page.wait_for_selector(f"text={week['crashed']}", timeout=60_000)
            page.screenshot(path=str(tmp_path / "task-instance.png"))
        finally:
            browser.close()
    assert (tmp_path / "weekly-run-page.png").stat().st_size > 10_000


def _json(value: Any) -> Any:
    """An XCom value as the driver returns the JSON column (decoded, or still JSON text)."""
    if isinstance(value, str | bytes):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def test_phase_task_instances_link_to_their_case_page_and_artifacts(
    stack: LocalStack, week: dict[str, Any], tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    key = week["layout"].run_key
    rows = query(
        stack,
        "SELECT ti.run_id, ti.task_id, ti.map_index, ti.rendered_map_index, ti.state, x.key, x.value "
        "FROM task_instance ti LEFT JOIN xcom x ON x.dag_id = ti.dag_id AND x.run_id = ti.run_id "
        "AND x.task_id = ti.task_id AND x.map_index = ti.map_index AND x.key = :files_key "
        "WHERE ti.dag_id = :dag AND position(:prefix in ti.run_id) = 1 AND ti.map_index >= 0",
        dag=SHARD_DAG,
        prefix=f"{RUN_ID}__",
        files_key="_link_AvsimArtifactsLink",
    )
    links: dict[tuple[str, str, int], dict[str, str]] = {}
    tis: dict[tuple[str, str, int], tuple[str, str]] = {}
    for run_id, task_id, map_index, case_id, state, xkey, value in rows:
        tis[(run_id, task_id, map_index)] = (str(case_id), str(state))
        if xkey is not None:
            links.setdefault((run_id, task_id, map_index), {})[LINK_KEYS[xkey]] = _json(value)
    runs = {r for r, _t, _m in tis}
    assert runs == {f"{RUN_ID}__canary", f"{RUN_ID}__shard_0001", f"{RUN_ID}__shard_0002"}
    ran = {k for k, (_c, state) in tis.items() if state in ("success", "failed")}
    assert len({tis[k][0] for k in ran}) == 10, "every case ran a phase"
    # Airflow pushes the links when a try ends, whatever its state; tasks that never ran have none:
    # the GPU phases' on-demand twins (no preemption this week: skipped) and upstream_failed phases.
    assert set(links) == ran
    for (run_id, task_id, map_index), found in links.items():
        case_id = tis[(run_id, task_id, map_index)][0]
        phase = task_id.split(".", 1)[1].removesuffix("_on_demand")
        assert found == {
            "artifacts": f"/avsim/runs/{key}/files/cases/{urllib.parse.quote(case_id, safe='')}/{phase}/",
        }, (run_id, task_id, map_index)
    twins = {k: tis[k][1] for k in tis if k[1].endswith("_on_demand")}
    assert twins and set(twins.values()) <= {"skipped", "upstream_failed"}

    # The crashed phase: its links through Airflow's REST API (what the UI reads), as the viewer.
    (run_id, task_id, map_index) = next(
        k for k, (c, state) in tis.items() if c == week["crashed"] and state == "failed"
    )
    assert task_id.endswith(".evaluate")
    path = (
        f"/api/v2/dags/{SHARD_DAG}/dagRuns/{urllib.parse.quote(run_id, safe='')}/taskInstances/"
        f"{urllib.parse.quote(task_id, safe='')}/links?map_index={map_index}"
    )
    req = urllib.request.Request(
        f"{stack.api_url}{path}", headers={"Authorization": f"Bearer {token(stack)}"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        api_links = json.loads(resp.read())["extra_links"]
    expected = links[(run_id, task_id, map_index)]
    assert api_links == {"avsim artifacts": expected["artifacts"]}
    case_page = f"/avsim/runs/{key}/cases/{urllib.parse.quote(week['crashed'], safe='')}"

    # In the Airflow UI: the task instance's details show the link, which opens the phase's artifacts;
    # its "avsim case" tab (the plugin's view of the task instance) shows the case page.
    ti_base = (
        f"{stack.api_url}/dags/{SHARD_DAG}/runs/{urllib.parse.quote(run_id, safe='')}/tasks/"
        f"{urllib.parse.quote(task_id, safe='')}/mapped/{map_index}"
    )
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = signed_in(browser, stack).new_page()
            page.goto(f"{ti_base}/details")
            artifacts_link = page.locator(f'a[href="{expected["artifacts"]}"]')
            artifacts_link.wait_for(timeout=60_000)
            assert artifacts_link.inner_text() == "avsim artifacts"
            page.screenshot(path=str(tmp_path / "task-instance-links.png"), full_page=True)
            artifacts_link.click()
            page.wait_for_url(f"{stack.api_url}{expected['artifacts']}", timeout=30_000)
            assert "attempt-1/" in page.locator("main").inner_text()
            page.goto(f"{ti_base}/plugin/avsim-case")
            frame = page.frame_locator("iframe")
            frame.locator('section[data-phase="evaluate"]').wait_for(timeout=60_000)
            assert week["crashed"] in frame.locator("h1").inner_text()
            page.screenshot(path=str(tmp_path / "task-instance-case-tab.png"), full_page=True)
            assert any(f.url == f"{stack.api_url}{case_page}" for f in page.frames), [
                f.url for f in page.frames
            ]
        finally:
            browser.close()


@pytest.fixture(scope="module")
def stopped_week(stack: LocalStack) -> dict[str, Any]:
    """A 12-case week whose build crashes in every first phase: the canary gate stops it."""
    doc = sample_manifest(
        12,
        seed=31,  # its own build digest, so its own breaker: the other week's build stays closed
        time_scale=0.00002,
        scenario_fail_rate=0.0,
        crash_rate=0.0,
        canary={"share": 0.1, "min_cases": 4, "max_failure_rate": 0.25},
    )
    fast_retries(doc)
    for graph in doc["graphs"].values():
        graph["phases"]["prepare"]["args"] += ["--crash-rate", "1"]
    manifest = stack.home / "ui-stopped-week.json"
    manifest.write_text(json.dumps(doc))
    trigger(stack, "avsim_weekly", STOPPED_RUN_ID, {"manifest": str(manifest)})
    assert wait_for_run(stack, "avsim_weekly", STOPPED_RUN_ID, timeout=600) == "failed"
    layout = RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for("avsim_weekly", STOPPED_RUN_ID))
    assert read_json(layout.canary_gate)["state"] == "failed"
    return {"layout": layout, "cases": 12, "canary": 4}


def test_a_week_stopped_by_the_canary_gate_reads_right(
    stack: LocalStack, stopped_week: dict[str, Any], tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = signed_in(browser, stack).new_page()
            page.goto(f"{stack.api_url}/avsim/dags/avsim_weekly/runs/{STOPPED_RUN_ID}")
            page.wait_for_selector("body[data-loaded=true]", timeout=60_000)
            page.screenshot(path=str(tmp_path / "stopped-week.png"), full_page=True)

            def count(key: str) -> int:
                return int(page.locator(f'[data-count="{key}"] .n').inner_text().replace(",", ""))

            # The 8 cases past the canary never started and never will until someone acts.
            assert count("planned") == 12 and count("done") == 4
            assert page.locator('[data-count="waiting"]').count() == 0
            assert count("not_started") == 8
            assert (
                "stopped by the canary gate"
                in page.locator('[data-count="not_started"]').inner_text().lower()
            )
            # The crashed canary cases need attention; nothing else is red.
            assert count("attention") == 4 and count("scenario_failed") == 0
            # No pace or finish claim for the ended run.
            note = page.locator("#timeline-note").inner_text()
            assert "ahead by" not in note and "behind by" not in note and "no pace claim" in note
            assert "no finish estimate" in page.locator("#deadline-note").inner_text()
            assert page.locator('[data-count="gpus-needed"] .n').inner_text() == "—"
            assert page.locator("[data-canary]").first.get_attribute("data-canary") == "failed"
            # The run-level summary is shown as what it did, never as the bad build's bad_build victim.
            summary = page.locator('tr[data-run-phase="weekly_summary"]')
            assert summary.count() == 1
            assert summary.get_attribute("data-shown") in ("passed", "not_run"), summary.inner_text()
            assert "bad build" not in summary.inner_text() and summary.locator(".warn").count() == 0
            # The chart spans the minutes the week ran; its deadline, days away, is an annotation.
            svg = page.locator("#timeline-svg")
            assert svg.locator("line[data-series=deadline]").count() == 0
            assert "later →" in (svg.locator("text[data-series=deadline]").text_content() or "")
        finally:
            browser.close()
