"""The weekly-run page's figures, aggregated in SQL, against weeks whose true counts are known."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from bench.ui_progress import NOW, WeekSpec, build_week, metadata_engine
from sqlalchemy import update
from sqlalchemy.orm import Session

from avsim.artifacts import parent_run as parent_of
from avsim.ui.progress import DigestCache, compute_digests, digests_for, shard_runs
from avsim.ui.week import resolve_week, week_progress

SHARD_DAG = "avsim_weekly_shard"
GPU_POOLS = ("avsim_gpu_spot", "avsim_gpu_on_demand")


@pytest.fixture
def world(tmp_path: Path) -> Any:
    engine = metadata_engine(tmp_path / "airflow.db")
    root = f"file://{tmp_path}/artifacts"
    spec = WeekSpec(
        run_id="manual__2026-12-07T06:00:00+00:00",
        cases=530,
        shard_size=100,
        active_shards=2,
        pending_shards=1,
        canary_cases=30,
        families=("standard", "with_render"),
    )
    with engine.begin() as conn:
        truth = build_week(conn, spec, root)
    return engine, root, spec, truth


def progress(engine: Any, root: str, spec: WeekSpec, **kw: Any) -> dict[str, Any]:
    with Session(engine) as s:
        ref = resolve_week(s, "avsim_weekly", spec.run_id, "file:///elsewhere")
        assert ref is not None and ref.artifact_root == root, "the root comes from prepare's run descriptor"
        return week_progress(s, ref, gpu_pools=GPU_POOLS, now=NOW, **kw)


def test_cases_by_status_and_class_equal_the_truth(world: Any) -> None:
    engine, root, spec, truth = world
    doc = progress(engine, root, spec)
    cases = doc["cases"]
    assert cases["planned"] == 530
    assert (cases["done"], cases["running"], cases["waiting"]) == (
        truth.status["done"],
        truth.status["running"],
        truth.status["waiting"],
    )
    assert cases["by_class"] == dict(truth.done_by_class)
    # Failed scenarios are results: counted apart, never in the count of cases that need attention.
    assert cases["attention"] == sum(
        n for c, n in truth.done_by_class.items() if c not in ("passed", "scenario_failed")
    )
    assert cases["results"] == {
        "passed": truth.done_by_class["passed"],
        "scenario_failed": truth.done_by_class["scenario_failed"],
    }
    assert cases["not_started"] == 0 and cases["stopped_because"] == "", "the week is running"
    assert set(truth.done_by_class) >= {"passed", "scenario_failed", "infra_failed"}


def test_phase_progress_equals_the_truth(world: Any) -> None:
    engine, root, spec, truth = world
    phases = {p["phase"]: p for p in progress(engine, root, spec)["phases"]}
    assert list(phases) == ["prepare", "simulate", "evaluate", "render", "report"]
    for name, counts in truth.phase_classes.items():
        p = phases[name]
        assert p["total"] == sum(counts.values()), name
        assert p["running"] == counts.get("running", 0) and p["waiting"] == counts.get("waiting", 0), name
        assert p["by_class"] == {k: v for k, v in counts.items() if k not in ("running", "waiting")}, name


def test_gpu_hours_shards_and_documents(world: Any) -> None:
    engine, root, spec, truth = world
    doc = progress(engine, root, spec)
    gpu = doc["gpu"]
    assert gpu["gpus_in_use"] == truth.running_gpus > 0
    ended = sum(gpu["ended_hours_by_pool"].values())
    assert ended == pytest.approx(truth.gpu_seconds_ended / 3600, abs=0.02)
    assert gpu["running_hours"] == pytest.approx(truth.running_gpus * 600 / 3600, abs=0.01)
    assert gpu["planned_hours"] == pytest.approx(530 * 2400 / 3600, abs=0.01)
    # The canary shard run (30 cases, finished) and five shard runs of 100 numbered from 1: shards
    # 1 and 2 finished, 3 and 4 running, 5 not started.
    assert doc["shards"] == {
        "planned": 5,
        "done": 2,
        "running": 2,
        "queued": 0,
        "not_started": 1,
        "active": [
            {
                "run_id": f"{spec.run_id}__shard_{k:04d}",
                "shard": k,
                "state": "running",
                "url": f"/dags/avsim_weekly_shard/runs/manual__2026-12-07T06%3A00%3A00%2B00%3A00__shard_{k:04d}",
            }
            for k in (3, 4)
        ],
    }
    canary_run = f"{spec.run_id}__canary"
    assert doc["canary"]["run"] == {
        "run_id": canary_run,
        "state": "success",
        "url": "/dags/avsim_weekly_shard/runs/manual__2026-12-07T06%3A00%3A00%2B00%3A00__canary",
    }
    assert doc["manifest"]["build_id"] == "sim-2026.50.1" and doc["manifest"]["manifest_sha256"] == "d" * 64
    assert doc["deadline"]["available"] is False and doc["deadline"]["deadline"] == "2026-12-13T18:00:00Z"
    assert doc["canary"]["available"] is False, "no canary gate decision in the artifact store"
    assert doc["canary"]["state"] == "waiting" and doc["canary"]["message"] == "no canary gate decision yet"
    assert doc["breaker"]["available"] is False
    assert doc["run"]["tasks"] == {"prepare": {"success": 1}}


def test_failed_cases_are_listed_worst_first_with_links(world: Any) -> None:
    engine, root, spec, truth = world
    doc = progress(engine, root, spec, limit=500)
    failed = doc["failed"]
    assert failed["total"] == len(truth.failures)
    listed = [(f["case_id"], f["phase"], f["class"]) for f in failed["items"]]
    assert sorted(listed) == sorted(truth.failures)
    order = [f["class"] for f in failed["items"]]
    assert order == sorted(order, key=["bad_input", "infra_failed", "preempted", "scenario_failed"].index)
    first = failed["items"][0]
    assert first["reason"] == f"bad_input in {first['phase']}"
    key = "avsim_weekly__manual__2026-12-07T06_00_00_00_00"
    assert first["links"]["case"] == f"/avsim/runs/{key}/cases/{first['case_id']}"
    assert (
        first["links"]["artifacts"] == f"/avsim/runs/{key}/files/cases/{first['case_id']}/{first['phase']}/"
    )
    assert first["links"]["task_instance"].startswith("/dags/avsim_weekly_shard/runs/manual__2026")
    assert "/tasks/" in first["links"]["task_instance"] and "/mapped/" in first["links"]["task_instance"]
    page = progress(engine, root, spec, offset=3, limit=2)["failed"]
    assert [f["case_id"] for f in page["items"]] == [f["case_id"] for f in failed["items"][3:5]]


def test_failure_classes_come_from_the_published_outcome_not_the_ledger(tmp_path: Path) -> None:
    """The phase task publishes its class (XCom ``avsim_outcome``); a failed task that published none
    (its worker died) counts as ``failed``, and the page does not go to the ledger to guess."""
    engine = metadata_engine(tmp_path / "airflow.db")
    root = f"file://{tmp_path}/artifacts"
    spec = WeekSpec(run_id="r", cases=300, shard_size=100, active_shards=1, record_failures=False)
    with engine.begin() as conn:
        truth = build_week(conn, spec, root)
    doc = progress(engine, root, spec, limit=500)
    failing = {c for c, n in truth.done_by_class.items() if n and c not in ("passed", "scenario_failed")}
    assert failing, "the week has failures"
    assert not failing & set(doc["cases"]["by_class"]), "no class the tasks did not publish"
    assert doc["cases"]["by_class"].get("failed", 0) >= 1
    listed = sorted((f["case_id"], f["phase"]) for f in doc["failed"]["items"])
    assert listed == sorted((c, p) for c, p, _ in truth.failures)
    # The listed page still shows each failure's reason, read from the ledger for that page only.
    assert all(f["reason"].endswith("(ledger)") for f in doc["failed"]["items"] if f["state"] == "failed")


def test_finished_shard_runs_are_aggregated_once_until_they_change(world: Any) -> None:
    from airflow.models.dagrun import DagRun

    engine, _root, spec, _truth = world
    cache = DigestCache()
    with Session(engine) as s:
        runs = shard_runs(s, SHARD_DAG, spec.run_id)
        first = digests_for(s, SHARD_DAG, runs, GPU_POOLS, cache)
        again = digests_for(s, SHARD_DAG, runs, GPU_POOLS, cache)
        finished = [r.run_id for r in runs if r.finished]
        assert len(finished) == 3
        assert all(again[r] is first[r] for r in finished), "finished runs come from the cache"
        assert all(again[r.run_id] is not first[r.run_id] for r in runs if not r.finished)
        # An engineer clears a task in shard 0: the run is running again and is aggregated anew.
        s.execute(
            update(DagRun)
            .where(DagRun.dag_id == SHARD_DAG, DagRun.run_id == finished[0])
            .values(state="running", end_date=None, clear_number=1)
        )
        s.commit()
        runs = shard_runs(s, SHARD_DAG, spec.run_id)
        third = digests_for(s, SHARD_DAG, runs, GPU_POOLS, cache)
        assert third[finished[0]] is not first[finished[0]] and third[finished[1]] is first[finished[1]]
        assert compute_digests(s, SHARD_DAG, [], GPU_POOLS) == {}


def test_a_shard_run_leads_to_its_week_and_other_runs_are_not_weeks(world: Any) -> None:
    engine, _root, spec, _truth = world
    assert parent_of(SHARD_DAG, f"{spec.run_id}__shard_0003") == ("avsim_weekly", spec.run_id)
    assert parent_of(SHARD_DAG, f"{spec.run_id}__canary") == ("avsim_weekly", spec.run_id)
    assert parent_of("other", "r__shard_0001") == ("other", "r__shard_0001")
    with Session(engine) as s:
        ref = resolve_week(s, SHARD_DAG, f"{spec.run_id}__shard_0003", "file:///x")
        assert ref is not None and (ref.dag_id, ref.run_id) == ("avsim_weekly", spec.run_id)
        assert resolve_week(s, "avsim_weekly", "no-such-run", "file:///x") is None


def test_the_documents_of_the_run_are_shown_when_they_exist(world: Any) -> None:
    import json

    from avsim.artifacts import RunLayout, breaker_uri

    engine, root, spec, _truth = world
    layout = RunLayout(root, "avsim_weekly__manual__2026-12-07T06_00_00_00_00")

    def put(uri: str, doc: Any) -> None:
        p = Path(uri.removeprefix("file://"))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(doc))

    finish = (NOW + dt.timedelta(days=4, hours=7)).isoformat()
    put(
        layout.deadline_latest,
        {"at": NOW.isoformat(), "estimated_finish": finish, "gpus_needed": 310, "action": "scale_up"},
    )
    put(
        layout.canary_gate,
        {
            "state": "passed",
            "cases": 50,
            "finished": 50,
            "rate": 0.02,
            "threshold": 0.2,
            "digest": "sha256:" + "c" * 64,
        },
    )
    put(
        breaker_uri(root, "sha256:" + "c" * 64),
        {"state": "open", "failures": 31, "finished": 100, "threshold": 0.3},
    )
    doc = progress(engine, root, spec)
    assert doc["deadline"]["available"] and doc["deadline"]["gpus_needed"] == 310
    # 2026-12-09T12:00 + 4 d 7 h is 2026-12-13T19:00, an hour after the 18:00 deadline.
    assert doc["deadline"]["seconds_late"] == 3600.0
    assert doc["canary"]["state"] == "passed" and doc["breaker"]["state"] == "open"


def _set_descriptor(engine: Any, run_id: str, value: Any) -> None:
    """Rewrite the run descriptor the weekly run's prepare pushed (XCom ``run``)."""
    from airflow.models.xcom import XComModel

    with engine.begin() as conn:
        conn.execute(
            update(XComModel.__table__)
            .where(XComModel.__table__.c.run_id == run_id, XComModel.__table__.c.key == "run")
            .values(value=value)
        )


