"""The ledger in the artifact store (through ObjectStoragePath), and shard summaries built from it.

Layout (see :mod:`avsim.artifacts`): one record per attempt at ``ledger/attempts/<case>/<phase>/<n>.json``,
the committed outcome of a (case, phase) at ``ledger/outcomes/<case>/<phase>.json``, a shard's summary
at ``ledger/shards/<k>/result.json``.

Commit rules (:meth:`Ledger.commit`): the first commit of a (case, phase) is written; the same attempt
again changes nothing (a duplicate report); a lower attempt than the committed one is ignored with a
warning (a late report from an abandoned attempt); a higher attempt replaces it (a rerun after an
engineer cleared the task). On ``file://`` a record is written to a temporary file and moved into
place, and a first commit is created only if absent (a hard link, which fails if the record exists).
On an object store a PUT is atomic by itself, but "create only if absent" is a check then a PUT:
two tries of one (case, phase) committing at the same instant can both think they were first.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import Any, TypeVar

from avsim.artifacts import RunLayout
from avsim.ledger.records import AttemptRecord, OutcomeRecord
from avsim.phases.contract import Outcome

log = logging.getLogger(__name__)

#: Parallel reads against an object store.
READ_THREADS = 16
#: A phase without a committed outcome: never started, or its upstream produced nothing.
NOT_RUN = "not_run"
UPSTREAM_FAILED = Outcome.UPSTREAM_FAILED.value
#: Phase outcomes after which downstream phases can run.
PRODUCED_OUTPUT = (Outcome.PASSED.value, Outcome.SCENARIO_FAILED.value)

T = TypeVar("T")
R = TypeVar("R")


class Ledger:
    """Attempts and committed outcomes of one run, in the artifact store under ``layout``."""

    def __init__(self, layout: RunLayout) -> None:
        self.layout = layout

    # -- storage --------------------------------------------------------------------------------
    @cached_property
    def _base(self) -> Any:
        from airflow.sdk import ObjectStoragePath

        return ObjectStoragePath(self.layout.base)

    @cached_property
    def is_local(self) -> bool:
        return str(self._base.protocol) in ("file", "local", "")

    def _path(self, uri: str) -> Any:
        """A path under the run's base, sharing its filesystem (and connection) with every other."""
        base = self.layout.base
        if uri.startswith(base + "/"):
            return self._base / uri[len(base) + 1 :]
        from airflow.sdk import ObjectStoragePath

        return ObjectStoragePath(uri)

    def _read(self, uri: str) -> Any | None:
        try:
            return json.loads(self._path(uri).read_text())
        except FileNotFoundError:
            return None

    def _write(self, uri: str, data: Any, *, create_only: bool = False) -> bool:
        """Write ``data`` as JSON. With ``create_only``, write only if absent (False when it existed)."""
        p = self._path(uri)
        text = json.dumps(data, sort_keys=True, default=str)
        if not self.is_local:
            if create_only and p.exists():
                return False
            p.write_text(text)
            return True
        os.makedirs(os.path.dirname(p.path), exist_ok=True)
        tmp = f"{os.path.dirname(p.path)}/.{p.name}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            if create_only:
                os.link(tmp, p.path)  # fails if the record exists: create-if-absent
            else:
                os.replace(tmp, p.path)
        except FileExistsError:
            return False
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return True

    def _map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        if self.is_local or len(items) < 2:
            return [fn(i) for i in items]
        with ThreadPoolExecutor(
            max_workers=min(READ_THREADS, len(items)), thread_name_prefix="avsim-ledger"
        ) as ex:
            return list(ex.map(fn, items))

    def _list(self, uri: str, pattern: str) -> list[Any]:
        d = self._path(uri)
        try:
            return list(d.glob(pattern))
        except FileNotFoundError:
            return []

    # -- attempts -------------------------------------------------------------------------------
    def record_attempt(self, rec: AttemptRecord) -> None:
        self._write(self.layout.attempt_record(rec.case_id, rec.phase, rec.attempt), rec.to_json())

    def attempts(self, case_id: str, phase: str) -> list[AttemptRecord]:
        """Every recorded attempt of a (case, phase), lowest attempt first."""
        folder = self.layout.attempt_record(case_id, phase, 0).rsplit("/", 1)[0]
        records = []
        for p in self._list(folder, "*.json"):
            try:
                records.append(AttemptRecord.from_json(json.loads(p.read_text())))
            except FileNotFoundError:
                continue
        return sorted(records, key=lambda r: r.attempt)

    # -- committed outcomes ---------------------------------------------------------------------
    def outcome(self, case_id: str, phase: str) -> OutcomeRecord | None:
        data = self._read(self.layout.outcome_record(case_id, phase))
        return OutcomeRecord.from_json(data) if data is not None else None

    def commit(self, rec: OutcomeRecord) -> bool:
        """Commit ``rec`` as the outcome of its (case, phase). True when the committed record changed."""
        uri = self.layout.outcome_record(rec.case_id, rec.phase)
        where = f"phase {rec.phase!r} of case {rec.case_id!r}"
        for _ in range(3):
            current = self.outcome(rec.case_id, rec.phase)
            if current is None:
                if self._write(uri, rec.to_json(), create_only=True):
                    log.info("%s: committed attempt %d as %s", where, rec.attempt, rec.outcome.value)
                    return True
                continue  # another writer got there first: apply the rules to its record
            if current.attempt == rec.attempt:
                log.info("%s: attempt %d is already committed; duplicate report ignored", where, rec.attempt)
                return False
            if current.attempt > rec.attempt:
                log.warning(
                    "%s: late report from abandoned attempt %d (%s) ignored; attempt %d is committed (%s)",
                    where,
                    rec.attempt,
                    rec.outcome.value,
                    current.attempt,
                    current.outcome.value,
                )
                return False
            self._write(uri, rec.to_json())
            log.info(
                "%s: attempt %d (%s) replaces committed attempt %d (%s)",
                where,
                rec.attempt,
                rec.outcome.value,
                current.attempt,
                current.outcome.value,
            )
            return True
        raise RuntimeError(f"{where}: could not commit attempt {rec.attempt} ({uri} keeps changing)")

    def outcomes_for(
        self, case_ids: Iterable[str], phases: Iterable[str]
    ) -> dict[tuple[str, str], OutcomeRecord]:
        """The committed outcomes of every (case, phase) pair that has one."""
        names = list(phases)
        keys = [(c, p) for c in case_ids for p in names]
        found = self._map(lambda k: self.outcome(*k), keys)
        return {k: rec for k, rec in zip(keys, found, strict=True) if rec is not None}

    # -- shard summaries ------------------------------------------------------------------------
    def write_shard_summary(self, shard: int, summary: dict[str, Any]) -> str:
        uri = self.layout.shard_summary(shard)
        self._write(uri, summary)
        return uri

    def shard_summaries(self) -> list[dict[str, Any]]:
        """Every shard's summary, by shard index."""
        paths = self._list(f"{self.layout.ledger}/shards", "*/result.json")
        docs = self._map(lambda p: _read_path(p), paths)
        found = [d for d in docs if isinstance(d, dict)]
        return sorted(found, key=lambda d: int(d.get("shard", 0)))

    def phase_states(
        self, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[OutcomeRecord | None, list[AttemptRecord]]]:
        """Committed outcome and attempts of each (case, phase), read in parallel on object stores."""
        found = self._map(lambda k: (self.outcome(*k), self.attempts(*k)), keys)
        return dict(zip(keys, found, strict=True))


