"""The pod trigger's event as a contract (avsim.contracts.pod.PodEvent): what the trigger fires, what
the resumed phase and the committing trigger read. Events Airflow kept from before the model (dicts
in a deferred task instance's next_kwargs) still parse; a misspelt class or detail is refused where
it is read instead of falling back to the outcome's generic kind."""

from __future__ import annotations

import pydantic
import pytest

from avsim.contracts.pod import PodEvent, PodStatus
from avsim.phases.contract import AttemptResult, Detail, Outcome
from avsim.triggers.phase_pod import PhasePodTrigger

#: The shapes the trigger fired as plain dicts before the model: an end, a timeout, an error.
OLD_ENDED = {
    "status": "ended",
    "pod": "p",
    "namespace": "avsim",
    "attempt": 2,
    "started_at": "2026-12-01T10:00:00+00:00",
    "outcome": "preempted",
    "exit_code": 143,
    "reason": "evicted",
    "detail": "evicted",
}
OLD_TIMEOUT = {
    "status": "ended",
    "pod": "p",
    "namespace": "avsim",
    "attempt": 1,
    "started_at": "",
    "outcome": "infra_failed",
    "detail": "timeout",
    "reason": "the pod did not end",
}
OLD_ERROR = {
    "status": "error",
    "pod": "p",
    "namespace": "avsim",
    "attempt": 1,
    "started_at": "",
    "message": "boom",
}


def test_events_fired_before_the_model_parse_into_the_same_result() -> None:
    ended = PodEvent.model_validate(OLD_ENDED)
    assert ended.result() == AttemptResult(Outcome.PREEMPTED, 143, "evicted", Detail.EVICTED, "p")
    timeout = PodEvent.model_validate(OLD_TIMEOUT).result()
    assert timeout is not None and (timeout.outcome, timeout.detail, timeout.exit_code) == (
        Outcome.INFRA_FAILED,
        Detail.TIMEOUT,
        None,
    )
    error = PodEvent.model_validate(OLD_ERROR)
    assert error.status is PodStatus.ERROR and error.result() is None and error.message == "boom"


def test_the_payload_keeps_the_old_keys_and_values() -> None:
    """A newer event read by the dict readers of an older avsim (a deploy mid-week) finds what they read."""
    payload = PodEvent.model_validate(OLD_ENDED).to_json()
    assert {k: payload[k] for k in OLD_ENDED} == OLD_ENDED


@pytest.mark.parametrize("field", ["outcome", "detail", "status"])
def test_a_misspelt_class_is_refused(field: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=field):
        PodEvent.model_validate({**OLD_ENDED, field: "lease_expird"})


def test_the_trigger_fires_a_pod_event() -> None:
    trigger = PhasePodTrigger(pod_name="p", namespace="avsim", attempt=3, node_class="cpu", started_at="")
    event = trigger._ended(AttemptResult(Outcome.INFRA_FAILED, 137, "OOMKilled", Detail.OOM))
    assert isinstance(event, PodEvent) and event.attempt == 3
    assert PodEvent.model_validate(event.to_json()) == event
    assert event.to_json()["detail"] == "oom" and event.to_json()["outcome"] == "infra_failed"
