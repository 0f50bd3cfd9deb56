"""The weekly report as one HTML page: inline CSS, no script; its plots are SVG files next to it."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from avsim.phases.contract import Outcome
from avsim.report import html_blocks as blocks


def _week_line(label: str, week: Mapping[str, Any]) -> str:
    parts = [
        ("week", week.get("iso_week")),
        ("build", week.get("build_id")),
        ("manifest sha256", week.get("manifest_sha256")),
        ("run", week.get("run_id")),
    ]
    body = " · ".join(f"{escape(k)} <code>{escape(blocks.fmt(v))}</code>" for k, v in parts)
    return f"<li>{escape(label)}: {body}</li>"


def _compared_table(entries: list[Mapping[str, Any]]) -> str:
    if not entries:
        return '<p class="note">None.</p>'
    rows = [
        "<tr>"
        + blocks.cell(e.get("case_id"))
        + blocks.cell(e.get("scenario_uri"))
        + blocks.cell(e.get("graph"))
        + blocks.cell(e.get("previous_outcome"), str(e.get("previous_outcome", "")))
        + blocks.cell(e.get("outcome"), str(e.get("outcome", "")))
        + blocks.cell(e.get("failing_phase"))
        + blocks.cell(e.get("matched_by"))
        + "</tr>"
        for e in entries[: blocks.MAX_COMPARED_ROWS]
    ]
    more = len(entries) - blocks.MAX_COMPARED_ROWS
    note = f'<p class="note">… and {more:,} more in report.json.</p>' if more > 0 else ""
    head = ["case", "scenario", "graph", "last week", "this week", "failing phase", "matched by"]
    return blocks.html_table(head, rows) + note


def _comparison(report: Mapping[str, Any]) -> str:
    comp: Mapping[str, Any] = report.get("comparison") or {}
    run: Mapping[str, Any] = report.get("run") or {}
    build: Mapping[str, Any] = report.get("build") or {}
    this_week = {
        "iso_week": run.get("iso_week"),
        "build_id": build.get("build_id"),
        "manifest_sha256": report.get("manifest_sha256"),
        "run_id": report.get("run_id"),
    }
    weeks = [_week_line("this week", this_week)]
    if comp.get("previous"):
        weeks.append(_week_line("previous week", comp["previous"]))
    out = [f"<ul>{''.join(weeks)}</ul>"]
    if not comp.get("available"):
        out.append(
            f'<p class="note">No comparison: {escape(str(comp.get("message") or "not available"))}.</p>'
        )
        return "".join(out)
    counts: Mapping[str, Any] = comp.get("counts") or {}
    out.append(
        f'<p class="note">{escape(blocks.fmt(counts.get("matched", 0)))} cases matched last week '
        f"({escape(blocks.fmt(counts.get('by_case_id', 0)))} by case id, "
        f"{escape(blocks.fmt(counts.get('by_scenario_uri', 0)))} by scenario URI) · "
        f"{escape(blocks.fmt(counts.get('new', 0)))} new · {escape(blocks.fmt(counts.get('dropped', 0)))} dropped · "
        f"{escape(blocks.fmt(counts.get('still_failing', 0)))} still failing</p>"
    )
    out += [
        f"<h3>Newly failing ({escape(blocks.fmt(counts.get('newly_failing', 0)))})</h3>",
        _compared_table(list(comp.get("newly_failing") or [])),
        f"<h3>Newly passing ({escape(blocks.fmt(counts.get('newly_passing', 0)))})</h3>",
        _compared_table(list(comp.get("newly_passing") or [])),
    ]
    return "".join(out)


def _rerun(report: Mapping[str, Any]) -> str:
    """What a rerun reruns, on which build, and how its cases ended against the original run."""
    rerun: Mapping[str, Any] = report.get("rerun") or {}
    if not rerun.get("of"):
        return ""
    original: Mapping[str, Any] = rerun.get("original") or {}
    this_build: Mapping[str, Any] = rerun.get("this_build") or report.get("build") or {}
    key = str(rerun["of"])
    label = escape(str(original.get("run_id") or key))
    target = (
        f'<a href="{escape(original["report"], quote=True)}">{label}</a>' if original.get("report") else label
    )
    build = rerun.get("build")
    if build == "same":
        verdict = (
            f'<b class="{Outcome.PASSED.value}" data-rerun-build="same">the same pinned build</b> '
            f"<code>{escape(blocks.fmt(this_build.get('build_id')))}</code> "
            f"(<code>{escape(blocks.fmt(this_build.get('image')))}</code>)"
        )
    elif build == "new":
        verdict = (
            f'<b class="{Outcome.SCENARIO_FAILED.value}" data-rerun-build="new">a new build</b> '
            f"<code>{escape(blocks.fmt(this_build.get('build_id')))}</code> "
            f"(<code>{escape(blocks.fmt(this_build.get('image')))}</code>), not the original's "
            f"<code>{escape(blocks.fmt(original.get('build_id')))}</code> "
            f"(<code>{escape(blocks.fmt(original.get('image')))}</code>)"
        )
    else:
        verdict = (
            '<b data-rerun-build="unknown">a build not compared</b> '
            f"<code>{escape(blocks.fmt(this_build.get('build_id')))}</code>: "
            f"{escape(str(rerun.get('message') or ''))}"
        )
    out = [
        '<h2>Rerun</h2><p id="rerun">This run reruns the failed cases of run '
        f"{target} (run key <code>{escape(key)}</code>) on {verdict}.</p>"
    ]
    outcomes: Mapping[str, Any] | None = rerun.get("outcomes")
    if outcomes:
        changes = ", ".join(
            f"{escape(k)}: {escape(blocks.fmt(v))}" for k, v in (outcomes.get("transitions") or {}).items()
        )
        out.append(
            f'<p class="note">{escape(blocks.fmt(outcomes.get("resolved", 0)))} of '
            f"{escape(blocks.fmt(outcomes.get('cases', 0)))} rerun cases now have a result (passed or scenario "
            f"failed), {escape(blocks.fmt(outcomes.get('still_failing', 0)))} still fail"
            + (f" ({changes})" if changes else "")
            + ".</p>"
        )
    else:
        out.append('<p class="note">The original run has no cases.csv: outcomes not compared.</p>')
    return "".join(out)


def _verdict(report: Mapping[str, Any]) -> str:
    """The week's verdict in one line, and the repairs in place of its failed shard runs."""
    verdict: Mapping[str, Any] = report.get("verdict") or {}
    repairs: list[Mapping[str, Any]] = list(report.get("repairs") or [])
    out = []
    if verdict:
        state = str(verdict.get("state") or "passed")
        cls = (Outcome.PASSED if state == "passed" else Outcome.INFRA_FAILED).value  # the colour
        out.append(
            f'<p id="verdict" data-verdict="{escape(state, quote=True)}"><b class="{cls}">'
            f"{escape(state.replace('_', ' '))}</b>: {escape(str(verdict.get('line') or ''))}</p>"
        )
    if repairs:
        rows = [
            "<tr>"
            + blocks.cell(r.get("shard"), "num")
            + blocks.cell(r.get("shard_run_id"))
            + blocks.cell(r.get("parent_try"), "num")
            + blocks.cell(r.get("at"))
            + blocks.cell(r.get("cleared"), "num")
            + "</tr>"
            for r in repairs
        ]
        out += [
            f'<h2>Repaired in place ({escape(blocks.fmt(len(repairs)))})</h2><p class="note">This run was '
            "repaired in place: clearing its failed task instances cleared, in each failed shard run, the "
            "failed phases of the failed cases, their downstream phases and the shard's summary; the "
            "outcomes above are the ones after the repair.</p>",
            blocks.html_table(["shard", "shard run", "try of shards", "at", "task instances cleared"], rows),
        ]
    return "".join(out)


