"""The weekly report as one HTML page: inline CSS, no script; its plots are SVG files next to it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape
from typing import Any

from avsim.contracts.week import NOT_STARTED
from avsim.phases.contract import NOT_RUN, Outcome
from avsim.report.build import CASE_OUTCOMES, PHASE_OUTCOMES
from avsim.report.plots import COLOURS, PLOTS_NEED

#: The failed-cases table lists at most this many rows; report.json has them all.
MAX_FAILED_ROWS = 2000
#: The comparison tables list at most this many rows each; report.json has more.
MAX_COMPARED_ROWS = 500
#: Outcome cards shown even at zero; the rarer classes only when they occurred.
_ALWAYS_SHOWN = tuple(
    o.value for o in (Outcome.PASSED, Outcome.SCENARIO_FAILED, Outcome.BAD_INPUT, Outcome.INFRA_FAILED)
)
_PLOT_CAPTIONS = {
    "progress": "Cases finished over time against the planned pace and the deadline; GPUs busy",
    "durations": "Duration of each phase (box: quartiles, whiskers: 5th-95th percentile)",
    "failures": "Failed cases by class and failing phase",
}

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0}
body{color:#1d2330;background:#f5f6f8}
header{background:#1d2330;color:#fff;padding:18px 28px}
header h1{margin:0 0 4px;font-size:22px}
header .meta{color:#c5cad6;font-size:13px}
header code{color:#fff}
main{padding:18px 28px;max-width:1400px}
h2{font-size:17px;margin:26px 0 10px}
.cards{display:flex;flex-wrap:wrap;gap:12px}
.card{background:#fff;border-radius:8px;padding:12px 18px;min-width:130px;box-shadow:0 1px 2px #0002}
.card .n{font-size:26px;font-weight:600}
.card .l{color:#5b6475;font-size:12px;text-transform:uppercase;letter-spacing:.04em}
table{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px #0002;margin-bottom:8px}
th,td{padding:6px 10px;border-bottom:1px solid #e6e8ec;text-align:left;vertical-align:top}
th{background:#eef0f4;font-weight:600}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td.reason{max-width:560px;word-break:break-word;color:#3d4657}
figure{margin:0 0 14px;background:#fff;box-shadow:0 1px 2px #0002;padding:8px;display:inline-block}
figure img{max-width:100%}
figcaption{color:#5b6475;font-size:12px}
.zero{color:#b7bcc6}
.note{color:#5b6475}
"""
#: Each class the page shows -> its colour: an attempt's class in its plot's colour, a phase that
#: never ran (upstream failed, not run) as an infrastructure failure, a case the week never started
#: in the notes' neutral grey.
_CLASS_COLOURS = {
    **COLOURS,
    Outcome.UPSTREAM_FAILED.value: COLOURS[Outcome.INFRA_FAILED.value],
    NOT_RUN: COLOURS[Outcome.INFRA_FAILED.value],
    NOT_STARTED: "#5b6475",
}
_CSS += "".join(f".{cls}{{color:{colour}}}" for cls, colour in _CLASS_COLOURS.items()) + "\n"


def _fmt(value: Any) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _cell(value: Any, cls: str = "") -> str:
    attr = f' class="{escape(cls)}"' if cls else ""
    return f"<td{attr}>{escape(_fmt(value))}</td>"


def _table(head: Iterable[str], rows: Iterable[str], num_from: int = 99) -> str:
    ths = "".join(f"<th{' class=num' if i >= num_from else ''}>{escape(h)}</th>" for i, h in enumerate(head))
    return f"<table><thead><tr>{ths}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _link(uri: str) -> str:
    if not uri:
        return "—"
    text = escape(uri)
    if uri.startswith(("file://", "http://", "https://")):
        return f'<a href="{escape(uri, quote=True)}">{text}</a>'
    return f"<code>{text}</code>"


