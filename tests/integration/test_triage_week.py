"""Triage end to end on the real scheduler, triggerer and PostgreSQL (local backend, nothing mocked).

Week N runs on build A; week N+1 on build B, where three scenarios regress (they fail on B only),
two flake (``flake:0.5``, cases chosen so that they passed in week N, fail in week N+1 and pass on a
rerun) and one meets a broken pool in its reruns (``crash_in:__triage_``). The report, the triage
document and the weekly run's page classify all six; the week ends on time; the reruns never touch
the week's committed outcomes, the cache or the build's breaker.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.airflow_run import api, query, trigger, wait_for_run
from tests.support.stacks import read_json, weekly_stack

from avsim.artifacts import RunLayout, run_key_for, triage_run_key
from avsim.devstack.fakesim import flake_draw
from avsim.devstack.stack import LocalStack
from avsim.ledger.breaker import Breaker
from avsim.ledger.store import Ledger
from avsim.manifest.deadline import iso_week_of
from avsim.manifest.sample import sample_manifest
from avsim.report.build import week_case_rows
from avsim.report.compare import previous_iso_week
from avsim.triage.model import TriageReport, TriageVerdict
from avsim.triage.runs import TriageBook, plan_uri

pytestmark = [pytest.mark.integration, pytest.mark.long]

CASES = 30
#: Six of 30 cases newly fail, each rerun 4 times from its simulate: most of a week this small.
SHARE = 1.0
DIGEST_B = "sha256:" + hashlib.sha256(b"avsim-simulator-build:B").hexdigest()
WEEK_A, WEEK_B = "it__week_a", "it__week_b"  # no "__triage_" in them: a fault keyed on it


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    env = {"AIRFLOW__AVSIM__TRIAGE_GPU_SHARE": str(SHARE), "AIRFLOW__AVSIM__TRIAGE_RERUNS": "2"}
    with weekly_stack(
        tmp_path_factory.mktemp("triage"), shard_size=10, max_active_shards=3, extra_env=env
    ) as s:
        yield s


def _key(run_id: str) -> str:
    return run_key_for("avsim_weekly", run_id)


def _flake_fits(case: dict[str, Any]) -> bool:
    """Passed in week N, fails in week N+1, passes on the first rerun of build B."""
    seed, cid = case["seed"], case["id"]

    def draw(key: str) -> float:
        return flake_draw(
            seed, cid, "simulate", RunLayout("file:///x", key).attempt_output(cid, "simulate", 1)
        )

    return (
        draw(_key(WEEK_A)) >= 0.5
        and draw(_key(WEEK_B)) < 0.5
        and draw(triage_run_key(_key(WEEK_B), "1_this_1")) >= 0.5
    )


def _weeks() -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    now = dt.datetime.now(dt.UTC)
    this_week = iso_week_of(now)
    last_week = previous_iso_week(this_week)
    assert last_week is not None
    common = {"time_scale": 0.002, "scenario_fail_rate": 0.0, "deadline": now + dt.timedelta(days=1)}
    doc_a = sample_manifest(CASES, iso_week=last_week, **common)
    sim = doc_a["graphs"]["standard"]["phases"]["simulate"]
    sim["deterministic_outputs"] = ["trace.jsonl"]
    standard = [c for c in doc_a["cases"] if c["graph"] == "standard"]
    planted: dict[str, str] = {}
    regress = f"scenario_failed_on:{DIGEST_B[:19]}"
    for c in standard[:3]:
        planted[c["id"]] = "regression"
        c["parameters"]["fakesim"] = {"simulate": regress}
    flakes = [c for c in standard[3:] if _flake_fits(c)][:2]
    assert len(flakes) == 2, "the sample has two standard cases whose flake draws fit"
    for c in flakes:
        planted[c["id"]] = "flaky"
        c["parameters"]["fakesim"] = {"simulate": "flake:0.5"}
    pool = next(c for c in standard[3:] if c["id"] not in planted)
    planted[pool["id"]] = "environment"
    pool["parameters"]["fakesim"] = {"simulate": f"{regress}+crash_in:__triage_"}
    doc_b = json.loads(json.dumps(doc_a))
    doc_b["run"]["iso_week"] = this_week
    doc_b["run"]["build"] = {
        "build_id": "build-B",
        "image": f"registry.example.com/avsim/simulator@{DIGEST_B}",
    }
    return doc_a, doc_b, planted


def _start_week(stack: LocalStack, run_id: str, doc: dict[str, Any]) -> RunLayout:
    path = stack.home / f"{run_id}.json"
    path.write_text(json.dumps(doc))
    trigger(stack, "avsim_weekly", run_id, {"manifest": str(path)})
    return RunLayout(f"file://{stack.home / 'artifacts'}", _key(run_id))


def _run_week(stack: LocalStack, run_id: str, doc: dict[str, Any]) -> RunLayout:
    layout = _start_week(stack, run_id, doc)
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=1200) == "success"
    return layout


def _clear_during_triage(stack: LocalStack, run_id: str) -> None:
    """Wait until ``triage`` waits for its runs, then clear the whole weekly run, as an engineer's
    *Clear* of the run in the grid does (every task, not only the failed ones)."""
    for _ in range(1200):
        states = query(
            stack,
            "SELECT state FROM task_instance WHERE dag_id = 'avsim_weekly' AND run_id = :r AND task_id = 'triage'",
            r=run_id,
        )
        if states and states[0][0] == "deferred":
            break
        time.sleep(1)
    else:
        raise AssertionError(f"triage never waited for its runs: {states}")
    body = {"dry_run": False, "dag_run_id": run_id, "only_failed": False, "reset_dag_runs": True}
    cleared = api(stack, "POST", "/api/v2/dags/avsim_weekly/clearTaskInstances", body)
    assert any(t["task_id"] == "triage" for t in cleared["task_instances"])


def _committed(layout: RunLayout) -> dict[tuple[str, str], tuple[str, int]]:
    ledger = Ledger(layout)
    return {
        (c.case_id, name): (p.outcome_name, p.attempt or 0)
        for s in ledger.shard_summaries()
        for c in s.cases
        for name, p in c.phases.items()
    }


def test_newly_failing_cases_get_their_verdicts_on_the_weekly_run(stack: LocalStack) -> None:
    doc_a, doc_b, planted = _weeks()
    week_a = _run_week(stack, WEEK_A, doc_a)
    first = TriageReport.model_validate(read_json(f"{week_a.report_dir}/triage.json"))
    assert first.message.startswith("nothing to triage: no weekly run recorded for"), first.message
    assert not first.cases

    started = dt.datetime.now(dt.UTC)
    week_b = _start_week(stack, WEEK_B, doc_b)
    _clear_during_triage(stack, WEEK_B)
    assert wait_for_run(stack, "avsim_weekly", WEEK_B, timeout=1200) == "success"
    ended = dt.datetime.now(dt.UTC)
    # The clear started no second round: the four triage runs of round 1, each ended.
    runs = query(
        stack,
        "SELECT run_id, state FROM dag_run WHERE dag_id = 'avsim_weekly_shard' AND run_id LIKE :p",
        p=f"{WEEK_B}__triage_%",
    )
    assert sorted(r for r, _ in runs) == [
        f"{WEEK_B}__triage_1_{side}_{n}" for side in ("last", "this") for n in (1, 2)
    ]
    assert {state for _, state in runs} <= {"success", "failed"}
    triage = TriageReport.model_validate(read_json(f"{week_b.report_dir}/triage.json"))
    verdicts = {c.case_id: c.verdict.value for c in triage.cases}
    assert verdicts == planted, [c.model_dump(mode="json") for c in triage.cases]
    assert triage.counts[TriageVerdict.REGRESSION] == 3 and triage.counts[TriageVerdict.FLAKY] == 2
    regression = next(c for c in triage.cases if c.verdict is TriageVerdict.REGRESSION)
    assert {(r.build.value, r.outcome.value if r.outcome else None) for r in regression.reruns} == {
        ("this", "scenario_failed"),
        ("last", "passed"),
    }
    assert all("__triage_1_" in r.output_uri for r in regression.reruns)
    assert triage.audit is not None and len(triage.audit.sampled) >= 5 and triage.audit.rate == 0.0

    # The report opens with the verdicts and carries them as data; the week ended before its deadline.
    report = read_json(f"{week_b.report_dir}/report.json")
    assert report["triage"]["counts"] == {v.value: n for v, n in triage.counts.items()}
    page = Path(week_b.report_dir.removeprefix("file://"), "report.html").read_text(encoding="utf-8")
    assert page.index("<h2>Regressions</h2>") < page.index("<h2>Cases</h2>")
    assert dt.datetime.fromisoformat(doc_b["run"]["deadline"].replace("Z", "+00:00")) > ended > started

    # The weekly run's page counts the verdicts and links each case.
    page_doc = api(stack, "GET", f"/avsim/api/runs/avsim_weekly/{WEEK_B}/progress")
    assert page_doc["triage"]["counts"] == report["triage"]["counts"]
    assert {c["case_id"]: c["verdict"] for c in page_doc["triage"]["cases"]} == planted
    assert all(c["url"] for c in page_doc["triage"]["cases"])

    # Triage's GPU-seconds stay within its share of the week's, and nothing of the week changed.
    week_gpu = float(report["gpu_seconds"]["total"])
    used = sum(
        float(r["gpu_seconds"])
        for rnd in TriageBook.model_validate(read_json(plan_uri(week_b))).rounds
        for run in rnd.runs
        for r in week_case_rows(RunLayout(week_b.root, run.run_key))
    )
    assert 0 < used <= SHARE * week_gpu, (used, week_gpu)
    assert triage.planned_gpu_seconds <= SHARE * week_gpu
    committed = _committed(week_b)
    for case_id in planted:
        assert committed[(case_id, "simulate")][0] == "scenario_failed"
    breaker = Breaker(week_b.root, DIGEST_B).state()
    assert not breaker.is_open, "triage's crashes are no evidence against the build"