def _title(report: Mapping[str, Any]) -> str:
    run: Mapping[str, Any] = report.get("run") or {}
    return (
        f"avsim weekly report: {run.get('name') or report.get('run_id')} {run.get('iso_week') or ''}".strip()
    )


def _meta(report: Mapping[str, Any]) -> str:
    """The line under the title: the week, its build, its run, when the report was written."""
    run: Mapping[str, Any] = report.get("run") or {}
    build: Mapping[str, Any] = report.get("build") or {}
    meta = [
        ("week", run.get("iso_week")),
        ("run class", run.get("run_class")),
        ("deadline", run.get("deadline")),
        ("build", build.get("build_id")),
        ("image", build.get("image")),
        ("run", report.get("run_id")),
        ("rerun of", (report.get("rerun") or {}).get("of")),
        ("manifest sha256", report.get("manifest_sha256")),
        ("generated", report.get("generated_at")),
    ]
    return " · ".join(f"{escape(k)} <code>{escape(blocks.fmt(v))}</code>" for k, v in meta if v)


def render_html(report: Mapping[str, Any], lead: str = "") -> str:
    """The page for ``report`` (as built by :func:`avsim.report.build.build_report`); ``lead``: HTML
    of a section the page opens with (the week's triage, :mod:`avsim.triage.html`)."""
    totals: Mapping[str, Any] = report.get("totals") or {}
    phases: Mapping[str, Any] = report.get("phase_outcomes") or {}
    attempts: Mapping[str, Any] = report.get("attempts") or {}
    gpu: Mapping[str, Any] = report.get("gpu_seconds") or {}
    csv_name = str((report.get("files") or {}).get("csv") or "")
    title, meta_html = _title(report), _meta(report)
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{blocks.CSS}</style></head><body>",
        f'<header><h1>{escape(title)}</h1><div class="meta">{meta_html}</div></header><main>',
        lead,
        _verdict(report),
        _rerun(report),
        "<h2>Cases</h2>",
        blocks.cards(totals),
        f'<p class="note">{escape(blocks.fmt(totals.get("shards", 0)))} shard summaries · '
        f"{escape(blocks.fmt(attempts.get('total', 0)))} attempts · "
        f"{escape(blocks.fmt(attempts.get('retried_phases', 0)))} phases retried · "
        f"at most {escape(blocks.fmt(attempts.get('max_attempts', 0)))} attempts of one phase · "
        f"{escape(blocks.fmt(round(gpu.get('total', 0) / 3600, 2)))} GPU-hours in committed attempts"
        + (f' · <a href="{escape(csv_name, quote=True)}">every case (CSV)</a>' if csv_name else "")
        + "</p>",
        "<h2>Progress, durations, failures</h2>",
        blocks.plots(report.get("files") or {}),
        blocks.progress_note(report.get("progress") or {}),
        "<h2>Compared with the previous week</h2>",
        _comparison(report),
        "<h2>Phase outcomes</h2>",
        blocks.outcome_table(phases.get("overall") or {}),
    ]
    by_graph: Mapping[str, Any] = phases.get("by_graph") or {}
    if len(by_graph) > 1:
        for graph, table in by_graph.items():
            parts += [
                f"<h2>Phase outcomes: graph {escape(graph or '(own phases)')}</h2>",
                blocks.outcome_table(table),
            ]
    run_phases: Mapping[str, Any] = report.get("run_phases") or {}
    if run_phases:
        rows = [f"<tr><td>{escape(k)}</td>{blocks.cell(v, str(v))}</tr>" for k, v in run_phases.items()]
        parts += ["<h2>Run-level phases</h2>", blocks.html_table(["phase", "outcome"], rows)]
    failed = list(report.get("failed_cases") or [])
    parts += [
        f"<h2>Failed cases ({escape(blocks.fmt(len(failed)))})</h2>",
        blocks.failed_table(failed),
        "<h2>Durations</h2>",
        blocks.duration_table(report.get("durations") or {}),
        "</main></body></html>",
    ]
    return "\n".join(parts) + "\n"
