"""The canary gate: the sensor that releases the rest of the week only if the canary looks healthy.

It runs in the weekly run beside the canary shard run and waits, deferred, on
:class:`avsim.triggers.canary.CanaryGateTrigger`. It succeeds when the canary finished with its
crash and bad-build rate at most the manifest's ``run.canary.max_failure_rate``; the week's shard
runs start after it. It fails (no retry) as soon as the rate passes the threshold, with a message
that names the build and the failure counts; its trigger has already opened the build's circuit
breaker when it decided, so the canary's own retries fail fast as ``bad_build`` and the rest of the
week never starts. A week without a
canary stage (too small) passes at once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator

from avsim.contracts import RunDescriptor
from avsim.operators.exceptions import CanaryGateFailed


class CanaryGateSensor(BaseSensorOperator):
    """:param run: the run descriptor (XComArg of ``prepare``); :param canary: the canary descriptor
    (``{"cases": {case: [phases]}, "threshold": ..., "shard": ...}``, or empty for no canary)."""

    template_fields: Sequence[str] = ("run", "canary")
    ui_color = "#f3ecd8"

    def __init__(self, *, run: Any, canary: Any, poll_interval: float = 30.0, **kwargs: Any) -> None:
        kwargs.setdefault("mode", "reschedule")
        super().__init__(**kwargs)
        self.run = run
        self.canary = canary
        self.poll_interval = poll_interval

    def execute(self, context: Any) -> Any:
        canary = dict(self.canary or {})
        if not canary.get("cases"):
            self.log.info("this week has no canary stage (too few cases): the gate is open")
            return {"state": "passed", "cases": 0, "message": "no canary stage"}
        from avsim.triggers.canary import CanaryGateTrigger

        run = RunDescriptor.model_validate(self.run)
        self.defer(
            trigger=CanaryGateTrigger(
                artifact_root=run.artifact_root,
                run_key=run.run_key,
                canary_cases=canary["cases"],
                threshold=float(canary["threshold"]),
                build=run.build_id,
                shard=int(canary.get("shard", 0)),
                poll_interval=self.poll_interval,
                image=run.image,
            ),
            method_name="execute_complete",
            # Every deferral ends: a canary that never finishes fails the gate after the sensor's timeout.
            timeout=dt.timedelta(seconds=float(self.timeout)),
        )

    def poke(self, context: Any) -> bool:  # pragma: no cover - the gate always defers
        raise NotImplementedError("the canary gate waits in the triggerer")

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        from avsim import metrics

        status = event.get("status")
        if status == "error":
            # The trigger could not read the ledger: a retry of this task looks again.
            from airflow.sdk.exceptions import AirflowException

            raise AirflowException(f"canary gate could not decide: {event.get('message')}")
        passed = status == "passed"
        metrics.canary_decision(RunDescriptor.model_validate(self.run).build_id, passed)
        self.log.info("%s", event.get("message"))
        if not passed:
            raise CanaryGateFailed(str(event.get("message")))
        return event
