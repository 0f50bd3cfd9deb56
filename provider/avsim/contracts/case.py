"""What the attempt path keeps about a case's phases beyond one run: the cache entry.

===================  ==========================================  =====================================
contract             written by                                  read by
===================  ==========================================  =====================================
:class:`CacheEntry`  a phase that commits a result               a later attempt with the same cache key
                     (:meth:`avsim.ledger.cache.PhaseCache.store`,  (:meth:`~avsim.ledger.cache.PhaseCache.
                     ``<artifact root>/cache/<key>.json``)       lookup`), which commits it instead of
                                                                 launching (the attempt service)
===================  ==========================================  =====================================

A cache entry outlives the run that wrote it and is read by runs of later versions of avsim: its field
names are the dict's it replaces, so an entry written before the model parses.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from avsim.contracts import _Contract
from avsim.phases.contract import Outcome


class CacheEntry(_Contract):
    """A committed result, under the cache key of what it ran and read (:func:`avsim.ledger.cache.cache_key`)."""

    key: str = Field(min_length=1)
    #: The result's class: a result (passed, scenario_failed), never a failure.
    outcome: Outcome
    output_uri: str = Field(min_length=1)
    #: The result's small part (its metrics), as the commit kept it.
    result: dict[str, Any] = Field(default_factory=dict)
    #: Where it was committed: run, case, phase and attempt.
    run_key: str
    case_id: str
    phase: str
    attempt: int = Field(ge=1)
    committed_at: str = ""

    @property
    def origin(self) -> str:
        """The commit it reuses, as a reused outcome names it (``run:case/phase#attempt``)."""
        return f"{self.run_key}:{self.case_id}/{self.phase}#{self.attempt}"
