"""What avsim's tasks hand each other, and what the pages read from them: one frozen model each.

===================  ==========================================  =====================================
contract             written by                                  read by
===================  ==========================================  =====================================
:class:`RunDescriptor`  the weekly run's ``prepare`` (XCom ``run``)  shard runs (conf), phase operators
                                                                 (a shard's phases render it from the
                                                                 shard run's conf), the canary gate, the
                                                                 deadline tracker, the week's end, the pages
:class:`AdmissionPlan`  ``prepare``, inside the run descriptor      the ``shards`` tasks (admission)
:class:`ShardConf`   the parent's ``canary`` / ``shards`` tasks      the shard run's ``load_shard`` and
                     (the shard run's conf)                      ``summarize``
:class:`PhaseResult`  every phase task: its return value when    downstream phases (their inputs), the
                     it committed a result, and XCom             progress page (a phase's class)
                     ``avsim_outcome`` for every attempt it ended
:class:`PassCommit`  a deferring Kubernetes phase (its          its trigger, when the attempt's pod
                     trigger's ``commit`` argument)             passed (:mod:`avsim.triggers.pass_commit`)
===================  ==========================================  =====================================

The other contracts live beside their subject:

* :mod:`avsim.contracts.case`: ``CaseEntry`` (a case as the shard plan lists it: ``plan.shards``
  writes it, the phase's attempt, cache key and service read it) and ``CacheEntry`` (a committed
  output the phase cache keeps for a later run with the same pins);
* :mod:`avsim.contracts.pod`: ``PodEvent`` (what the pod trigger yields; the Kubernetes operator and
  the committing trigger read it);
* :mod:`avsim.contracts.week`: ``CanaryPlan`` (``prepare``'s canary stage: the gate and its trigger
  read it) and ``ShardSummary`` (each shard's ``summarize`` writes it; the shard operator, the
  verdict, the report, ``rerun-failed`` and the canary gate read it).

XCom and DAG-run conf carry them as JSON (``to_json``); readers parse them back with
``model_validate``, so a missing or misspelt field fails where it is read, naming the field.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from avsim.artifacts import RunLayout
from avsim.manifest.models import RunClass
from avsim.phases.contract import Outcome

#: The weekly (and ad-hoc) run's first task, and the XCom key of the run descriptor it pushes.
PREPARE_TASK_ID = "prepare"
RUN_XCOM_KEY = "run"
#: XCom key of the outcome of a phase task's last ended attempt (a :class:`PhaseResult`).
OUTCOME_XCOM_KEY = "avsim_outcome"


class _Contract(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def to_json(self) -> dict[str, Any]:
        """The JSON-friendly form XCom and DAG-run conf carry."""
        return self.model_dump(mode="json")


class AdmissionPlan(_Contract):
    """How a week admits its shard runs by cases in flight (:mod:`avsim.plan.admission`): ``prepare``
    writes it into the run descriptor, each ``shards`` task reads it before starting its shard run."""

    #: ``[avsim] cases_in_flight`` when above 0: the target whatever the pools.
    configured: int = Field(default=0, ge=0)
    #: The target when the week was prepared (the pools' slots then; docs/design.md).
    target: int = Field(ge=1)
    #: The pools' slots it was derived from (``None``: they could not be read, the target is the
    #: configured one or the window's W x S).
    spot_gpus: int | None = None
    cpus: int | None = None
    #: The mean case as :class:`avsim.plan.inflight.CaseLoad` has it (its fields): a ``shards`` task
    #: derives the target again from the pools' slots at that moment (the deadline tracker may raise them).
    load: dict[str, float] = Field(default_factory=dict)
    #: The fewest cases it keeps in flight whatever the pools: those the scheduler carries comfortably
    #: (:func:`avsim.plan.inflight.comfortable_cases`); a week no larger is not throttled.
    floor: int = Field(default=0, ge=0)


class RunDescriptor(_Contract):
    """One weekly or ad-hoc run, as ``prepare`` describes it to every later task."""

    run_key: str = Field(min_length=1)
    artifact_root: str = Field(min_length=1)
    dag_id: str = ""
    run_id: str = ""
    manifest_source: str = ""
    manifest_sha256: str = ""
    build_id: str = ""
    #: The pinned simulator image (``repo@sha256:...``).
    image: str = ""
    #: ``weekly`` or ``adhoc``: the DAG's class decides priority weights and PriorityClass.
    run_class: RunClass = RunClass.WEEKLY
    iso_week: str = ""
    case_count: int = Field(default=0, ge=0)
    shard_count: int = Field(default=0, ge=0)
    canary_count: int = Field(default=0, ge=0)
    #: The run key this run reruns (``avsim rerun-failed``), if it is a rerun.
    rerun_of: str | None = None
    #: Cases per shard run (shards 1..n; the last may hold fewer); 0 in a descriptor from before it.
    shard_size: int = Field(default=0, ge=0)
    #: Admission by cases in flight; None: the window of whole shard runs (``[avsim] admission``).
    admission: AdmissionPlan | None = None
    #: The run key of the week whose newly failing cases this triage shard run reruns (:mod:`avsim.triage`):
    #: its results are stored in no cache and its failures are no evidence for any build's breaker.
    triage_of: str | None = None

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.artifact_root, self.run_key)


#: A shard DAG's phases take the run descriptor from their shard run's conf (``load_shard`` checks it
#: before any phase starts), rendered as JSON in the task process: no XCom read per phase.
RUN_FROM_SHARD_CONF = "{{ (dag_run.conf or {}).get('run') | tojson }}"


def run_document(value: Any) -> dict[str, Any] | None:
    """A phase operator's ``run`` as a mapping: given as one, or rendered as JSON (:data:`RUN_FROM_SHARD_CONF`).
    None when it is neither (not rendered yet, or the conf has no run)."""
    if isinstance(value, str) and value.startswith("{"):
        import json

        try:
            value = json.loads(value)
        except ValueError:
            return None
    return dict(value) if isinstance(value, dict) else None


class ShardConf(_Contract):
    """A shard run's conf: the run it belongs to and its shard index (0 is the canary's)."""

    run: RunDescriptor
    shard: int = Field(ge=0, strict=True)


class PhaseResult(_Contract):
    """How a phase task's attempt ended, for its downstream phases and the pages."""

    case_id: str
    phase: str
    outcome: Outcome
    attempt: int = Field(ge=0)
    #: The committed output downstream phases read ("" when the attempt produced none).
    output_uri: str = ""
    cache_key: str = ""
    #: The output is an earlier run's, reused through the cache (nothing was launched).
    reused: bool = False
    #: What the platform did, in a word (see :class:`avsim.phases.contract.AttemptResult`).
    detail: str = ""
    #: Why the attempt failed, in short (the ledger keeps the full reason).
    reason: str = Field(default="", max_length=300)


class PassCommit(_Contract):
    """What a deferred phase hands its trigger so that the trigger can end an attempt whose pod passed
    without a worker (:mod:`avsim.triggers.pass_commit`): commit the output in the ledger as the
    resumed phase would, and end the task instance with the phase's result as its return value.
    Any other end (a failure, a preemption, a commit that could not be made) resumes the phase in a
    worker as before."""

    run: RunDescriptor
    case: dict[str, Any]
    phase: str = Field(min_length=1)
    task_id: str = Field(min_length=1)
    role: str
    gpus: int = Field(ge=0)
    node_class: str
    attempt: int = Field(ge=1)
    output_uri: str = Field(min_length=1)
    cache_key: str = ""
    #: The task instance's try that launched the attempt, and the first try of its round.
    try_number: int = Field(ge=1)
    round_start: int = Field(ge=1)
    started_at: str = Field(min_length=1)
