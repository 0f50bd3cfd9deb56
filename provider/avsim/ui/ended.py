"""What the weekly-run page says about a week that has ended; :mod:`avsim.ui.week` calls it.

Pure functions over the page's documents. Cases that never started in an ended run were stopped (by the
canary gate, the open breaker, or whatever ended the run): *not started*, never *waiting*. An ended run
makes no pace or finish claim, and a run-level phase the breaker refused did not run (never shown as
the bad build's ``bad_build`` victim). docs/design.md, "The avsim pages".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from avsim.phases.contract import NOT_RUN, Detail
from avsim.verdict import needs_attention

#: Airflow states of a weekly run that is over (until someone clears it).
ENDED_STATES = ("success", "failed")
#: Task-instance states of a phase being worked on.
_ACTIVE = ("running", "queued", "deferred", "up_for_retry", "up_for_reschedule", "restarting", "scheduled")


def run_ended(state: str | None) -> bool:
    return state in ENDED_STATES


def stop_reason(run_state: str | None, canary: Mapping[str, Any], breaker: Mapping[str, Any]) -> str:
    """Why cases of an ended week never started ("" while the week runs)."""
    if not run_ended(run_state):
        return ""
    if canary.get("available") and canary.get("state") == "failed":
        return "stopped by the canary gate"
    if breaker.get("available") and breaker.get("state") == "open":
        return "stopped by the open breaker of the build"
    return f"the run ended {run_state} before they started"


def ended_deadline(
    deadline: Mapping[str, Any], run_state: str | None, ended_at: str | None
) -> dict[str, Any]:
    """The deadline section of an ended run: the deadline, and no estimate, GPU need or action."""
    out = dict(deadline)
    for key in ("estimated_finish", "seconds_late", "gpus_needed", "action", "remaining_gpu_seconds"):
        out[key] = None
    out["verdict"] = {
        "state": "ended",
        "text": f"the run ended {run_state} at {ended_at or 'an unknown time'}: no finish estimate",
    }
    return out


def run_phase_view(
    phase: str,
    ti_states: Mapping[str, int],
    record: Any | None,
    stopped_because: str = "",
    not_started: int = 0,
) -> dict[str, Any]:
    """How the page shows one run-level phase.

    ``ti_states``: its task instances' states (``{"failed": 1}``); ``record``: its committed
    :class:`~avsim.ledger.records.OutcomeRecord`, if any. ``shown`` is the class the page colours it
    with; ``attention`` whether it needs an engineer (as :func:`avsim.verdict.needs_attention` says).
    """
    state = next(iter(ti_states), None) if len(ti_states) == 1 else _worst(ti_states)
    base = {"phase": phase, "task_state": state}
    if state in _ACTIVE:  # cleared or retried: an earlier round's record does not say how it ends
        return {**base, "outcome": None, "shown": "running", "attention": False, "text": "running"}
    if record is not None and record.detail == Detail.BREAKER_OPEN:
        return {
            **base,
            "outcome": record.outcome.value,
            "shown": NOT_RUN,
            "attention": False,
            "text": "did not run: the build's open breaker refused it. A run-level phase summarises the "
            "week and is no case of the build: clear it to summarise the week",
        }
    if record is not None:
        outcome = record.outcome.value
        text = str(record.reason or "")
        if stopped_because and not needs_attention(outcome):
            text = f"summarised the stopped week ({not_started:,} cases not started: {stopped_because})"
        return {
            **base,
            "outcome": outcome,
            "shown": outcome,
            "attention": needs_attention(outcome),
            "text": text,
        }
    if state in (None, "none"):
        return {
            **base,
            "outcome": None,
            "shown": "waiting",
            "attention": False,
            "text": "waits for every shard to end",
        }
    if state == "failed":
        return {
            **base,
            "outcome": None,
            "shown": "failed",
            "attention": True,
            "text": "failed, no outcome recorded",
        }
    return {**base, "outcome": None, "shown": NOT_RUN, "attention": False, "text": f"not run ({state})"}


def _worst(states: Mapping[str, int]) -> str | None:
    for s in ("failed", *_ACTIVE, "upstream_failed", "success", "skipped"):
        if states.get(s):
            return s
    return None
