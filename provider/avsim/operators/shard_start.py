"""``shard_start``: admits one shard run of the weekly run and creates it; ``shards`` waits for it.

Also what both shard tasks share: creating a shard run, and the build's circuit breaker's say.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.trigger_dagrun import XCOM_RUN_ID, TriggerDagRunOperator

from avsim.contracts import RunDescriptor
from avsim.operators.admission import AdmissionGate, admission_failed

if TYPE_CHECKING:
    from airflow.sdk import Context

    from avsim.triggers.admission import RunToStart

#: The longest a shard task waits, deferred, for room or for its shard run.
SHARD_WAIT_TIMEOUT = dt.timedelta(days=8)

#: The mapped task that admits and starts the shard runs (``shards`` waits for each).
SHARD_START_TASK = "shard_start"
#: ``shard_start`` task instances at once: when many cases end together, every shard that fits starts
#: in the same count, and a target holds about three shard runs (``SHARD_SHARE``), plus the one that
#: refills it. Waiting, they are deferred: no worker slot.
SHARD_STARTS_AT_ONCE = 4


def shard_logical_date(context: Context, shard: int) -> dt.datetime | None:
    """Shard run k's logical date: the parent's plus k microseconds. The scheduler orders equal priority
    weights by logical date, so earlier shards finish first instead of all active shards draining in
    lock-step (measured with the planner)."""
    parent = context["dag_run"]
    base = getattr(parent, "run_after", None) or getattr(parent, "logical_date", None)
    return None if base is None else base + dt.timedelta(microseconds=shard)


def _conf(op: TriggerDagRunOperator) -> dict[str, Any]:
    return json.loads(op.conf) if isinstance(op.conf, str) else dict(op.conf or {})


def start_shard_run(op: TriggerDagRunOperator, context: Context, shard: int, run_id: str) -> None:
    """Create shard run ``run_id`` through the execution API, as Airflow's task runner would for a
    TriggerDagRunOperator, so that the task's wait is the one it chooses; push its id for the link."""
    from avsim.airflow_internals import start_dag_run_from_task

    created = start_dag_run_from_task(
        op.trigger_dag_id,
        run_id,
        conf=_conf(op),
        logical_date=shard_logical_date(context, shard),
        note=op.note,
    )
    op.log.info("shard run %s %s", run_id, "created" if created else "already there (another try)")
    # The "Triggered DAG" link reads the shard run's id from this XCom.
    context["ti"].xcom_push(key=XCOM_RUN_ID, value=run_id)


def breaker_is_open(run: RunDescriptor) -> bool:
    from avsim.ledger.breaker import Breaker, image_digest

    return Breaker(run.artifact_root, image_digest(run.image)).state().is_open


def breaker_refusal(run: RunDescriptor, what: str) -> Exception:
    """Why a shard does nothing while its build's circuit breaker is open, and what to do."""
    from avsim.ledger.breaker import Breaker, image_digest
    from avsim.operators.exceptions import BreakerOpen

    digest = image_digest(run.image)
    state = Breaker(run.artifact_root, digest).state()
    return BreakerOpen(
        f"{what}: the circuit breaker of build {run.build_id} is open ({state.reason}). If the build is "
        f"good (a broken node pool), reset it with `avsim breaker reset {digest}` and clear this task; "
        "else start a run with a fixed build"
    )


class ShardStartOperator(TriggerDagRunOperator):
    """Admits one shard run and creates it, then ends; ``shards`` waits for the run.

    Mapped with a small ``max_active_tis_per_dagrun``: the next few starts are all that can fit, and
    a shard run that is still running holds none. A shard run that exists already (another try, a
    repair) is left to ``shards``; while the build's circuit breaker is open no shard run starts.
    Admission is its :class:`AdmissionGate`."""

    template_fields: Sequence[str] = (*TriggerDagRunOperator.template_fields, "shard", "run")
    ui_color = "#ecdcc9"

    def __init__(
        self,
        *,
        shard: Any,
        run: Any,
        case_ends: Sequence[Sequence[str]] = (),
        cpu_case_ends: Sequence[str] = (),
        admission_pools: Sequence[str] = (),
        window: int = 0,
        airflow_api_conn_id: str = "avsim_airflow_api",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("logical_date", None)
        kwargs.setdefault("openlineage_inject_parent_info", False)
        super().__init__(**kwargs)
        self.shard = shard
        self.run = run
        #: Where the admission trigger creates the shard run once admitted.
        self.airflow_api_conn_id = airflow_api_conn_id
        self.admission = AdmissionGate.of(
            case_ends, admission_pools, window, self.task_id, self.poke_interval, cpu_case_ends
        )
        #: The map index label is shared with ``shards`` ("shard 3 · 2 need attention"); a start has none.
        self.attention_label = ""

    @property
    def descriptor(self) -> RunDescriptor:
        """The week this shard run belongs to (``run``, rendered from ``prepare``'s XCom)."""
        return RunDescriptor.model_validate(self.run)

    def execute(self, context: Context) -> Any:
        shard = int(self.shard)
        if shard == 0 and not self.descriptor.canary_count:
            return None
        run_id = str(self.trigger_run_id)
        ti = context["ti"]
        if ti.get_dr_count(dag_id=self.trigger_dag_id, run_ids=[run_id]):
            self.log.info("shard run %s exists: shards waits for it", run_id)
            ti.xcom_push(key=XCOM_RUN_ID, value=run_id)
            return run_id
        if breaker_is_open(self.descriptor):
            raise breaker_refusal(self.descriptor, f"shard {shard} not started")
        week = self.admission.week_of(
            self.descriptor,
            dag_id=ti.dag_id,
            run_id=context["dag_run"].run_id,
            shard_dag_id=self.trigger_dag_id,
        )
        trigger = self.admission.wait_trigger(
            self.descriptor, shard, week, self._run_to_start(context, run_id)
        )
        if trigger is not None:
            self.defer(trigger=trigger, method_name="execute_admitted", timeout=SHARD_WAIT_TIMEOUT)
        start_shard_run(self, context, shard, run_id)
        return run_id

    def _run_to_start(self, context: Context, run_id: str) -> RunToStart:
        """What the admission trigger needs to create this shard run itself once admitted."""
        from avsim.triggers.admission import RunToStart

        logical_date = shard_logical_date(context, int(self.shard))
        run = self.descriptor
        return RunToStart(
            dag_id=self.trigger_dag_id,
            run_id=run_id,
            conf=_conf(self),
            logical_date=None if logical_date is None else logical_date.isoformat(),
            note=self.note,
            api_conn_id=self.airflow_api_conn_id,
            artifact_root=run.artifact_root,
            image=run.image,
        )

    def execute_admitted(self, context: Context, event: dict[str, Any]) -> Any:
        """Back from the admission trigger: decide again from the start (the breaker may have opened,
        the pools changed; another try may have started the shard run), and start or defer again."""
        failed = admission_failed(self.shard, event)
        if failed is not None:
            raise failed
        self.log.info("admission: %s (%s)", event.get("status"), event.get("reason"))
        return self.execute(context)
