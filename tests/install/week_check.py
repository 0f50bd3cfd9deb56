"""A 10-case week on the real scheduler, run by the install tier inside another venv.

Not collected by ``make test`` (its name is not ``test_*``): tests/install/test_lowest_versions.py
runs it with the lowest supported set's interpreter. Real components on PostgreSQL, the fake
simulator's phases, the report with its plots.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.support.airflow_run import query, trigger, wait_for_run
from tests.support.stacks import weekly_stack

from avsim.artifacts import RunLayout, run_key_for
from avsim.manifest.sample import sample_manifest

pytestmark = pytest.mark.install
CASES = 10


def test_a_ten_case_week_succeeds(tmp_path: Path) -> None:
    with weekly_stack(tmp_path, shard_size=5, max_active_shards=2) as stack:
        doc = sample_manifest(
            CASES, time_scale=0.00002, scenario_fail_rate=0.2, canary={"share": 0.2, "min_cases": 2}
        )
        manifest = stack.home / "week.json"
        manifest.write_text(json.dumps(doc))
        run_id = "install__week"
        trigger(stack, "avsim_weekly", run_id, {"manifest": str(manifest)})
        state = wait_for_run(stack, "avsim_weekly", run_id, timeout=900)
        failed = query(
            stack,
            "SELECT dag_id, run_id, task_id, map_index FROM task_instance WHERE run_id LIKE :p "
            "AND state IN ('failed', 'upstream_failed')",
            p=f"{run_id}%",
        )
        assert state == "success", f"failed task instances (their logs: {stack.home / 'logs'}): {failed}"
        shard_runs = query(
            stack,
            "SELECT state FROM dag_run WHERE dag_id = 'avsim_weekly_shard' AND run_id LIKE :p",
            p=f"{run_id}__%",
        )
        assert len(shard_runs) >= 2 and {s for (s,) in shard_runs} == {"success"}
        layout = RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for("avsim_weekly", run_id))
        folder = Path(layout.report_dir.removeprefix("file://"))
        report = json.loads((folder / "report.json").read_text())
        assert report["totals"]["cases"] == CASES
        assert (folder / "progress.svg").read_text().lstrip().startswith("<?xml")
