"""The finish estimate, against numbers worked out by hand.

One family of the deployed catalog's shape: prepare (CPU, 180 s) -> simulate (1 GPU, 1800 s)
-> evaluate (CPU, 300 s) -> report (CPU, 60 s), 100 cases. Paths to the end of a case:
prepare 2340 s, simulate 2160 s, evaluate 360 s, report 60 s.
"""

from __future__ import annotations

import datetime as dt

import pytest

from avsim.deadline.estimate import (
    PhaseProgress,
    PlanDocumentError,
    PlannedWork,
    estimate_finish,
    remaining_paths,
)

NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)
GRAPH = {
    "standard.prepare": [],
    "standard.simulate": ["standard.prepare"],
    "standard.evaluate": ["standard.simulate"],
    "standard.report": ["standard.evaluate"],
}


def planned(deadline: dt.datetime, cases: int = 100) -> PlannedWork:
    doc = {
        "deadline": deadline.isoformat(),
        "per_phase": {
            "standard.prepare": {"cases": cases, "gpus": 0, "estimated_seconds": 180},
            "standard.simulate": {"cases": cases, "gpus": 1, "estimated_seconds": 1800},
            "standard.evaluate": {"cases": cases, "gpus": 0, "estimated_seconds": 300},
            "standard.report": {"cases": cases, "gpus": 0, "estimated_seconds": 60},
        },
    }
    return PlannedWork.from_document(doc, GRAPH, "plan.json")


MIDWAY = {
    "standard.prepare": PhaseProgress(finished=100),
    "standard.simulate": PhaseProgress(finished=40, active=10, waiting=50),
    "standard.evaluate": PhaseProgress(finished=35, active=2),
    "standard.report": PhaseProgress(finished=30),
}


def test_paths_to_the_end_of_a_case() -> None:
    assert remaining_paths(planned(NOW).phases) == {
        "standard.prepare": 2340.0,
        "standard.simulate": 2160.0,
        "standard.evaluate": 360.0,
        "standard.report": 60.0,
    }


def test_late_run_asks_for_the_gpus_that_make_the_deadline() -> None:
    # simulate: 60 left, 10 running (half done) -> 55 x 1800 = 99,000 GPU-s on the 10 GPUs in use
    # = 9,900 s; the path from a simulate not yet started is 2,160 s. Finish = now + 9,900 s.
    est = estimate_finish(planned(NOW + dt.timedelta(hours=2)), MIDWAY, NOW)
    assert est.remaining_gpu_seconds == 99_000
    assert est.remaining_cpu_seconds == 64 * 300 + 70 * 60  # evaluate 65 left (2 half done), report 70
    assert est.remaining_path_seconds == 2160
    assert est.gpus_in_use == 10 and est.gpu_bound
    assert est.estimated_finish == NOW + dt.timedelta(seconds=9_900)
    assert est.seconds_late == 9_900 - 7_200
    assert est.late
    assert est.gpus_needed == 14  # ceil(99,000 / 7,200 s left) = ceil(13.75)
    assert est.cases_left == 70
    assert est.reason == "late by 0.8 h on 10 GPUs; 14 GPUs would make it"
    assert est.phases["standard.simulate"] == {"planned": 100, "finished": 40, "active": 10, "waiting": 50}


def test_on_track_run_reports_its_margin_and_the_gpus_it_needs() -> None:
    est = estimate_finish(planned(NOW + dt.timedelta(hours=3)), MIDWAY, NOW)
    assert est.seconds_late == 9_900 - 10_800 and not est.late
    assert est.gpus_needed == 10  # ceil(99,000 / 10,800) = ceil(9.17)
    assert est.reason == "on track: 0.2 h ahead of the deadline"


def test_when_the_path_alone_passes_the_deadline_no_gpu_count_helps() -> None:
    est = estimate_finish(planned(NOW + dt.timedelta(minutes=30)), MIDWAY, NOW)
    assert est.late and est.gpus_needed is None
    assert "alone passes the deadline: more GPUs cannot make it" in est.reason