def _read_path(p: Any) -> Any:
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        return None


def case_outcome(phase_outcomes: Iterable[str]) -> str:
    """The case-level outcome from its phases' outcomes."""
    seen = set(phase_outcomes)
    if Outcome.BAD_INPUT.value in seen:
        return Outcome.BAD_INPUT.value
    if seen - {Outcome.PASSED.value, Outcome.SCENARIO_FAILED.value}:
        return Outcome.INFRA_FAILED.value  # infra_failed, not run or upstream failed
    if Outcome.SCENARIO_FAILED.value in seen:
        return Outcome.SCENARIO_FAILED.value
    return Outcome.PASSED.value


def summarize_shard(ledger: Ledger, shard: int, cases: list[dict[str, Any]]) -> dict[str, Any]:
    """A shard's summary from the committed outcomes of its cases' phases.

    ``cases``: ``{"case_id", "graph", "phases": [phase, ...] in topological order}``, optionally
    ``"depends_on": {phase: [upstream, ...]}``; without it every earlier phase counts as upstream.
    A phase without a committed outcome is ``upstream_failed`` when an upstream of it produced no
    output, else ``not_run``.
    """
    keys = [(str(c["case_id"]), str(p)) for c in cases for p in c["phases"]]
    states = ledger.phase_states(keys)
    out = []
    for case in cases:
        cid = str(case["case_id"])
        order = [str(p) for p in case["phases"]]
        deps = case.get("depends_on")
        phases: dict[str, dict[str, Any]] = {}
        for i, phase in enumerate(order):
            committed, attempts = states[(cid, phase)]
            if committed is not None:
                ran = next((a for a in attempts if a.attempt == committed.attempt), None)
                entry = {
                    "outcome": committed.outcome.value,
                    "attempt": committed.attempt,
                    "output_uri": committed.output_uri,
                    "reason": committed.reason,
                    "duration_seconds": ran.duration_seconds if ran else None,
                }
            else:
                ups = deps.get(phase, []) if isinstance(deps, dict) else order[:i]
                blocked = any(phases.get(u, {}).get("outcome") not in PRODUCED_OUTPUT for u in ups)
                last = attempts[-1] if attempts else None
                entry = {
                    "outcome": UPSTREAM_FAILED if blocked else NOT_RUN,
                    "attempt": last.attempt if last else None,
                    "output_uri": "",
                    "reason": last.reason if last else "",
                    "duration_seconds": last.duration_seconds if last else None,
                }
            entry["attempts"] = len(attempts)
            phases[phase] = entry
        out.append(
            {
                "case_id": cid,
                "graph": case.get("graph", ""),
                "outcome": case_outcome(e["outcome"] for e in phases.values()),
                "phases": phases,
            }
        )
    return {"shard": shard, "cases": out}
