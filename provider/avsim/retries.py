"""How Airflow retries avsim's tasks: a phase's retry arguments, and the control tasks' one rule.

Control tasks (prepare, load_shard, cases_*, summarize, shards, canary, the gates, the week's end) only
read and write the week's books through the execution API, the REST API and the artifact store, so
what fails them is a passing outage of one of those. They retry soon and often enough to ride out
a few minutes of it (docs/operations.md, the fault matrix); a verdict they reach (a rejected
manifest, a shard that needs attention) fails them without a retry.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

#: A control task's retries, the first delay and its cap: 10, 20, 40, 60, 60, 60 s, about four
#: minutes of an outage, besides the time each failed try took to fail.
CONTROL_RETRIES = 6
CONTROL_RETRY_DELAY_SECONDS = 10.0
CONTROL_MAX_RETRY_DELAY_SECONDS = 60.0


def retry_kwargs(retries: int, delay: float, backoff: float, max_delay: float) -> dict[str, Any]:
    """Airflow's retry arguments of a task: ``retries`` tries more, ``delay`` first, times ``backoff``
    (none when at most 1), at most ``max_delay``."""
    return {
        "retries": retries,
        "retry_delay": dt.timedelta(seconds=delay),
        "retry_exponential_backoff": backoff if backoff > 1 else 0,
        "max_retry_delay": dt.timedelta(seconds=max_delay),
    }


def control_retries() -> dict[str, Any]:
    """The retry arguments of every control task (see the module's docstring)."""
    return retry_kwargs(CONTROL_RETRIES, CONTROL_RETRY_DELAY_SECONDS, 2.0, CONTROL_MAX_RETRY_DELAY_SECONDS)
