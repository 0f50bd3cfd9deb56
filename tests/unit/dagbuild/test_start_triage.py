"""``triage_start`` never fails the week: an error is recorded in the triage book and the task
returns no run to wait for, so ``triage`` writes the reason at once and the report is not held."""

from __future__ import annotations

from pathlib import Path

from tests.support.lifecycle import prepared_week

from avsim.contracts import RunDescriptor
from avsim.dagbuild import tasks
from avsim.dagbuild.factory import load_plan
from avsim.operators.triage import TriageOperator
from avsim.settings import AvsimSettings
from avsim.triage.start import read_book
from avsim.triage.store import read_triage

ROOT = Path(__file__).resolve().parents[3]


def test_an_error_is_recorded_and_nothing_is_waited_for(tmp_path: Path) -> None:
    run, _, _ = prepared_week(tmp_path)
    week = RunDescriptor.model_validate(run)
    Path(week.layout.head_uri.removeprefix("file://")).unlink()  # the week's snapshot head is gone
    plan = load_plan(ROOT / "dags" / "avsim_graphs.yaml", AvsimSettings())
    assert tasks.start_triage(run, plan, AvsimSettings(), "avsim_weekly_shard") == []
    book = read_book(week.layout)
    assert (
        book is not None and book.message.startswith("triage did not start:") and "head.json" in book.message
    )
    counts = TriageOperator(task_id="triage", run=run, run_ids=[], shard_dag_id="avsim_weekly_shard").execute(
        {}
    )
    assert set(counts.values()) == {0}
    assert read_triage(week.layout).message == book.message