def _cards(totals: Mapping[str, Any]) -> str:
    shown = [o for o in CASE_OUTCOMES if o in _ALWAYS_SHOWN or totals.get(o)]
    items = [("cases", "cases"), *((o, o.replace("_", " ")) for o in shown)]
    if totals.get("missing"):
        items.append(("missing", "missing (no summary)"))
    cards = [
        f'<div class="card"><div class="n {escape(key)}">{escape(_fmt(totals.get(key, 0)))}</div>'
        f'<div class="l">{escape(label)}</div></div>'
        for key, label in items
    ]
    return f'<div class="cards">{"".join(cards)}</div>'


def _outcome_table(table: Mapping[str, Mapping[str, int]]) -> str:
    present = [o for o in PHASE_OUTCOMES if any(o in per for per in table.values())]
    extra = sorted({o for per in table.values() for o in per} - set(PHASE_OUTCOMES))
    columns = [*present, *extra]
    rows = []
    for phase, per in table.items():
        cells = "".join(
            f'<td class="num {escape(o) if per.get(o) else "zero"}">{escape(_fmt(per.get(o, 0)))}</td>'
            for o in columns
        )
        total = _fmt(sum(per.values()))
        rows.append(f"<tr><td>{escape(phase)}</td>{cells}<td class=num>{escape(total)}</td></tr>")
    return _table(["phase", *(c.replace("_", " ") for c in columns), "total"], rows, num_from=1)


def _failed_table(failed: list[Mapping[str, Any]]) -> str:
    if not failed:
        return '<p class="note">No failed cases.</p>'
    rows = [
        "<tr>"
        + _cell(f.get("case_id"))
        + _cell(f.get("graph"))
        + _cell(f.get("outcome"), str(f.get("outcome", "")))
        + _cell(f.get("phase"))
        + _cell(f.get("attempt"), "num")
        + _cell(f.get("reason"), "reason")
        + f"<td>{_link(str(f.get('output_uri') or ''))}</td></tr>"
        for f in failed[:MAX_FAILED_ROWS]
    ]
    more = len(failed) - MAX_FAILED_ROWS
    note = f'<p class="note">… and {more:,} more in report.json.</p>' if more > 0 else ""
    return _table(["case", "graph", "outcome", "phase", "attempt", "reason", "output"], rows) + note


def _duration_table(durations: Mapping[str, Mapping[str, Any]]) -> str:
    if not durations:
        return '<p class="note">No phase has finished yet.</p>'
    keys = ("count", "mean", "p50", "p95", "max")
    rows = [
        f"<tr><td>{escape(phase)}</td>{''.join(_cell(stats.get(k), 'num') for k in keys)}</tr>"
        for phase, stats in durations.items()
    ]
    return _table(["phase", "count", "mean s", "p50 s", "p95 s", "max s"], rows, num_from=1)


def _plots(files: Mapping[str, Any]) -> str:
    plots: Mapping[str, str] = files.get("plots") or {}
    if files.get("plots_missing"):
        return f'<p class="note">No plot: {escape(PLOTS_NEED)}.</p>'
    if not plots:
        return '<p class="note">No plot: no phase has finished yet.</p>'
    return "".join(
        f'<figure><img src="{escape(name, quote=True)}" alt="{escape(_PLOT_CAPTIONS.get(key, key))}">'
        f"<figcaption>{escape(_PLOT_CAPTIONS.get(key, key))}</figcaption></figure>"
        for key, name in plots.items()
    )