def test_the_page_reads_prepares_run_descriptor_as_the_contract(world: Any, caplog: Any) -> None:
    """Issue 30 (3): the page parses the run descriptor as :class:`RunDescriptor`, so its fields are
    the contract's; one that does not parse (a misspelt field) is named in the log, and the page
    falls back to what it derives, as it does before prepare pushed one."""
    from avsim.artifacts import run_key_for
    from avsim.contracts import RunDescriptor

    engine, root, spec, _truth = world
    with Session(engine) as s:
        ref = resolve_week(s, "avsim_weekly", spec.run_id, "file:///elsewhere")
    assert ref is not None and isinstance(ref.descriptor, RunDescriptor)
    assert (ref.descriptor.case_count, ref.descriptor.artifact_root) == (spec.cases, root)
    assert ref.run_key == ref.descriptor.run_key == run_key_for("avsim_weekly", spec.run_id)

    with Session(engine) as s:
        good = week_progress(s, ref, gpu_pools=GPU_POOLS, now=NOW)
    assert good["manifest"]["manifest_sha256"] == "d" * 64

    misspelt = {"run_key": "avsim_weekly__elsewhere", "artifact_root": root, "case_cuont": 1}
    _set_descriptor(engine, spec.run_id, misspelt)
    with Session(engine) as s, caplog.at_level("WARNING"):
        ref = resolve_week(s, "avsim_weekly", spec.run_id, "file:///elsewhere")
    assert ref is not None and ref.descriptor is None
    assert (ref.run_key, ref.artifact_root) == (run_key_for("avsim_weekly", spec.run_id), "file:///elsewhere")
    assert "case_cuont" in caplog.text
