"""The weekly run's ``triage`` task: wait for the week's triage shard runs, then write the verdicts.

``triage_start`` decided and started the runs (:mod:`avsim.triage.start`); this task defers on
:class:`~avsim.triggers.triage.TriageRunsTrigger` until they end or the week's deadline nears, stops
any still going then, and writes ``report/triage.json`` (:mod:`avsim.triage.collect`) before ``report``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from avsim.contracts import RunDescriptor

if TYPE_CHECKING:
    from airflow.sdk import Context

    from avsim.triage.runs import TriageBook

#: How long before the week's deadline triage gives up its reruns, so the report still comes in time.
REPORT_MARGIN = dt.timedelta(minutes=2)


class TriageOperator(BaseOperator):
    """Waits for the week's triage runs (deferred, bounded by the deadline) and writes the verdicts."""

    template_fields: Sequence[str] = ("run", "run_ids")
    ui_color = "#e6dcf0"

    def __init__(
        self,
        *,
        run: Any,
        shard_dag_id: str,
        run_ids: Any = None,
        airflow_api_conn_id: str = "avsim_airflow_api",
        poll_interval: float = 5.0,
        reruns: int = 2,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.run = run
        #: The triage runs ``triage_start`` found or started (None: every run of the book).
        self.run_ids = run_ids
        self.shard_dag_id = shard_dag_id
        self.airflow_api_conn_id = airflow_api_conn_id
        self.poll_interval = float(poll_interval)
        self.reruns = int(reruns)

    @property
    def week(self) -> RunDescriptor:
        return RunDescriptor.model_validate(self.run)

    def _book(self) -> TriageBook:
        from avsim.triage.runs import TriageBook
        from avsim.triage.start import read_book

        week = self.week
        return read_book(week.layout) or TriageBook(week_run_key=week.run_key, message="triage did not start")

    def until(self) -> str | None:
        """When the wait gives up: :data:`REPORT_MARGIN` before the week's deadline (None: it has none)."""
        from avsim.storage import read_json
        from avsim.triage.start import run_deadline

        deadline = run_deadline(read_json(self.week.layout.head_uri))
        return None if deadline is None else (deadline - REPORT_MARGIN).isoformat()

    def execute(self, context: Context) -> Any:
        from avsim.triggers.triage import TriageRunsTrigger

        book = self._book()
        started = set((r.run_id for r in book.runs) if self.run_ids is None else self.run_ids)
        waited = [r.run_id for r in book.runs if r.run_id in started]
        if not waited:
            return self.finish(book, "its triage run could not be started")
        self.defer(
            trigger=TriageRunsTrigger(
                dag_id=self.shard_dag_id,
                states=["success", "failed"],
                run_ids=waited,
                poll_interval=self.poll_interval,
                until=self.until(),
            ),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Context, event: tuple[str, dict[str, Any]]) -> Any:
        from avsim.triggers.triage import DEADLINE_EVENT

        kind, _ = event
        book = self._book()
        why = ""
        if kind == DEADLINE_EVENT:
            why = "the week's deadline came before its triage run ended"
            self._stop(book)
        return self.finish(book, why)

    def _stop(self, book: TriageBook) -> None:
        """Stop the triage runs still going: nothing of triage outlives its week's report."""
        from avsim.hooks.airflow_api import AirflowApiError, AirflowApiHook

        hook = AirflowApiHook(self.airflow_api_conn_id)
        for run in book.runs:
            try:
                state = hook.stop_dag_run(
                    self.shard_dag_id, run.run_id, note="stopped at the deadline by triage"
                )
            except AirflowApiError as exc:
                self.log.error("could not stop triage run %s (%s): stop it by hand", run.run_id, exc)
            else:
                self.log.info("triage run %s: %s", run.run_id, state)

    def finish(self, book: TriageBook, why_unfinished: str) -> dict[str, Any]:
        from avsim import metrics
        from avsim.ledger.store import Ledger
        from avsim.storage import exists, read_json
        from avsim.triage.collect import collect, summary_of_run
        from avsim.triage.store import read_triage, triage_uri, write_triage

        week = self.week
        layout = week.layout
        cases = {c.case_id: c for s in Ledger(layout).shard_summaries() for c in s.cases}
        report = collect(
            book,
            cases,
            read_json(layout.head_uri) if exists(layout.head_uri) else {},
            summary_of=summary_of_run(layout.root),
            reruns=self.reruns,
            why_unfinished=why_unfinished or "its triage run ended without a summary of its cases",
        )
        before = read_triage(layout).counts if exists(triage_uri(layout)) else {}
        write_triage(layout, report)
        counts = {v.value: n for v, n in report.counts.items()}
        # A cleared triage writes its document again: the metric counts only the verdicts it adds.
        metrics.triage_verdicts({v.value: n - before.get(v, 0) for v, n in report.counts.items()})
        self.log.info(
            "triage of %s: %s%s", week.run_key, counts, f" ({report.message})" if report.message else ""
        )
        return counts
