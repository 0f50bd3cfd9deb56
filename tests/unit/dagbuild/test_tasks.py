"""The weekly DAGs' non-phase tasks as plain functions, on a file:// artifact store (no scheduler)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from avsim.dagbuild import tasks
from avsim.dagbuild.factory import load_plan
from avsim.dagbuild.prepare import prepare_week
from avsim.errors import AvsimError, ManifestError
from avsim.manifest.sample import sample_manifest
from avsim.manifest.source import manifest_source
from avsim.settings import AvsimSettings

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def week(tmp_path: Path):
    settings = AvsimSettings(shard_size=10, artifact_root=f"file://{tmp_path / 'artifacts'}")
    plan = load_plan(ROOT / "dags" / "avsim_graphs.yaml", settings)
    manifest = tmp_path / "week.json"
    manifest.write_text(json.dumps(sample_manifest(25, canary={"share": 0.1, "min_cases": 4})))
    return settings, plan, manifest


def test_prepare_cuts_the_week_into_shard_runs_and_is_idempotent(week) -> None:
    settings, plan, manifest = week
    kw = dict(plan=plan, settings=settings, dag_id="avsim_weekly", run_id="manual__1")
    first = prepare_week(source=str(manifest), **kw)
    # A canary of 4 cases (10 % of 25, at least 4) as shard 0, the other 21 in shards 1..3.
    canary = first["canary"]
    assert (
        canary["shard"] == 0 and canary["trigger_run_id"] == "manual__1__canary" and len(canary["cases"]) == 4
    )
    assert [s["shard"] for s in first["shards"]] == [1, 2, 3]
    assert [s["trigger_run_id"] for s in first["shards"]] == [f"manual__1__shard_000{k}" for k in (1, 2, 3)]
    assert first["run"]["case_count"] == 25 and len(first["run"]["manifest_sha256"]) == 64
    assert first["run"]["canary_count"] == 4 and first["run"]["shard_count"] == 3
    assert prepare_week(source=str(manifest), **kw) == first  # a retry of prepare
    loaded = [tasks.load_shard(s["conf"], plan) for s in [canary, *first["shards"]]]
    ids = [c["case_id"] for part in loaded for f in plan.families for c in part[f"cases_{f.name}"]]
    assert sorted(ids) == [f"case-{i:05d}" for i in range(1, 26)]
    assert set(canary["cases"]) == {c["case_id"] for f in plan.families for c in loaded[0][f"cases_{f.name}"]}
    # What the run plans (for the deadline tracker and the UI) and which run is this ISO week's.
    root = Path(settings.resolved_artifact_root.removeprefix("file://"))
    key = first["run"]["run_key"]
    planned = json.loads((root / "runs" / key / "manifest" / "plan.json").read_text())
    assert planned["cases"] == 25 and planned["canary_cases"] == 4 and planned["gpu_seconds"] > 0
    assert sum(v["cases"] for k, v in planned["per_phase"].items() if k.endswith(".prepare")) == 25
    week_doc = json.loads((root / "weeks" / f"{first['run']['iso_week']}.json").read_text())
    assert week_doc["run_key"] == key
    # The snapshot is immutable: another manifest under the same run is refused.
    other = manifest.with_name("other.json")
    other.write_text(json.dumps(sample_manifest(25, seed=99)))
    with pytest.raises(AvsimError, match="immutable"):
        prepare_week(source=str(other), **kw)


def test_a_bad_shard_conf_is_rejected_with_its_fields(week) -> None:
    _, plan, _ = week
    with pytest.raises(ManifestError) as exc:
        tasks.load_shard({"shard": "3"}, plan)
    assert "conf.run: missing" in str(exc.value) and "conf.shard: must be an integer" in str(exc.value)


def test_summarize_counts_cases_that_never_ran_as_infrastructure(week) -> None:
    settings, plan, manifest = week
    prepared = prepare_week(
        source=str(manifest), plan=plan, settings=settings, dag_id="avsim_weekly", run_id="manual__2"
    )
    from avsim.artifacts import RunLayout
    from avsim.operators.exceptions import ShardNeedsAttention
    from avsim.storage import read_json

    conf = prepared["shards"][2]["conf"]
    # A case that never ran needs attention: the summary is written, then the shard run fails.
    with pytest.raises(ShardNeedsAttention, match=r"shard 3: 1 of 1 cases need attention \(infra_failed 1\)"):
        tasks.summarize(conf, plan)
    summary = read_json(RunLayout(conf["run"]["artifact_root"], conf["run"]["run_key"]).shard_summary(3))
    assert summary["counts"] == {
        "cases": 1,
        "passed": 0,
        "scenario_failed": 0,
        "bad_build": 0,
        "bad_input": 0,
        "infra_failed": 1,
        "preempted": 0,
    }


def test_no_manifest_for_the_scheduled_run_names_the_setting() -> None:
    with pytest.raises(ManifestError, match="default_manifest"):
        manifest_source({}, AvsimSettings(), None)
    import datetime as dt

    when = dt.datetime(2026, 12, 2, tzinfo=dt.UTC)
    scheduled = manifest_source({}, AvsimSettings(default_manifest="s3://b/{iso_week}.yaml"), when)
    assert (scheduled.location, scheduled.name, scheduled.fmt) == ("s3://b/2026-W49.yaml",) * 2 + ("yaml",)


def test_a_week_without_canary_stage_succeeds_its_canary_task() -> None:
    """Not a skip: the run-level phases and the report wait on the canary with
    all_done_min_one_success, which Airflow 3.3 skips when an upstream was skipped."""
    from avsim.operators.shard import ShardRunOperator

    op = ShardRunOperator(
        task_id="canary",
        trigger_dag_id="avsim_weekly_shard",
        trigger_run_id="r__canary",
        shard=0,
        run={"run_key": "avsim_weekly__r", "artifact_root": "file:///tmp/avsim-none", "canary_count": 0},
    )
    result = op.execute({})
    assert result["counts"] == {} and "no canary stage" in result["message"]


def test_prepare_sizes_admission_from_the_pools_and_a_retry_keeps_the_cut(week, tmp_path: Path) -> None:
    """Admitting by cases in flight (the shipped [avsim] admission), prepare derives the week's target
    from the pools' slots (read by ``pool_slots``: the REST API in a worker) and cuts shard runs of
    about a third of it; a retry that reads other slots keeps the shard runs already cut. Without the
    slots it runs the window's shape (S, target W x S); with [avsim] admission = window, no admission."""
    from dataclasses import replace

    from avsim.contracts import RunDescriptor
    from avsim.manifest.validation import validate_manifest
    from avsim.plan.admission import admission_shard_size
    from avsim.plan.inflight import Pools, target_cases_in_flight
    from avsim.planner.workload import workload_from_manifest

    settings, plan, manifest = week
    plan = replace(plan, shard_size=250, max_active_shards=6)
    # A scheduler slow enough (200 ms per task instance) that it carries 5 cases comfortably: the
    # pools set the target. At the shipped 3 ms, this 25-case week is not throttled at all.
    shipped = prepare_week(
        source=str(manifest),
        pool_slots=lambda: (4, 8),
        plan=plan,
        settings=settings,
        dag_id="avsim_weekly",
        run_id="manual__shipped",
    )
    assert shipped["run"]["admission"]["target"] == 25 == shipped["run"]["admission"]["floor"]
    settings = replace(settings, scheduler_ms_per_task_instance=200.0)
    kw = dict(plan=plan, settings=settings, dag_id="avsim_weekly", run_id="manual__pools")
    first = prepare_week(source=str(manifest), pool_slots=lambda: (4, 8), **kw)
    run = RunDescriptor.model_validate(first["run"])
    load = workload_from_manifest(validate_manifest(json.loads(manifest.read_text()))).case_load()
    target = target_cases_in_flight(load, Pools(spot_gpus=4, cpus=8))
    assert run.admission is not None and (run.admission.spot_gpus, run.admission.cpus) == (4, 8)
    assert run.admission.target == target > run.admission.floor == 5 and run.admission.configured == 0
    assert run.shard_size == admission_shard_size(21, target, 250) < 21
    assert run.shard_count == -(-21 // run.shard_size) == len(first["shards"])
    again = prepare_week(source=str(manifest), pool_slots=lambda: (40, 80), **kw)
    assert again["run"]["shard_size"] == run.shard_size and again["run"]["shard_count"] == run.shard_count
    assert [s["trigger_run_id"] for s in again["shards"]] == [s["trigger_run_id"] for s in first["shards"]]

    def unreachable() -> tuple[int | None, int | None]:
        raise ConnectionError("the Airflow API cannot be reached")

    blind = prepare_week(source=str(manifest), pool_slots=unreachable, **{**kw, "run_id": "manual__blind"})
    blind_run = RunDescriptor.model_validate(blind["run"])
    assert blind_run.admission is not None and blind_run.admission.target == 250 * 6
    assert blind_run.shard_size == 250 and blind_run.shard_count == 1
    window = prepare_week(
        source=str(manifest),
        pool_slots=lambda: (4, 8),
        **{**kw, "run_id": "manual__window", "settings": replace(settings, admission="window")},
    )
    assert window["run"]["admission"] is None and window["run"]["shard_size"] == 250
