"""Checks that a finished week's Airflow states tell what its ledger says (avsim.verdict's rule)."""

from __future__ import annotations

from typing import Any

from tests.support.airflow_run import query

from avsim import storage
from avsim.artifacts import RunLayout
from avsim.devstack.stack import LocalStack
from avsim.ledger.store import Ledger
from avsim.verdict import shard_verdict


def check_states_match_the_ledger(stack: LocalStack, run_id: str, layout: RunLayout) -> dict[str, Any]:
    """Each shard run (and its ``shards`` map index) failed exactly when a case of it needs attention,
    and the weekly run failed exactly when the report's verdict is not ``passed``. Returns the verdict."""
    report = storage.read_json(f"{layout.report_dir}/report.json")
    verdict = report["verdict"]
    [(week_state,)] = query(
        stack, "SELECT state FROM dag_run WHERE dag_id = 'avsim_weekly' AND run_id = :r", r=run_id
    )
    assert week_state == ("success" if verdict["state"] == "passed" else "failed"), (week_state, verdict)
    runs = dict(
        query(
            stack,
            "SELECT run_id, state FROM dag_run WHERE dag_id = 'avsim_weekly_shard' AND position(:p in run_id) = 1",
            p=f"{run_id}__",
        )
    )
    by_shard = {s.shard: shard_verdict(s) for s in Ledger(layout).shard_summaries()}
    for shard_run, state in runs.items():
        tail = shard_run.rsplit("__", 1)[-1]
        shard = 0 if tail == "canary" else int(tail.removeprefix("shard_"))
        wanted = "failed" if by_shard[shard].needs_attention else "success"
        assert state == wanted, (shard_run, state, by_shard[shard].line())
    labels = query(
        stack,
        "SELECT state, rendered_map_index FROM task_instance WHERE dag_id = 'avsim_weekly' AND run_id = :r "
        "AND task_id = 'shards'",
        r=run_id,
    )
    for state, label in labels:
        shard = int(str(label).split()[1])
        if state in ("success", "failed"):
            assert state == ("failed" if by_shard[shard].needs_attention else "success"), (label, state)
            assert str(label) == f"shard {shard}{by_shard[shard].label}"
    return dict(verdict)
