"""One case of a weekly run: its phases, their attempts and committed outcomes, task instances, artifacts.

The ledger (artifact store) says what each attempt did and which one counts; the metadata
database says where each phase's task instance is (shard run, map index, state, try).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from avsim import airflow_internals, urls
from avsim.artifacts import RunLayout, run_key_for, shard_dag_id
from avsim.contracts import PREPARE_TASK_ID, RUN_XCOM_KEY
from avsim.ui import run_docs
from avsim.ui.files import check_segment, resolve


def weekly_runs_by_key(session: Session) -> dict[str, tuple[str, str]]:
    """(dag id, run id) of every weekly run whose prepare recorded a run descriptor, by run key: the
    key it recorded and the key of its ids."""
    XComModel = airflow_internals.models()["XComModel"]

    found: dict[str, tuple[str, str]] = {}
    for dag_id, run_id, value in session.execute(
        select(XComModel.dag_id, XComModel.run_id, XComModel.value).where(
            XComModel.key == RUN_XCOM_KEY, XComModel.task_id == PREPARE_TASK_ID
        )
    ).all():
        desc = run_docs.run_descriptor(value, f"{dag_id} {run_id}")
        week = (str(dag_id), str(run_id))
        found.setdefault(run_key_for(*week), week)
        if desc is not None:
            found[desc.run_key] = week
    return found


def weekly_run_of(session: Session, run_key: str) -> tuple[str, str] | None:
    """(dag id, run id) of the weekly run whose prepare recorded this run key, if any."""
    return weekly_runs_by_key(session).get(run_key)


def task_instances(session: Session, dag_id: str, run_id: str, case_id: str) -> list[dict[str, Any]]:
    """The phase task instances of a case in the weekly run's shard runs."""
    TI = airflow_internals.models()["TaskInstance"]

    shard_dag = shard_dag_id(dag_id)
    rows = session.execute(
        select(
            TI.run_id,
            TI.task_id,
            TI.map_index,
            TI.state,
            TI.try_number,
            TI.start_date,
            TI.end_date,
            TI.duration,
        ).where(
            TI.dag_id == shard_dag,
            TI.run_id.startswith(f"{run_id}__", autoescape=True),
            TI.__table__.c.rendered_map_index == case_id,
            TI.map_index >= 0,
        )
    ).all()
    return [
        {
            "phase": str(task_id).split(".", 1)[-1],
            "task_id": task_id,
            "run_id": rid,
            "map_index": map_index,
            "state": state,
            "try_number": tries,
            "start_date": start.isoformat() if start else None,
            "end_date": end.isoformat() if end else None,
            "duration": duration,
            "url_path": (shard_dag, str(rid), str(task_id), int(map_index)),
        }
        for rid, task_id, map_index, state, tries, start, end, duration in rows
    ]


def _ti_url(where: tuple[str, str, str, int], base: str) -> str:
    dag_id, run_id, task_id, map_index = where
    return urls.airflow_task_instance(dag_id, run_id, task_id, map_index, base)


def _names(folder: Any) -> list[str]:
    try:
        return sorted(p.name for p in folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def case_detail(
    layout: RunLayout, case_id: str, tis: Sequence[Mapping[str, Any]], base: str = ""
) -> dict[str, Any]:
    """The case page's document: one entry per phase found in the ledger or the database."""
    from avsim.ledger.store import Ledger

    check_segment(case_id, "case id")
    ledger = Ledger(layout)
    run_base = resolve(layout.root, layout.run_key, "")
    attempted = _names(run_base / "ledger" / "attempts" / case_id)
    committed = [n.removesuffix(".json") for n in _names(run_base / "ledger" / "outcomes" / case_id)]
    by_phase = {str(t["phase"]): t for t in tis}
    names = list(dict.fromkeys([*by_phase, *attempted, *committed]))
    phases = []
    for phase in names:
        outcome = ledger.outcome(case_id, phase)
        attempts = ledger.attempts(case_id, phase)
        ti = by_phase.get(phase)
        phases.append(
            {
                "phase": phase,
                "outcome": outcome.to_json() if outcome else None,
                "attempts": [a.to_json() for a in attempts],
                "task_instance": (
                    {k: v for k, v in ti.items() if k != "url_path"} | {"url": _ti_url(ti["url_path"], base)}
                    if ti
                    else None
                ),
                "artifacts": urls.phase_artifacts(layout.run_key, case_id, phase, base),
                "attempt_folders": [
                    {"name": n, "url": urls.run_file(layout.run_key, f"cases/{case_id}/{phase}/{n}/", base)}
                    for n in _names(run_base / "cases" / case_id / phase)
                ],
            }
        )
    return {"run_key": layout.run_key, "case_id": case_id, "phases": phases}