def test_phases_all_running_count_half_their_path() -> None:
    progress = {
        "standard.prepare": PhaseProgress(finished=100),
        "standard.simulate": PhaseProgress(finished=90, active=10),
        "standard.evaluate": PhaseProgress(finished=90),
        "standard.report": PhaseProgress(finished=90),
    }
    est = estimate_finish(planned(NOW + dt.timedelta(hours=1)), progress, NOW)
    # simulate: every one of the 10 left is running -> 2160 - 900 = 1260 s of path; 5 x 1800 GPU-s / 10.
    assert est.remaining_path_seconds == 1260
    assert est.remaining_gpu_seconds == 9_000
    assert est.estimated_finish == NOW + dt.timedelta(seconds=1260)
    assert not est.gpu_bound


def test_known_capacity_counts_before_gpu_phases_start() -> None:
    fresh: dict[str, PhaseProgress] = {}
    deadline = NOW + dt.timedelta(hours=100)
    unknown = estimate_finish(planned(deadline), fresh, NOW)
    assert unknown.estimated_finish is None and unknown.seconds_late is None and unknown.gpus_needed is None
    assert "no GPU phase is running yet" in unknown.reason
    # 100 x 1800 GPU-s on 20 known GPUs = 9,000 s; the path is 2,340 s.
    known = estimate_finish(planned(deadline), fresh, NOW, gpu_capacity=20)
    assert known.estimated_finish == NOW + dt.timedelta(seconds=9_000)
    assert known.cases_left == 100


def test_multi_gpu_phases_count_their_gpus() -> None:
    doc = {
        "deadline": "2026-12-02T14:00:00Z",
        "per_phase": {"big.simulate": {"cases": 10, "gpus": 4, "estimated_seconds": 600}},
    }
    plan = PlannedWork.from_document(doc, {"big.simulate": []}, "plan.json")
    est = estimate_finish(plan, {"big.simulate": PhaseProgress(finished=2, active=3)}, NOW)
    # 8 left, 3 running: 6.5 x 4 x 600 = 15,600 GPU-s on 12 GPUs = 1,300 s.
    assert (est.remaining_gpu_seconds, est.gpus_in_use) == (15_600, 12)
    assert est.estimated_finish == NOW + dt.timedelta(seconds=1_300)
    assert est.gpus_needed == 3  # ceil(15,600 / 7,200)


def test_a_finished_week_finishes_now() -> None:
    done = {t: PhaseProgress(finished=100) for t in GRAPH}
    est = estimate_finish(planned(NOW + dt.timedelta(hours=1)), done, NOW)
    assert est.estimated_finish == NOW and est.cases_left == 0 and est.gpus_needed == 0


def test_a_phase_the_plan_does_not_list_has_no_cases() -> None:
    doc = {"deadline": "2026-12-06T18:00:00+00:00", "per_phase": {}}
    plan = PlannedWork.from_document(doc, GRAPH, "plan.json")
    assert {p.task_id: p.cases for p in plan.phases} == dict.fromkeys(GRAPH, 0)
    assert plan.deadline == dt.datetime(2026, 12, 6, 18, tzinfo=dt.UTC)


def test_a_bad_plan_document_names_every_problem() -> None:
    doc = {
        "deadline": "2026-12-06T18:00:00",
        "per_phase": {
            "standard.simulate": {"cases": -1, "gpus": True, "estimated_seconds": 1800},
            "standard.teleport": {"cases": 1, "gpus": 0, "estimated_seconds": 1},
        },
    }
    with pytest.raises(PlanDocumentError) as err:
        PlannedWork.from_document(doc, GRAPH, "s3://avsim/runs/x/manifest/plan.json")
    text = str(err.value)
    assert "s3://avsim/runs/x/manifest/plan.json cannot be used" in text
    assert "deadline: has no time zone" in text
    assert "per_phase['standard.teleport']: not a phase of the deployed shard DAG" in text
    assert "per_phase['standard.simulate'].cases: must be a whole number >= 0, got -1" in text
    assert "per_phase['standard.simulate'].gpus: must be a whole number >= 0, got True" in text
    assert "rerun prepare" in text
