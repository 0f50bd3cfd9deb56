"""The weekly-run page in a real browser, on a real stack with real authentication.

A small weekly run (a forced scenario failure, a forced crash) runs on the real scheduler,
dag-processor, triggerer and API server on PostgreSQL, with the simple auth manager and a
viewer account (not the all-admins mode). Headless Chromium (Playwright driving /usr/bin/chromium)
opens the page with that user's session cookie and must show the ledger's counts, the failed
cases and links that work. Requests without a token, or with a forged one, are refused.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.airflow_run import trigger, wait_for_run
from tests.support.stacks import read_json, weekly_stack

from avsim.artifacts import RunLayout
from avsim.dagbuild.tasks import run_key_for
from avsim.manifest.sample import sample_manifest
from avsim.stack import LocalStack

pytestmark = pytest.mark.integration

RUN_ID = "it__ui"
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
    doc["cases"][7]["parameters"]["fakesim"] = {"simulate": "scenario_failed"}
    doc["cases"][8]["parameters"]["fakesim"] = {"evaluate": "crash"}
    manifest = stack.home / "ui-week.json"
    manifest.write_text(json.dumps(doc))
    trigger(stack, "avsim_weekly", RUN_ID, {"manifest": str(manifest)})
    assert wait_for_run(stack, "avsim_weekly", RUN_ID, timeout=900) == "success"
    layout = RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for("avsim_weekly", RUN_ID))
    return {
        "layout": layout,
        "report": read_json(f"{layout.report_dir}/report.json"),
        "scenario_failed": doc["cases"][7]["id"],
        "crashed": doc["cases"][8]["id"],
    }


def token(stack: LocalStack) -> str:
    req = urllib.request.Request(
        f"{stack.api_url}/auth/token",
        data=json.dumps({"username": USER, "password": PASSWORD}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return str(json.loads(resp.read())["access_token"])


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


def test_the_page_in_a_browser_shows_the_ledgers_counts_and_working_links(
    stack: LocalStack, week: dict[str, Any], tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    totals = week["report"]["totals"]
    assert totals["cases"] == 10 and totals["scenario_failed"] >= 1 and totals["infra_failed"] >= 1
    session = token(stack)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            context.add_cookies([{"name": "_token", "value": session, "url": stack.api_url}])
            page = context.new_page()
            page.goto(f"{stack.api_url}/avsim/dags/avsim_weekly/runs/{RUN_ID}")
            page.wait_for_selector("body[data-loaded=true]", timeout=60_000)

            def count(key: str) -> int:
                return int(page.locator(f'[data-count="{key}"] .n').inner_text().replace(",", ""))

            assert count("planned") == 10 and count("done") == 10
            assert count("running") == 0 and count("waiting") == 0
            for cls in ("passed", "scenario_failed", "infra_failed"):
                assert count(f"class-{cls}") == totals[cls], cls
            assert count("failed") == totals["cases"] - totals["passed"]
            assert page.locator("[data-canary]").first.get_attribute("data-canary") == "passed"
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