def _progress_note(progress: Mapping[str, Any]) -> str:
    """One line under the plots: finished against the planned pace, peak GPUs, and what they mean."""
    if not progress or not progress.get("start"):
        return ""
    ahead = progress.get("ahead_by_cases")
    planned, finished = progress.get("planned_cases"), progress.get("finished_cases")
    # A week that ended with cases unfinished (stopped by the canary gate, say) is not "ahead":
    # the report makes no pace claim for it, as the run page makes none for an ended run.
    stopped = isinstance(planned, int) and isinstance(finished, int) and finished < planned
    pace = (
        f" · planned pace by then {_fmt(progress.get('planned_by_now'))} "
        f"({'ahead' if ahead >= 0 else 'behind'} by {_fmt(abs(ahead))} cases)"
        if isinstance(ahead, int | float) and not stopped
        else ""
    )
    defs: Mapping[str, Any] = progress.get("definitions") or {}
    meaning = "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in defs.items())
    return (
        f'<p class="note" id="progress-note">{escape(_fmt(progress.get("finished_cases")))} of '
        f"{escape(_fmt(progress.get('planned_cases')))} cases finished at "
        f"<code>{escape(_fmt(progress.get('now')))}</code>{escape(pace)} · "
        f"at most {escape(_fmt(progress.get('peak_gpus')))} GPUs busy at once. {escape(meaning)}.</p>"
    )


def _week_line(label: str, week: Mapping[str, Any]) -> str:
    parts = [
        ("week", week.get("iso_week")),
        ("build", week.get("build_id")),
        ("manifest sha256", week.get("manifest_sha256")),
        ("run", week.get("run_id")),
    ]
    body = " · ".join(f"{escape(k)} <code>{escape(_fmt(v))}</code>" for k, v in parts)
    return f"<li>{escape(label)}: {body}</li>"


