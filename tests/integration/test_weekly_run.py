"""A small weekly run on the real scheduler, dag-processor, triggerer and api-server, on PostgreSQL.

Nothing is mocked: the phases are real processes of the fake simulator writing real artifacts.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
from collections import defaultdict
from pathlib import Path

import pytest
from tests.support.airflow_run import api, query, trigger, wait_for_run
from tests.support.stacks import weekly_stack

from avsim.artifacts import RunLayout, run_key_for
from avsim.dagbuild.factory import load_plan
from avsim.devstack.stack import LocalStack
from avsim.manifest.sample import sample_manifest
from avsim.settings import AvsimSettings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CASES = 24
SHARD_SIZE = 10


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    with weekly_stack(tmp_path_factory.mktemp("weekly"), shard_size=SHARD_SIZE, max_active_shards=2) as s:
        yield s


def _read(uri: str):
    return json.loads(Path(uri.removeprefix("file://")).read_text())


def test_weekly_run_runs_every_phase_once_in_order(stack: LocalStack) -> None:
    doc = sample_manifest(
        CASES,
        time_scale=0.00002,
        scenario_fail_rate=0.2,
        crash_rate=0.0,
        canary={"share": 0.2, "min_cases": 4},
    )
    manifest = stack.home / "week.json"
    manifest.write_text(json.dumps(doc))
    run_id = "it__weekly"
    trigger(stack, "avsim_weekly", run_id, {"manifest": str(manifest)})
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=900) == "success"

    plan = load_plan(ROOT / "dags" / "avsim_graphs.yaml", AvsimSettings(shard_size=SHARD_SIZE))
    shard_runs = query(
        stack,
        "SELECT run_id, state FROM dag_run WHERE dag_id = 'avsim_weekly_shard' AND run_id LIKE :p",
        p=f"{run_id}__%",
    )
    # The canary (5 cases: 20 % of 24) first, then the other 19 cases in shards of 10.
    assert sorted(shard_runs) == [(f"{run_id}__canary", "success")] + [
        (f"{run_id}__shard_{k:04d}", "success") for k in (1, 2)
    ]
    gate = query(
        stack,
        "SELECT state FROM task_instance WHERE dag_id = 'avsim_weekly' AND run_id = :r AND task_id = 'canary_gate'",
        r=run_id,
    )
    assert gate == [("success",)]

    # Every phase of every case: one task instance, one try, success.
    tis = query(
        stack,
        "SELECT task_id, map_index, rendered_map_index, state, try_number FROM task_instance "
        "WHERE dag_id = 'avsim_weekly_shard' AND run_id LIKE :p AND map_index >= 0",
        p=f"{run_id}__%",
    )
    expected = {
        (f"{c['graph']}.{ph}", c["id"]) for c in doc["cases"] for ph in plan.family(c["graph"]).phase_names
    }
    twins = {
        (f"{c['graph']}.{ph.on_demand_task}", c["id"])
        for c in doc["cases"]
        for ph in plan.family(c["graph"]).phases
        if ph.on_demand_fallback
    }
    assert twins, "GPU phases have an on-demand twin"
    # A twin skipped before it ran never rendered its case id: twins are counted per task.
    twin_tasks = {task for task, _ in twins}
    by_key = {(t.task_id, t.rendered_map_index): t for t in tis if t.task_id not in twin_tasks}
    assert set(by_key) == expected
    phase_tis = [by_key[k] for k in expected]
    assert all(t.state == "success" and t.try_number == 1 for t in phase_tis), [
        t for t in phase_tis if t.state != "success"
    ]
    twin_tis = [t for t in tis if t.task_id in twin_tasks]
    assert collections.Counter(t.task_id for t in twin_tis) == collections.Counter(task for task, _ in twins)
    # Nobody was preempted: every spot task skipped its on-demand twin, which never ran.
    assert {t.state for t in twin_tis} == {"skipped"}

    # The ledger: one attempt per (case, phase), each starting after its upstream phases ended.
    layout = RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for("avsim_weekly", run_id))
    attempts = {}
    for case in doc["cases"]:
        for ph in plan.family(case["graph"]).phases:
            folder = Path(layout.ledger.removeprefix("file://")) / "attempts" / case["id"] / ph.name
            records = sorted(folder.glob("*.json"))
            assert [r.name for r in records] == ["1.json"], (case["id"], ph.name)
            attempts[(case["id"], ph.name)] = json.loads(records[0].read_text())
            for up in ph.upstream:
                up_end = dt.datetime.fromisoformat(attempts[(case["id"], up)]["ended_at"])
                start = dt.datetime.fromisoformat(attempts[(case["id"], ph.name)]["started_at"])
                assert start >= up_end, (case["id"], up, ph.name)

    # The report agrees with the ledger's committed outcomes.
    report = _read(f"{layout.report_dir}/report.json")
    by_case: dict[str, set[str]] = defaultdict(set)
    for (case_id, _), rec in attempts.items():
        by_case[case_id].add(rec["outcome"])
    scenario_failed = sorted(c for c, outs in by_case.items() if "scenario_failed" in outs)
    assert 0 < len(scenario_failed) < CASES, "the sample's seeds give some scenario failures"
    totals = report["totals"]
    assert totals["cases"] == CASES
    assert totals["passed"] == CASES - len(scenario_failed)
    assert totals["scenario_failed"] == len(scenario_failed)
    assert sorted(f["case_id"] for f in report["failed_cases"]) == scenario_failed
    html = Path(f"{layout.report_dir.removeprefix('file://')}/report.html").read_text()
    for case_id in scenario_failed:
        assert case_id in html
    # Each case's row has when it started and finished (the progress plot reads them), from the ledger.
    from avsim.report.cases import from_csv

    rows = from_csv(Path(f"{layout.report_dir.removeprefix('file://')}/cases.csv").read_text())
    assert len(rows) == CASES
    for row in rows:
        began, ended = (dt.datetime.fromisoformat(row[k]) for k in ("started_at", "finished_at"))
        first = attempts[(row["case_id"], "prepare")]
        assert began >= dt.datetime.fromisoformat(first["started_at"]) and ended > began, row
    # The run-level summary ran after every shard and saw each shard's summary.
    summary = query(
        stack,
        "SELECT state, try_number FROM task_instance WHERE dag_id = 'avsim_weekly' AND run_id = :r "
        "AND task_id = 'run_phases.weekly_summary'",
        r=run_id,
    )
    assert summary == [("success", 1)]


def test_report_page_is_served_behind_airflow_login(stack: LocalStack) -> None:
    import urllib.error
    import urllib.request

    def status(path: str, token: str | None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            with urllib.request.urlopen(
                urllib.request.Request(f"{stack.api_url}{path}", headers=headers), timeout=30
            ):
                return 200
        except urllib.error.HTTPError as exc:
            return exc.code

    # A forged token is refused, exactly as by Airflow's own API. (This stack runs the simple
    # auth manager in all-admins mode, where a request without a token is an admin's, for
    # Airflow's API and for this page alike.)
    forged = status("/avsim/runs", "not-a-jwt")
    assert forged in (401, 403) and forged == status("/api/v2/dags", "not-a-jwt")
    assert status("/avsim/runs", None) == status("/api/v2/dags", None)
    key = run_key_for("avsim_weekly", "it__weekly")
    assert key in api(stack, "GET", "/avsim/runs")
    token = json.loads(urllib.request.urlopen(f"{stack.api_url}/auth/token", timeout=30).read())[
        "access_token"
    ]
    req = urllib.request.Request(
        f"{stack.api_url}/avsim/dags/avsim_weekly/runs/it__weekly/report",
        headers={"Authorization": f"Bearer {token}"},
    )
    page = urllib.request.urlopen(req, timeout=30).read().decode()
    assert "<html" in page.lower() and "weekly_regression" in page


def test_provider_plugin_and_report_command(stack: LocalStack) -> None:
    import subprocess
    import sys

    assert "airflow-provider-avsim" in stack.airflow("providers", "list").stdout
    plugins = stack.airflow("plugins").stdout
    assert "avsim" in plugins and "/avsim" in plugins
    # `avsim report RUN_ID` rebuilds the weekly report from the ledger alone.
    layout = RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for("avsim_weekly", "it__weekly"))
    folder = Path(layout.report_dir.removeprefix("file://"))
    before = json.loads((folder / "report.json").read_text())
    for name in ("report.json", "report.html"):
        (folder / name).unlink()
    done = subprocess.run(
        [sys.executable, "-m", "avsim.cli", "report", "it__weekly"],
        env=stack.env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    after = json.loads((folder / "report.json").read_text())
    assert after["totals"] == before["totals"] and after["failed_cases"] == before["failed_cases"]
    assert (folder / "report.html").exists()


def test_bad_manifest_fails_fast_and_starts_no_shard(stack: LocalStack) -> None:
    doc = sample_manifest(3)
    doc["cases"][1]["graph"] = "perception_v2"
    manifest = stack.home / "bad.json"
    manifest.write_text(json.dumps(doc))
    run_id = "it__bad_manifest"
    trigger(stack, "avsim_weekly", run_id, {"manifest": str(manifest)})
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=300) == "failed"
    prepare = query(
        stack,
        "SELECT state, try_number FROM task_instance WHERE dag_id = 'avsim_weekly' AND run_id = :r "
        "AND task_id = 'prepare'",
        r=run_id,
    )
    assert prepare == [("failed", 1)], "bad input is not retried"
    assert query(stack, "SELECT run_id FROM dag_run WHERE run_id LIKE :p", p=f"{run_id}__shard_%") == []
    log = next((stack.home / "logs").glob(f"dag_id=avsim_weekly/run_id={run_id}/task_id=prepare/**/*.log"))
    assert "cases[1].graph: unknown graph 'perception_v2'" in log.read_text()


# The per-shard path (about 2 minutes): the long tier; CI repairs weeks through the weekly run
# (tests/integration/test_week_repair.py).
@pytest.mark.long
def test_clearing_a_failed_phase_in_a_shard_run_reruns_it(stack: LocalStack) -> None:
    """The per-shard path: an engineer clears "Only failed" + "Downstream" in one shard run; its
    summary (its failed leaf) reruns too and refreshes the weekly report."""
    doc = sample_manifest(6, time_scale=0.00002, scenario_fail_rate=0.0)
    case = next(c for c in doc["cases"] if c["graph"] == "standard")
    # evaluate crashes on every try of this run (retries: 2, so tries 1-3) and works on the 4th.
    case["parameters"]["fakesim"] = {"evaluate": "crash_before:4"}
    manifest = stack.home / "rerun.json"
    manifest.write_text(json.dumps(doc))
    run_id = "it__rerun"
    trigger(stack, "avsim_weekly", run_id, {"manifest": str(manifest)})
    # The case needs attention: its shard run, that shard's map index and the weekly run fail.
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=600) == "failed"
    layout = RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for("avsim_weekly", run_id))
    report = _read(f"{layout.report_dir}/report.json")
    assert report["totals"]["infra_failed"] == 1
    assert [(f["case_id"], f["phase"]) for f in report["failed_cases"]] == [(case["id"], "evaluate")]
    assert report["verdict"]["state"] == "needs_attention"

    shard_run = f"{run_id}__shard_0001"
    assert query(stack, "SELECT state FROM dag_run WHERE run_id = :r", r=shard_run) == [("failed",)]
    [(map_index, state, tries)] = query(
        stack,
        "SELECT map_index, state, try_number FROM task_instance WHERE dag_id = 'avsim_weekly_shard' "
        "AND run_id = :r AND task_id = 'standard.evaluate' AND rendered_map_index = :c",
        r=shard_run,
        c=case["id"],
    )
    assert (state, tries) == ("failed", 3)
    # The engineer's "Clear" with "Only failed" and "Downstream" on the shard run, through the REST API.
    cleared = api(
        stack,
        "POST",
        "/api/v2/dags/avsim_weekly_shard/clearTaskInstances",
        {"dag_run_id": shard_run, "only_failed": True, "include_downstream": True, "dry_run": False},
    )
    cleared_ids = {(t["task_id"], t["map_index"]) for t in cleared["task_instances"]}
    # Only this case's failed phase and its downstream (per map index), and the shard's summary,
    # which failed because the case needed attention.
    assert cleared_ids == {
        ("standard.evaluate", map_index),
        ("standard.report", map_index),
        ("summarize", -1),
    }
    assert wait_for_run(stack, "avsim_weekly_shard", shard_run, timeout=300) == "success"
    rerun = _read(f"{layout.report_dir}/report.json")
    assert rerun["totals"]["infra_failed"] == 0 and rerun["totals"]["cases"] == 6
    assert rerun["failed_cases"] == [] and rerun["verdict"]["state"] == "passed"
    tries_after = query(
        stack,
        "SELECT task_id, try_number, state FROM task_instance WHERE dag_id = 'avsim_weekly_shard' "
        "AND run_id = :r AND map_index = :m AND task_id LIKE 'standard.%' AND task_id NOT LIKE '%_on_demand'",
        r=shard_run,
        m=map_index,
    )
    assert dict((t, (n, s)) for t, n, s in tries_after) == {
        "standard.prepare": (1, "success"),
        "standard.simulate": (1, "success"),
        "standard.evaluate": (4, "success"),
        "standard.report": (1, "success"),
    }
