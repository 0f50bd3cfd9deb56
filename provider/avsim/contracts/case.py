"""What the attempt path hands along for a case: its entry, and the cache entry of a phase's result.

===================  ==========================================  =====================================
contract             written by                                  read by
===================  ==========================================  =====================================
:class:`CaseEntry`   the week's plan (:func:`avsim.plan.shards.  every phase task of the case (the mapped
                     case_entry`: a shard's case lists, the      group's argument): its attempt, cache key
                     mapped groups' XCom)                        and spec (:mod:`avsim.attempt`)
:class:`CacheEntry`  a phase that commits a result               a later attempt with the same cache key
                     (:meth:`avsim.ledger.cache.PhaseCache.store`,  (:meth:`~avsim.ledger.cache.PhaseCache.
                     ``<artifact root>/cache/<key>.json``)       lookup`), which commits it instead of
                                                                 launching (the attempt service)
===================  ==========================================  =====================================

A case entry travels in XCom and a shard's case lists, and a cache entry outlives the run that wrote
it: both are read by later versions of avsim, so their field names are the dicts' they replace and an
entry written before the models parses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from avsim.contracts import _Contract
from avsim.phases.contract import Outcome


class CaseEntry(_Contract):
    """One case as its phase tasks receive it: small, JSON-friendly (``to_json`` leaves out ``phases``
    when the case runs its graph's, as the dict did)."""

    case_id: str = Field(min_length=1)
    #: The DAG's task-group family that runs it, and the manifest graph whose phases it runs.
    family: str = ""
    graph: str = ""
    seed: int = 0
    scenario_uri: str = ""
    scenario_version: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)
    tags: tuple[str, ...] = ()
    #: The case's own phase specs (as the snapshot holds a graph's), when it defines them.
    phases: dict[str, dict[str, Any]] | None = None
    #: Phases that launch whatever the cache holds (a triage rerun's failing phase and its downstream).
    fresh_phases: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data = self.model_dump(mode="json", exclude_none=True)
        if not self.fresh_phases:
            data.pop("fresh_phases", None)  # a week's case entry stays as it was
        return data

    def phase_spec(self, head: Mapping[str, Any], phase: str) -> dict[str, Any]:
        """The spec of ``phase`` for this case: its own phases if it defines them, else its graph's in the
        run's snapshot ``head``."""
        if self.phases:
            return dict(self.phases[phase])
        return dict(head["graphs"][self.graph or self.family]["phases"][phase])


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
