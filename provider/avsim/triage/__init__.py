"""Triage of newly failing cases: reruns on this week's and last week's builds, and their verdict.

:mod:`avsim.triage.model` is the document, :mod:`avsim.triage.decide` the pure decisions (which
cases, which verdict, what fits the budget, the determinism audit's sample), :mod:`avsim.triage.store`
where the document lives (``report/triage.json`` of the run) and :mod:`avsim.triage.text` its table.
"""