def _compared_table(entries: list[Mapping[str, Any]]) -> str:
    if not entries:
        return '<p class="note">None.</p>'
    rows = [
        "<tr>"
        + _cell(e.get("case_id"))
        + _cell(e.get("scenario_uri"))
        + _cell(e.get("graph"))
        + _cell(e.get("previous_outcome"), str(e.get("previous_outcome", "")))
        + _cell(e.get("outcome"), str(e.get("outcome", "")))
        + _cell(e.get("failing_phase"))
        + _cell(e.get("matched_by"))
        + "</tr>"
        for e in entries[:MAX_COMPARED_ROWS]
    ]
    more = len(entries) - MAX_COMPARED_ROWS
    note = f'<p class="note">… and {more:,} more in report.json.</p>' if more > 0 else ""
    head = ["case", "scenario", "graph", "last week", "this week", "failing phase", "matched by"]
    return _table(head, rows) + note


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
        f'<p class="note">{escape(_fmt(counts.get("matched", 0)))} cases matched last week '
        f"({escape(_fmt(counts.get('by_case_id', 0)))} by case id, "
        f"{escape(_fmt(counts.get('by_scenario_uri', 0)))} by scenario URI) · "
        f"{escape(_fmt(counts.get('new', 0)))} new · {escape(_fmt(counts.get('dropped', 0)))} dropped · "
        f"{escape(_fmt(counts.get('still_failing', 0)))} still failing</p>"
    )
    out += [
        f"<h3>Newly failing ({escape(_fmt(counts.get('newly_failing', 0)))})</h3>",
        _compared_table(list(comp.get("newly_failing") or [])),
        f"<h3>Newly passing ({escape(_fmt(counts.get('newly_passing', 0)))})</h3>",
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
            f"<code>{escape(_fmt(this_build.get('build_id')))}</code> "
            f"(<code>{escape(_fmt(this_build.get('image')))}</code>)"
        )
    elif build == "new":
        verdict = (
            f'<b class="{Outcome.SCENARIO_FAILED.value}" data-rerun-build="new">a new build</b> '
            f"<code>{escape(_fmt(this_build.get('build_id')))}</code> "
            f"(<code>{escape(_fmt(this_build.get('image')))}</code>), not the original's "
            f"<code>{escape(_fmt(original.get('build_id')))}</code> "
            f"(<code>{escape(_fmt(original.get('image')))}</code>)"
        )
    else:
        verdict = (
            '<b data-rerun-build="unknown">a build not compared</b> '
            f"<code>{escape(_fmt(this_build.get('build_id')))}</code>: "
            f"{escape(str(rerun.get('message') or ''))}"
        )
    out = [
        '<h2>Rerun</h2><p id="rerun">This run reruns the failed cases of run '
        f"{target} (run key <code>{escape(key)}</code>) on {verdict}.</p>"
    ]
    outcomes: Mapping[str, Any] | None = rerun.get("outcomes")
    if outcomes:
        changes = ", ".join(
            f"{escape(k)}: {escape(_fmt(v))}" for k, v in (outcomes.get("transitions") or {}).items()
        )
        out.append(
            f'<p class="note">{escape(_fmt(outcomes.get("resolved", 0)))} of '
            f"{escape(_fmt(outcomes.get('cases', 0)))} rerun cases now have a result (passed or scenario "
            f"failed), {escape(_fmt(outcomes.get('still_failing', 0)))} still fail"
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
            + _cell(r.get("shard"), "num")
            + _cell(r.get("shard_run_id"))
            + _cell(r.get("parent_try"), "num")
            + _cell(r.get("at"))
            + _cell(r.get("cleared"), "num")
            + "</tr>"
            for r in repairs
        ]
        out += [
            f'<h2>Repaired in place ({escape(_fmt(len(repairs)))})</h2><p class="note">This run was '
            "repaired in place: clearing its failed task instances cleared, in each failed shard run, the "
            "failed phases of the failed cases, their downstream phases and the shard's summary; the "
            "outcomes above are the ones after the repair.</p>",
            _table(["shard", "shard run", "try of shards", "at", "task instances cleared"], rows),
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
    return " · ".join(f"{escape(k)} <code>{escape(_fmt(v))}</code>" for k, v in meta if v)


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
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>",
        f'<header><h1>{escape(title)}</h1><div class="meta">{meta_html}</div></header><main>',
        lead,
        _verdict(report),
        _rerun(report),
        "<h2>Cases</h2>",
        _cards(totals),
        f'<p class="note">{escape(_fmt(totals.get("shards", 0)))} shard summaries · '
        f"{escape(_fmt(attempts.get('total', 0)))} attempts · "
        f"{escape(_fmt(attempts.get('retried_phases', 0)))} phases retried · "
        f"at most {escape(_fmt(attempts.get('max_attempts', 0)))} attempts of one phase · "
        f"{escape(_fmt(round(gpu.get('total', 0) / 3600, 2)))} GPU-hours in committed attempts"
        + (f' · <a href="{escape(csv_name, quote=True)}">every case (CSV)</a>' if csv_name else "")
        + "</p>",
        "<h2>Progress, durations, failures</h2>",
        _plots(report.get("files") or {}),
        _progress_note(report.get("progress") or {}),
        "<h2>Compared with the previous week</h2>",
        _comparison(report),
        "<h2>Phase outcomes</h2>",
        _outcome_table(phases.get("overall") or {}),
    ]
    by_graph: Mapping[str, Any] = phases.get("by_graph") or {}
    if len(by_graph) > 1:
        for graph, table in by_graph.items():
            parts += [
                f"<h2>Phase outcomes: graph {escape(graph or '(own phases)')}</h2>",
                _outcome_table(table),
            ]
    run_phases: Mapping[str, Any] = report.get("run_phases") or {}
    if run_phases:
        rows = [f"<tr><td>{escape(k)}</td>{_cell(v, str(v))}</tr>" for k, v in run_phases.items()]
        parts += ["<h2>Run-level phases</h2>", _table(["phase", "outcome"], rows)]
    failed = list(report.get("failed_cases") or [])
    parts += [
        f"<h2>Failed cases ({escape(_fmt(len(failed)))})</h2>",
        _failed_table(failed),
        "<h2>Durations</h2>",
        _duration_table(report.get("durations") or {}),
        "</main></body></html>",
    ]
    return "\n".join(parts) + "\n"
