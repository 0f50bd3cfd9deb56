"""The avsim app's routes: pages, JSON API, case page, artifact files (and refused paths), report, links.

Airflow's auth manager is replaced here by a policy of the test's (which DAGs' runs the user may
read), behind the app's one reader dependency; tests/integration/test_ui_access.py checks the real
one (FAB, per-DAG roles, real logins) and tests/integration/test_ui_browser.py refused tokens.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bench.ui_progress import WeekSpec, add_dag_rows, build_week, metadata_engine
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from avsim.artifacts import RunLayout
from avsim.ledger.records import AttemptRecord
from avsim.phases.contract import Outcome

RUN_ID = "manual__2026-12-07T06:00:00+00:00"
KEY = "avsim_weekly__manual__2026-12-07T06_00_00_00_00"
Q_RUN = "manual__2026-12-07T06%3A00%3A00%2B00%3A00"


#: The DAGs the builder makes for the week (tagged avsim), and one of another team's.
AVSIM_DAGS = ("avsim_weekly", "avsim_weekly_shard")
OTHER_DAG = "etl_daily"
#: The DAGs the test's user may read (every one unless a test narrows it).
READABLE: set[str] = set()


@pytest.fixture
def week(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TestClient, RunLayout, Any]]:
    from avsim.ui.access import Reader
    from avsim.ui.app import create_app, db_session

    engine = metadata_engine(tmp_path / "airflow.db")
    root = f"file://{tmp_path}/artifacts"
    monkeypatch.setenv("AIRFLOW__AVSIM__ARTIFACT_ROOT", root)
    spec = WeekSpec(
        run_id=RUN_ID, cases=120, shard_size=50, active_shards=1, families=("standard", "with_render")
    )
    with engine.begin() as conn:
        truth = build_week(conn, spec, root)
        add_dag_rows(conn, {OTHER_DAG: ["etl"]})
    READABLE.clear()
    READABLE.update({*AVSIM_DAGS, OTHER_DAG})
    app = create_app()

    def session() -> Iterator[Session]:
        with Session(engine) as s:
            yield s

    app.dependency_overrides[app.state.reader_dependency] = lambda: Reader(READABLE.__contains__)
    app.dependency_overrides[db_session] = session
    with TestClient(app) as client:
        yield client, RunLayout(root, KEY), truth


def put(uri: str, text: str) -> Path:
    p = Path(uri.removeprefix("file://"))
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_progress_api_and_page(week: Any) -> None:
    client, _layout, truth = week
    resp = client.get(f"/api/runs/avsim_weekly/{Q_RUN}/progress", params={"limit": 5})
    assert resp.status_code == 200
    doc = resp.json()
    assert doc["cases"]["done"] == truth.status["done"] and len(doc["failed"]["items"]) == 5
    page = client.get(f"/dags/avsim_weekly/runs/{Q_RUN}")
    assert page.status_code == 200 and "<script>" in page.text
    assert f'"/avsim/api/runs/avsim_weekly/{Q_RUN}/progress"' in page.text
    shard = client.get(f"/dags/avsim_weekly_shard/runs/{Q_RUN}__shard_0001")
    assert f"/avsim/api/runs/avsim_weekly/{Q_RUN}/progress" in shard.text, "a shard run shows its week"
    assert client.get("/dags/avsim_weekly/runs/nope").status_code == 404
    assert client.get(f"/api/runs/avsim_weekly/{Q_RUN}/progress", params={"limit": 0}).status_code == 422
    index = client.get("/")
    assert index.status_code == 200 and f"/avsim/dags/avsim_weekly/runs/{Q_RUN}" in index.text


def test_case_page_shows_phases_attempts_and_links(week: Any) -> None:
    client, layout, truth = week
    case_id, phase, cls = next(f for f in truth.failures if f[2] == "infra_failed")
    rec = AttemptRecord(
        run_key=KEY,
        case_id=case_id,
        phase=phase,
        attempt=4,
        started_at="2026-12-08T10:00:00+00:00",
        ended_at="2026-12-08T10:00:09+00:00",
        exit_code=137,
        outcome=Outcome.INFRA_FAILED,
        reason="OOMKilled <node-3>",
        output_uri=layout.attempt_output(case_id, phase, 4),
        host="worker-1",
        duration_seconds=9.0,
    )
    put(layout.attempt_record(case_id, phase, 4), json.dumps(rec.to_json()))
    put(f"{layout.attempt_output(case_id, phase, 4)}/phase.log", "started\nkilled\n")
    doc = client.get(f"/api/runs/{KEY}/cases/{case_id}").json()
    phases = {p["phase"]: p for p in doc["phases"]}
    assert phases[phase]["outcome"]["outcome"] == cls
    assert [a["exit_code"] for a in phases[phase]["attempts"]] == [137]
    ti = phases[phase]["task_instance"]
    assert (ti["state"], ti["try_number"]) == ("failed", 4)
    assert (
        ti["url"].startswith("/dags/avsim_weekly_shard/runs/")
        and f"/tasks/{ti['task_id']}/mapped/" in ti["url"]
    )
    assert phases["prepare"]["task_instance"]["state"] == "success"
    assert phases[phase]["attempt_folders"] == [
        {"name": "attempt-4", "url": f"/avsim/runs/{KEY}/files/cases/{case_id}/{phase}/attempt-4/"}
    ]
    page = client.get(f"/runs/{KEY}/cases/{case_id}")
    assert page.status_code == 200
    assert "OOMKilled &lt;node-3&gt;" in page.text and f"/avsim/dags/avsim_weekly/runs/{Q_RUN}" in page.text
    # The Airflow UI's task-instance view of that phase leads to the same case page.
    mi = ti["map_index"]
    hop = client.get(
        f"/dags/avsim_weekly_shard/runs/{ti['run_id']}/tasks/{ti['task_id']}/mapped/{mi}",
        follow_redirects=False,
    )
    assert hop.status_code == 307 and hop.headers["location"] == f"/avsim/runs/{KEY}/cases/{case_id}"
    assert client.get(f"/runs/{KEY}/cases/no-such-case").status_code == 404


def test_artifact_files_and_folders(week: Any) -> None:
    client, layout, _truth = week
    put(f"{layout.attempt_output('c-1', 'simulate', 1)}/result.json", '{"metrics": {"ttc": 1.5}}')
    put(f"{layout.attempt_output('c-1', 'simulate', 1)}/trace.html", "<script>alert(1)</script>")
    got = client.get(f"/runs/{KEY}/files/cases/c-1/simulate/attempt-1/result.json")
    assert got.status_code == 200 and got.json() == {"metrics": {"ttc": 1.5}}
    assert got.headers["content-type"].startswith("application/json")
    html = client.get(f"/runs/{KEY}/files/cases/c-1/simulate/attempt-1/trace.html")
    assert html.headers["content-security-policy"].startswith("sandbox"), "artifact HTML cannot run script"
    assert html.headers["x-content-type-options"] == "nosniff"
    folder = client.get(f"/runs/{KEY}/files/cases/c-1/simulate/")
    assert (
        folder.status_code == 200 and f"/avsim/runs/{KEY}/files/cases/c-1/simulate/attempt-1/" in folder.text
    )
    bare = client.get(f"/runs/{KEY}/files/cases/c-1", follow_redirects=False)
    assert bare.status_code == 307 and bare.headers["location"].endswith("/files/cases/c-1/")
    assert client.get(f"/runs/{KEY}/files/cases/c-2/nothing.json").status_code == 404


@pytest.mark.parametrize(
    ("path", "status"),
    [
        (f"/runs/{KEY}/files/%2e%2e/%2e%2e/secret.txt", 400),
        (f"/runs/{KEY}/files/cases/..%2f..%2f..%2fsecret.txt", 400),
        (f"/runs/{KEY}/files/cases%5c..%5c..%5csecret.txt", 400),
        (f"/runs/{KEY}/files//etc/passwd", 400),
        ("/runs/%2e%2e/files/secret.txt", 400),
        (f"/runs/{KEY}/report/..%2f..%2f..%2fsecret.txt", 400),
        (f"/api/runs/{KEY}/cases/%2e%2e", 400),
        # A decoded '/' in a single-segment parameter matches no route at all.
        ("/runs/..%2fartifacts/files/secret.txt", 404),
        (f"/runs/{KEY}/cases/..%2f..%2fsecret", 404),
    ],
)
def test_paths_outside_the_run_are_refused(week: Any, path: str, status: int) -> None:
    client, layout, _truth = week
    put(f"{layout.root}/secret.txt", "not an artifact")
    resp = client.get(path)
    assert resp.status_code == status, (path, resp.status_code, resp.text)
    assert "not an artifact" not in resp.text


LONG = "r" * 251


@pytest.mark.parametrize(
    ("path", "param"),
    [
        # issue 28: every value a request names is bounded; a bad one is a 422 naming it, not a 500
        (f"/api/runs/avsim_weekly/{Q_RUN}/progress?offset={2**63}", "offset"),
        (f"/api/runs/avsim_weekly/{LONG}/progress", "run_id"),
        ("/api/runs/avsim_weekly/bad%00run/progress", "run_id"),
        (f"/dags/{LONG}/runs/{Q_RUN}", "dag_id"),
        ("/dags/avsim_weekly/runs/x%1b%5b2J", "run_id"),
        (f"/dags/avsim_weekly/runs/{Q_RUN}/tasks/standard.simulate/mapped/{2**70}", "map_index"),
        (f"/dags/avsim_weekly/runs/{Q_RUN}/tasks/{LONG}/mapped/0", "task_id"),
        (f"/runs/{'k' * 513}/cases/case-00001", "run_key"),
        (f"/api/runs/{KEY}/cases/case%00", "case_id"),
        (f"/runs/{KEY}/files/{'a/' * 2100}", "path"),
        (f"/runs/{KEY}/report/x%00.html", "name"),
    ],
)
def test_a_bad_request_value_is_a_4xx_naming_it(week: Any, path: str, param: str) -> None:
    client, _layout, _truth = week
    resp = client.get(path)
    assert resp.status_code == 422, (path, resp.status_code, resp.text[:300])
    assert [e["loc"][-1] for e in resp.json()["detail"]] == [param]


def test_a_symbolic_link_out_of_the_run_is_refused(week: Any) -> None:
    client, layout, _truth = week
    secret = put(f"{layout.root}/secret.txt", "not an artifact")
    link = Path(layout.base.removeprefix("file://")) / "cases" / "escape.txt"
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(secret, link)
    resp = client.get(f"/runs/{KEY}/files/cases/escape.txt")
    assert resp.status_code == 400 and "leaves the run" in resp.json()["detail"]


def test_report_and_its_files_are_served(week: Any) -> None:
    from avsim.contracts.week import ShardSummary
    from avsim.report.build import build_report, write_report

    client, layout, _truth = week
    summary = ShardSummary.model_validate(
        {"shard": 0, "cases": [{"case_id": "c-1", "graph": "standard", "outcome": "passed", "phases": {}}]}
    )
    write_report(layout, build_report({}, [summary], {}, run_id=RUN_ID, generated_at="now"))
    assert client.get("/runs").json() == [KEY]
    hop = client.get(f"/dags/avsim_weekly/runs/{Q_RUN}/report", follow_redirects=False)
    assert hop.status_code == 307 and hop.headers["location"] == f"/avsim/runs/{KEY}/report/"
    assert (
        client.get(f"/runs/{KEY}/report", follow_redirects=False).headers["location"]
        == f"/avsim/runs/{KEY}/report/"
    )
    page = client.get(f"/runs/{KEY}/report/")
    assert page.status_code == 200 and "avsim weekly report" in page.text
    csv = client.get(f"/runs/{KEY}/report/cases.csv")
    assert csv.status_code == 200 and csv.text.startswith("case_id,graph,")
    assert client.get("/runs/other_run/report/").status_code == 404


def test_the_phase_link_points_at_the_artifacts(monkeypatch: pytest.MonkeyPatch) -> None:
    """One extra link, the phase's artifacts: its case page is the plugin's task-instance tab, which
    costs no XCom per phase execution (a link that opened it too was dropped)."""
    from avsim.links import PHASE_LINKS, AvsimArtifactsLink
    from avsim.operators.kubernetes import KubernetesPhaseOperator
    from avsim.operators.phase import LocalPhaseOperator
    from avsim.plugin import AvsimPlugin

    op = LocalPhaseOperator(
        task_id="simulate",
        phase="simulate",
        case={"case_id": "case-00007"},
        run={"run_key": KEY, "artifact_root": "s3://aws@bucket/avsim"},
    )
    assert (
        AvsimArtifactsLink().get_link(op, ti_key=None)
        == f"/avsim/runs/{KEY}/files/cases/case-00007/simulate/"
    )
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/team-a/")
    assert (
        AvsimArtifactsLink().get_link(op, ti_key=None)
        == f"/team-a/avsim/runs/{KEY}/files/cases/case-00007/simulate/"
    )
    unrendered = LocalPhaseOperator(task_id="t", phase="simulate", case="{{ x }}", run="{{ y }}")
    assert AvsimArtifactsLink().get_link(unrendered, ti_key=None) == ""
    assert [link.xcom_key for link in PHASE_LINKS] == ["_link_AvsimArtifactsLink"]
    assert (
        LocalPhaseOperator.operator_extra_links == KubernetesPhaseOperator.operator_extra_links == PHASE_LINKS
    )
    tabs = {v["name"]: v for v in AvsimPlugin.external_views}
    assert tabs["avsim case"]["destination"] == "task_instance"
    assert (
        tabs["avsim case"]["href"] == "/avsim/dags/{DAG_ID}/runs/{RUN_ID}/tasks/{TASK_ID}/mapped/{MAP_INDEX}"
    )


def test_an_operator_with_the_links_serializes_them_for_the_ui() -> None:
    import datetime as dt

    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization

    from avsim.links import PHASE_LINKS
    from avsim.operators.phase import LocalPhaseOperator

    class LinkedPhase(LocalPhaseOperator):  # what the lead's phase operator declares
        operator_extra_links = PHASE_LINKS

    with DAG("links", schedule=None, start_date=dt.datetime(2026, 1, 1)) as dag:
        LinkedPhase(task_id="simulate", phase="simulate", case={"case_id": "c"}, run={"run_key": KEY})
    data = DagSerialization.to_dict(dag)
    [task] = data["dag"]["tasks"]
    assert task["__var"]["_operator_extra_links"] == {"avsim artifacts": "_link_AvsimArtifactsLink"}
    back = DagSerialization.from_dict(data)
    assert back.get_task("simulate").extra_links == ["avsim artifacts"]


def test_the_page_colours_each_class_as_the_report_does() -> None:
    """Issue 30 (1): the weekly-run page's class colours (its CSS rules and the bars' colours in its
    script) are generated from the vocabulary: every class a case or a phase can take on the page has
    one, an attempt's class in the report's colour, so a new class cannot be left out of a copy."""
    import json
    import re

    from avsim.phases.contract import NOT_RUN, Outcome
    from avsim.report.plots import COLOURS
    from avsim.ui.pages import CSS, progress_page
    from avsim.ui.progress import CASE_CLASSES, FAILED, RANK, RUNNING, SKIPPED, WAITING

    rules = dict(re.findall(r"\.([a-z_]+)\{color:(#[0-9a-f]{6})\}", CSS))
    shown = {*CASE_CLASSES, FAILED, Outcome.UPSTREAM_FAILED.value, NOT_RUN}
    assert shown <= set(rules), shown - set(rules)
    assert {k: rules[k] for k in COLOURS} == COLOURS
    page = progress_page("avsim_weekly", "r1", "/avsim/api/runs/avsim_weekly/r1/progress")
    bars = json.loads(re.search(r"const COLOURS = (\{.*?\});", page, re.S).group(1))
    assert set(RANK) - {RUNNING, WAITING, SKIPPED} <= set(bars)
    assert {k: bars[k] for k in COLOURS} == COLOURS


def test_every_route_asks_the_reader() -> None:
    """No route of the app is served without the per-DAG check (a new route must take the reader)."""
    from fastapi.routing import APIRoute

    from avsim.ui.app import create_app

    app = create_app()
    routes = [r for r in app.routes if isinstance(r, APIRoute)]
    assert len(routes) == 11
    for route in routes:
        calls = {d.call for d in route.dependant.dependencies}
        assert app.state.reader_dependency in calls, route.path


def _routes_of_the_week(client: TestClient, truth: Any) -> list[str]:
    """One URL of every route that shows something of the week."""
    case_id = truth.failures[0][0]
    tab = client.get(f"/api/runs/{KEY}/cases/{case_id}").json()["phases"][0]["task_instance"]
    return [
        f"/dags/avsim_weekly/runs/{Q_RUN}",
        f"/api/runs/avsim_weekly/{Q_RUN}/progress",
        f"/dags/avsim_weekly_shard/runs/{Q_RUN}__shard_0001",
        f"/dags/avsim_weekly/runs/{Q_RUN}/report",
        f"/dags/avsim_weekly_shard/runs/{tab['run_id']}/tasks/{tab['task_id']}/mapped/{tab['map_index']}",
        f"/runs/{KEY}/cases/{case_id}",
        f"/api/runs/{KEY}/cases/{case_id}",
        f"/runs/{KEY}/report",
        f"/runs/{KEY}/report/",
        f"/runs/{KEY}/files/",
        f"/runs/{KEY}/files/report/cases.csv",
    ]


def test_a_user_who_may_not_read_the_weekly_dag_gets_403_and_nothing_of_it(week: Any) -> None:
    from avsim.contracts.week import ShardSummary
    from avsim.report.build import build_report, write_report

    client, layout, truth = week
    summary = ShardSummary.model_validate(
        {"shard": 0, "cases": [{"case_id": "c-1", "graph": "standard", "outcome": "passed", "phases": {}}]}
    )
    write_report(layout, build_report({}, [summary], {}, run_id=RUN_ID, generated_at="now"))
    urls = _routes_of_the_week(client, truth)
    allowed = {u: client.get(u, follow_redirects=False).status_code for u in urls}
    assert set(allowed.values()) <= {200, 307}, [u for u, s in allowed.items() if s not in (200, 307)]
    assert client.get("/runs").json() == [KEY]

    READABLE.clear()
    READABLE.add(OTHER_DAG)
    for url in urls:
        resp = client.get(url, follow_redirects=False)
        assert (resp.status_code, resp.json()) == (403, {"detail": "Forbidden"}), url
    assert client.get("/runs").json() == []
    index = client.get("/")
    assert index.status_code == 200 and "No weekly run yet." in index.text and "No report yet." in index.text
    assert RUN_ID not in index.text and KEY not in index.text
    # A run that does not exist is refused alike: a 403 does not say whether the run exists.
    assert client.get("/dags/avsim_weekly/runs/no-such-run").status_code == 403

    # The shard DAG alone is not enough: its pages show the weekly run.
    READABLE.add("avsim_weekly_shard")
    assert client.get(f"/dags/avsim_weekly_shard/runs/{Q_RUN}__shard_0001").status_code == 403
    READABLE.add("avsim_weekly")
    assert client.get(f"/dags/avsim_weekly_shard/runs/{Q_RUN}__shard_0001").status_code == 200


def test_another_dags_run_is_not_an_avsim_run_said_in_a_sentence(week: Any) -> None:
    """The tabs show on every DAG's runs and task instances: elsewhere the page says so, in HTML."""
    client, _layout, _truth = week
    for url in (
        f"/dags/{OTHER_DAG}/runs/scheduled__2026-12-07",
        f"/dags/{OTHER_DAG}/runs/scheduled__2026-12-07/tasks/load/mapped/-1",
    ):
        resp = client.get(url)
        assert resp.status_code == 404 and resp.headers["content-type"].startswith("text/html"), url
        assert (
            f'id="notice">The run scheduled__2026-12-07 of {OTHER_DAG} is not an avsim run: {OTHER_DAG} '
            "is no DAG of avsim.</p>" in resp.text
        )
        assert 'localStorage.getItem("theme")' in resp.text and "prefers-color-scheme" in resp.text
    # An avsim DAG's run that is no weekly run, and a task that is no phase of a case.
    page = client.get("/dags/avsim_weekly/runs/no-such-run")
    assert page.status_code == 404 and "is not an avsim weekly run in the metadata database" in page.text
    tab = client.get(f"/dags/avsim_weekly/runs/{Q_RUN}/tasks/prepare/mapped/-1")
    assert tab.status_code == 404 and "is not an avsim phase with a case" in tab.text
    api = client.get(f"/api/runs/{OTHER_DAG}/r1/progress")
    assert api.status_code == 404 and "is not an avsim run" in api.json()["detail"]
