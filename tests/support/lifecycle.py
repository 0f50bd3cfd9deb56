"""A phase lifecycle without a scheduler: a prepared week on a file:// ledger, a phase task's fields
and the lifecycle its operator holds, and a small stand-in for Airflow's task instance (try number, max tries,
map index, the run's other task states, an XCom table)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from avsim.artifacts import RunLayout
from avsim.attempt import PhaseAttempt
from avsim.dagbuild import tasks
from avsim.dagbuild.factory import load_plan
from avsim.dagbuild.prepare import prepare_week
from avsim.ledger.store import Ledger
from avsim.manifest.sample import sample_manifest
from avsim.operators.lifecycle import PhaseLifecycle
from avsim.phases.policy import Role, task_retries
from avsim.settings import AvsimSettings

ROOT = Path(__file__).resolve().parents[2]
#: (run descriptor, its first case, its ledger)
Week = tuple[dict[str, Any], dict[str, Any], Ledger]


@dataclass
class TaskInstance:
    """What the lifecycle reads from Airflow's task instance, and an XCom table."""

    task_id: str
    try_number: int = 1
    max_tries: int = 0
    map_index: int = 0
    xcoms: dict[tuple[str, str, int], Any] = field(default_factory=dict)
    dag_id: str = "avsim_weekly_shard"
    run_id: str = "w1__shard_0001"
    #: (task id, map index) -> state of the run's other task instances, as the execution API has them.
    states: dict[tuple[str, int], str] = field(default_factory=dict)

    def get_task_states(
        self, dag_id: str, map_index: int | None, task_ids: list[str], run_ids: list[str]
    ) -> dict[str, Any]:
        """Airflow 3.3.2's answer: by run id, then task id (``_<map index>`` for a mapped one)."""
        found = {
            f"{t}_{m}" if m >= 0 else t: s
            for (t, m), s in self.states.items()
            if t in task_ids and (map_index is None or m == map_index)
        }
        return {run_ids[0]: found} if found else {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[(self.task_id, key, self.map_index)] = value

    def xcom_pull(self, task_ids: str, key: str = "return_value", map_indexes: int | None = None) -> Any:
        return self.xcoms.get((task_ids, key, self.map_index if map_indexes is None else map_indexes))


class Phase:
    """A phase task of ``role``: the fields its operator keeps, and the lifecycle it holds (built from
    them as the operator builds it when its task runs)."""

    def __init__(self, run: dict[str, Any], case: dict[str, Any], phase: str, role: Role, gpus: int) -> None:
        self.phase, self.case, self.run, self.role, self.gpus = phase, case, run, role, gpus
        self.upstream_phases, self.inputs, self.reuse_outputs = None, None, True
        self.task_id = f"standard.{phase}" + ("_on_demand" if role is Role.ON_DEMAND else "")
        self.log = logging.getLogger("test.lifecycle")
        self.retries = 0

    @property
    def lifecycle(self) -> PhaseLifecycle:
        if "lifecycle" not in self.__dict__:
            self.__dict__["lifecycle"] = PhaseLifecycle.of(self)
        return self.__dict__["lifecycle"]

    def take_over(self, context: Any) -> None:
        """What the operator does when its task runs: an on-demand twin takes its spot task's hand-over."""
        self.__dict__["lifecycle"] = PhaseLifecycle.of(self, context)

    def set_retries(self) -> None:
        r = self.lifecycle.service.books.runtime_spec().get("retry") or {}
        self.retries = task_retries(
            self.role,
            int(r.get("infrastructure", 2)),
            int(r.get("preemption", 3)),
            int(r.get("on_demand_after_preemptions", 2)),
        )
        self.__dict__.pop("lifecycle", None)  # built again with the task's retries


def prepared_week(tmp_path: Path) -> Week:
    """A prepared 4-case week on a file:// ledger: (run descriptor, its first case, its ledger)."""
    settings = AvsimSettings(shard_size=4, artifact_root=f"file://{tmp_path / 'artifacts'}")
    plan = load_plan(ROOT / "dags" / "avsim_graphs.yaml", settings)
    doc = sample_manifest(4)
    for case in doc["cases"]:
        case.pop("phases", None)
    path = tmp_path / "week.json"
    path.write_text(json.dumps(doc))
    prepared = prepare_week(
        source=str(path), plan=plan, settings=settings, dag_id="avsim_weekly", run_id="w1"
    )
    shard = prepared["shards"][0]
    loaded = tasks.load_shard(shard["conf"], plan)
    family = next(k for k, v in loaded.items() if k.startswith("cases_") and v)
    layout = RunLayout(settings.resolved_artifact_root, prepared["run"]["run_key"])
    return prepared["run"], loaded[family][0], Ledger(layout)


def phase_task(week: Week, phase: str, role: Role, gpus: int) -> Phase:
    run, case, _ = week
    task = Phase(run, case, phase, role, gpus)
    task.set_retries()
    return task


def wrote_result(attempt: PhaseAttempt) -> None:
    """The ``result.json`` the phase contract asks every phase that reports a result to write."""
    out = Path(attempt.output_uri.removeprefix("file://"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps({"outcome": "passed", "metrics": {}}))
