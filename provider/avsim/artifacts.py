"""Run ids and where a run's artifacts live in the artifact store.

Shard, canary and triage run ids (:func:`shard_run_id`, :func:`canary_run_id`, :func:`triage_run_id`,
and back: :func:`parent_run`), the run key (:func:`run_key_for`) and every URI under the artifact root.
It imports nothing from avsim and never touches storage, so every layer names runs and finds their
files the same way. The layout: docs/design.md, "Run ids and the artifact layout".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SAFE = re.compile(r"[^A-Za-z0-9._-]")

#: The shard runs of DAG ``D`` run in DAG ``D`` + this.
SHARD_DAG_SUFFIX = "_shard"
#: Shard run k of run ``R`` is ``R`` + this + k in four digits.
SHARD_RUN_MARKER = "__shard_"
#: The canary's shard run of run ``R`` is ``R`` + this (the priority strategy ranks it first).
CANARY_RUN_SUFFIX = "__canary"
#: A triage shard run of run ``R`` is ``R`` + this + ``<round>_<build side>_<n>``; its artifacts are under
#: the week's run key + the same (:func:`triage_run_key`): reruns never write into the week's scope.
TRIAGE_RUN_MARKER = "__triage_"


def safe_key(value: str) -> str:
    """Make an Airflow run id or other free text safe as one object-key segment."""
    return _SAFE.sub("_", value)[:200]


# ------------------------------------------------------------------------------------ run ids


def run_key_for(dag_id: str, run_id: str) -> str:
    """The run key of a weekly or ad-hoc run: its artifacts are under ``runs/<run key>/``."""
    return safe_key(f"{dag_id}__{run_id}")


def shard_dag_id(dag_id: str) -> str:
    """The DAG the shard runs of ``dag_id``'s runs run in."""
    return f"{dag_id}{SHARD_DAG_SUFFIX}"


def shard_run_id(parent_run_id: str, shard: int) -> str:
    return f"{parent_run_id}{SHARD_RUN_MARKER}{shard:04d}"


def canary_run_id(parent_run_id: str) -> str:
    """The canary's shard run."""
    return f"{parent_run_id}{CANARY_RUN_SUFFIX}"


def triage_run_id(parent_run_id: str, label: str) -> str:
    """A triage shard run of the week (``label``: round, build side and rerun number)."""
    return f"{parent_run_id}{TRIAGE_RUN_MARKER}{label}"


def triage_run_key(week_run_key: str, label: str) -> str:
    """Where a triage shard run's reruns write: a run key of their own beside the week's."""
    return safe_key(f"{week_run_key}{TRIAGE_RUN_MARKER}{label}")


_TRIAGE_RUN_END = re.compile(re.escape(TRIAGE_RUN_MARKER) + r"\d+_[a-z]+_\d+$")


def is_triage_run(run_id: str | None) -> bool:
    """Whether a shard run is a triage run (its id ends in ``__triage_<round>_<build>_<n>``; a weekly
    run's own id may hold the marker anywhere)."""
    return bool(run_id) and _TRIAGE_RUN_END.search(str(run_id)) is not None


def week_run_ids(parent_run_id: str, shard_count: int, *, canary: bool) -> list[str]:
    """Every shard run of a week, in the order they start: the canary's (when it has one), then
    shards 1..``shard_count``."""
    first = [canary_run_id(parent_run_id)] if canary else []
    return first + [shard_run_id(parent_run_id, k) for k in range(1, shard_count + 1)]


def is_canary_run(run_id: str | None) -> bool:
    return bool(run_id) and str(run_id).endswith(CANARY_RUN_SUFFIX)


def parent_run(dag_id: str, run_id: str) -> tuple[str, str]:
    """The (DAG id, run id) of the run a shard run belongs to; any other run is its own."""
    if dag_id.endswith(SHARD_DAG_SUFFIX):
        for marker in (SHARD_RUN_MARKER, CANARY_RUN_SUFFIX, TRIAGE_RUN_MARKER):
            if marker in run_id:
                return dag_id.removesuffix(SHARD_DAG_SUFFIX), run_id[: run_id.rindex(marker)]
    return dag_id, run_id


# ------------------------------------------------------------------------------------ layout


@dataclass(frozen=True)
class RunLayout:
    root: str
    run_key: str

    @property
    def base(self) -> str:
        return f"{self.root.rstrip('/')}/runs/{safe_key(self.run_key)}"

    # manifest snapshot
    @property
    def manifest_dir(self) -> str:
        return f"{self.base}/manifest"

    @property
    def manifest_uri(self) -> str:
        return f"{self.manifest_dir}/manifest.json"

    @property
    def head_uri(self) -> str:
        return f"{self.manifest_dir}/head.json"

    @property
    def digest_uri(self) -> str:
        return f"{self.manifest_dir}/sha256"

    # phase outputs
    def attempt_output(self, case_id: str, phase: str, attempt: int) -> str:
        return f"{self.base}/cases/{case_id}/{phase}/attempt-{attempt}"

    def checkpoint(self, case_id: str, phase: str) -> str:
        return f"{self.base}/checkpoints/{case_id}/{phase}"

    # ledger
    @property
    def ledger(self) -> str:
        return f"{self.base}/ledger"

    def attempt_record(self, case_id: str, phase: str, attempt: int) -> str:
        return f"{self.ledger}/attempts/{case_id}/{phase}/{attempt}.json"

    def outcome_record(self, case_id: str, phase: str) -> str:
        return f"{self.ledger}/outcomes/{case_id}/{phase}.json"

    def shard_dir(self, shard: int) -> str:
        """A shard's summary is a phase output of its own: run-level phases take these as inputs."""
        return f"{self.ledger}/shards/{shard:05d}"

    def shard_summary(self, shard: int) -> str:
        return f"{self.shard_dir(shard)}/result.json"

    def shard_cases(self, shard: int) -> str:
        """The cases of one shard, written by the parent run, read by the shard run."""
        return f"{self.manifest_dir}/shards/{shard:05d}.json"

    @property
    def plan_uri(self) -> str:
        """What the run plans: case and phase counts, planned GPU/CPU seconds, deadline (written by prepare)."""
        return f"{self.manifest_dir}/plan.json"

    # report
    @property
    def report_dir(self) -> str:
        return f"{self.base}/report"

    # canary and deadline
    @property
    def canary_gate(self) -> str:
        return f"{self.base}/canary/gate.json"

    @property
    def deadline_dir(self) -> str:
        return f"{self.base}/deadline"

    @property
    def deadline_latest(self) -> str:
        return f"{self.deadline_dir}/latest.json"

    def deadline_history(self, stamp: str) -> str:
        return f"{self.deadline_dir}/history/{safe_key(stamp)}.json"


def breaker_uri(root: str, digest: str) -> str:
    """The circuit breaker of one simulator build, shared by every run of that build."""
    return f"{root.rstrip('/')}/breakers/{safe_key(digest)}.json"


def cache_uri(root: str, key: str) -> str:
    """A committed phase output that a rerun with the same cache key reuses."""
    return f"{root.rstrip('/')}/cache/{safe_key(key)}.json"


def week_index_uri(root: str, iso_week: str) -> str:
    """Which run is the weekly run of ``iso_week`` (written by the weekly run's prepare)."""
    return f"{root.rstrip('/')}/weeks/{safe_key(iso_week)}.json"


#: The case id used for run-level phases (the weekly summary).
RUN_LEVEL_CASE = "_run"
