"""The avsim app's HTML pages: plain HTML and a little JavaScript, no build step, no external asset.

The weekly-run page is a shell that fetches its JSON API and renders it (refreshing every
:data:`REFRESH_SECONDS`); the other pages are rendered on the server.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

from avsim.phases.contract import NOT_RUN, Outcome
from avsim.report.plots import COLOURS
from avsim.ui import theme
from avsim.ui.progress import FAILED

REFRESH_SECONDS = 15

CSS = (
    theme.CSS
    + """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:var(--fg);background:var(--bg)}
a{color:var(--link)}
header{background:var(--head);color:var(--fg);padding:14px 24px;border-bottom:1px solid var(--border)}
header h1{margin:0 0 4px;font-size:20px}
header .meta{color:var(--muted);font-size:13px}
main{padding:14px 24px;max-width:1400px}
h2{font-size:16px;margin:22px 0 8px}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{background:var(--panel);border:1px solid var(--border);border-radius:8px;padding:10px 16px;min-width:120px;box-shadow:0 1px 2px var(--shadow)}
.card .n{font-size:24px;font-weight:600}
.card .l{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.04em}
table{border-collapse:collapse;background:var(--panel);box-shadow:0 1px 2px var(--shadow);margin-bottom:8px}
th,td{padding:5px 9px;border-bottom:1px solid var(--border);text-align:left;vertical-align:top}
th{background:var(--head);font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.bar{background:var(--border);border-radius:4px;height:10px;width:220px;overflow:hidden;display:flex}
.bar span{display:block;height:10px}
.note{color:var(--muted)}.warn{color:var(--warn);font-weight:600}.ok{color:var(--ok);font-weight:600}
.card .n.calm{color:var(--fg)}.card .n.attention{color:var(--warn)}
.notice{font-size:15px;margin:28px 0}
code{font-size:12px}
button{color:var(--fg);background:var(--panel);border:1px solid var(--border);border-radius:4px;padding:2px 10px}
#timeline svg{background:var(--panel)!important}
#timeline svg text[fill="#5b6475"]{fill:var(--muted)}#timeline svg line[stroke="#b7bcc6"]{stroke:var(--border)}
"""
)
_INFRA = COLOURS[Outcome.INFRA_FAILED.value]
#: Each class a case or a phase takes on the page -> its colour: an attempt's class in the report's
#: (:data:`avsim.report.plots.COLOURS`), a failure whose class was not recorded and a phase that never
#: ran in the infrastructure failure's.
CLASS_COLOURS = {**COLOURS, FAILED: _INFRA, Outcome.UPSTREAM_FAILED.value: _INFRA, NOT_RUN: _INFRA}
#: The phases' progress bars: a phase that never ran is drawn lighter than one that failed.
BAR_COLOURS = {**CLASS_COLOURS, Outcome.UPSTREAM_FAILED.value: "#e08a8e", NOT_RUN: "#b7bcc6"}
CSS += "".join(f".{cls}{{color:{colour}}}" for cls, colour in CLASS_COLOURS.items()) + "\n"


def _page(title: str, body: str, script: str = "") -> str:
    js = f"<script>{script}</script>" if script else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style><script>{theme.SCRIPT}</script></head>"
        f"<body>{body}{js}</body></html>\n"
    )


def _table(head: Sequence[str], rows: Iterable[str]) -> str:
    ths = "".join(f"<th>{escape(h)}</th>" for h in head)
    return f"<table><thead><tr>{ths}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _td(value: Any, cls: str = "") -> str:
    text = "—" if value is None or value == "" else str(value)
    attr = f' class="{escape(cls, quote=True)}"' if cls else ""
    return f"<td{attr}>{escape(text)}</td>"


def _a(href: str, text: str) -> str:
    return f'<a href="{escape(href, quote=True)}">{escape(text)}</a>'


def index_page(runs: Sequence[Mapping[str, Any]], reports: Sequence[Mapping[str, str]]) -> str:
    """Weekly runs in the metadata database, and run reports in the artifact store."""
    rows = [
        "<tr>"
        + f"<td>{_a(r['page'], r['run_id'])}</td>"
        + _td(r["dag_id"])
        + _td(r.get("state"), str(r.get("state") or ""))
        + _td(r.get("start_date"))
        + "</tr>"
        for r in runs
    ]
    reps = [f"<li>{_a(r['url'], r['run_key'])}</li>" for r in reports]
    body = (
        "<header><h1>avsim weekly runs</h1></header><main>"
        "<h2>Weekly runs</h2>"
        + (
            _table(["run", "DAG", "state", "started"], rows)
            if rows
            else '<p class="note">No weekly run yet.</p>'
        )
        + "<h2>Reports</h2>"
        + (f"<ul>{''.join(reps)}</ul>" if reps else '<p class="note">No report yet.</p>')
        + "</main>"
    )
    return _page("avsim weekly runs", body)


def progress_page(dag_id: str, run_id: str, api_url: str) -> str:
    """The weekly-run page: a shell the script fills from ``api_url``."""
    title = f"avsim: {dag_id} / {run_id}"
    body = f"""
<header><h1>{escape(title)}</h1><div class="meta" id="meta">loading…</div></header>
<main>
<p class="warn" id="error" hidden></p>
<h2>Cases</h2><div class="cards" id="cases"></div>
<h2>Done cases by class</h2><div class="cards" id="classes"></div>
<h2>Phases</h2><div id="phases"></div>
<h2>Progress over time</h2><div id="timeline"></div><p class="note" id="timeline-note"></p>
<h2>GPU-hours and deadline</h2><div class="cards" id="budget"></div><p class="note" id="deadline-note"></p>
<h2>Canary and breaker</h2><div id="guards"></div>
<h2>Triage of newly failing cases</h2><div id="triage"></div>
<h2>Run-level phases</h2><div id="run-phases"></div>
<h2>Shards</h2><p id="shards"></p><p id="repairs" class="note"></p>
<h2 id="failed-title">Failed cases</h2><div id="failed"></div>
<p><button id="prev" type="button">previous</button> <button id="next" type="button">next</button>
<span class="note" id="page"></span></p>
<p class="note" id="updated"></p>
</main>"""
    return _page(
        title,
        body,
        _SCRIPT.replace("__API__", json.dumps(api_url))
        .replace("__REFRESH__", str(REFRESH_SECONDS))
        .replace("__COLOURS__", json.dumps(BAR_COLOURS)),
    )


_SCRIPT = r"""
const API = __API__, REFRESH = __REFRESH__ * 1000, LIMIT = 50;
let offset = 0;
const $ = (id) => document.getElementById(id);
const esc = (v) => String(v ?? "—").replace(/[&<>"']/g, (c) => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"}[c]));
const num = (v) => (v === null || v === undefined) ? "—" : Number(v).toLocaleString("en-US");
const card = (key, n, label, tone) => `<div class="card" data-count="${esc(key)}"><div class="n ${esc(tone ?? key)}">${num(n)}</div><div class="l">${esc(label)}</div></div>`;
const link = (href, text) => href ? `<a href="${esc(href)}">${esc(text)}</a>` : "—";
const COLOURS = __COLOURS__;

function bar(byClass, total, running) {
  const parts = Object.entries(byClass).map(([k, n]) =>
    `<span title="${esc(k)}: ${num(n)}" style="width:${100 * n / Math.max(1, total)}%;background:${COLOURS[k] || "#888"}"></span>`);
  parts.push(`<span title="running: ${num(running)}" style="width:${100 * running / Math.max(1, total)}%;background:#7fb8e6"></span>`);
  return `<div class="bar">${parts.join("")}</div>`;
}

function render(d) {
  const run = d.run, m = d.manifest || {};
  $("meta").innerHTML = [
    `run ${link(run.url, run.run_id)} <b class="${esc(run.state)}">${esc(run.state)}</b>`,
    `week <code>${esc(m.iso_week)}</code>`, `build <code>${esc(m.build_id)}</code>`,
    `manifest sha256 <code>${esc(m.manifest_sha256)}</code>`,
    link(d.links.report, "weekly report"), link(d.links.cases_csv, "cases.csv"), link(d.links.artifacts, "artifacts"),
  ].join(" · ");
  const c = d.cases;
  // Failed scenarios are results (neutral); red only for the classes that need an engineer.
  $("cases").innerHTML = card("planned", c.planned, "planned") + card("done", c.done, "done") +
    card("running", c.running, "running") +
    (c.not_started ? card("not_started", c.not_started, `not started: ${c.stopped_because}`, "calm") : card("waiting", c.waiting, "waiting")) +
    card("scenario_failed", c.results.scenario_failed, "failed scenarios (results)", "calm") +
    card("attention", c.attention, "need attention", c.attention ? "attention" : "calm");
  $("classes").innerHTML = Object.entries(c.by_class).map(([k, n]) => card(`class-${k}`, n, k.replace(/_/g, " "))).join("")
    || '<p class="note">No case has finished yet.</p>';
  $("phases").innerHTML = d.phases.length ? `<table><thead><tr><th>phase</th><th>progress</th><th>done</th>
    <th>running</th><th>waiting</th><th>by class</th><th>mean s</th></tr></thead><tbody>` +
    d.phases.map((p) => `<tr data-phase="${esc(p.phase)}"><td>${esc(p.phase)}</td><td>${bar(p.by_class, p.total, p.running)}</td>
      <td class="num">${num(p.done)} / ${num(p.total)}</td><td class="num">${num(p.running)}</td><td class="num">${num(p.waiting)}</td>
      <td>${Object.entries(p.by_class).map(([k, n]) => `<span class="${esc(k)}">${esc(k)} ${num(n)}</span>`).join(", ")}</td>
      <td class="num">${num(p.mean_seconds)}</td></tr>`).join("") + "</tbody></table>"
    : '<p class="note">No phase task instance yet.</p>';
  const g = d.gpu, dl = d.deadline;
  $("budget").innerHTML = card("gpu-spent", g.spent_hours, "GPU-hours spent") +
    card("gpu-planned", g.planned_hours, "GPU-hours planned") + card("gpus", g.gpus_in_use, "GPUs in use") +
    card("gpus-needed", dl.gpus_needed, "GPUs needed");
  const v = dl.verdict || {state: "none", text: "no estimate yet"};
  const verdict = `<span class="${v.state === "late" ? "warn" : v.state === "none" || v.state === "ended" ? "note" : "ok"}" data-verdict="${esc(v.state)}">${esc(v.text)}</span>`;
  $("deadline-note").innerHTML = `deadline <code>${esc(dl.deadline)}</code> · ` + (v.state === "ended" ? verdict : dl.available && v.state !== "none"
    ? `estimated finish <code>${esc(dl.estimated_finish)}</code> (${verdict}) · action <code>${esc(dl.action)}</code> · as of <code>${esc(dl.at)}</code>`
    : `estimated finish: ${verdict}` + (dl.available ? ` · as of <code>${esc(dl.at)}</code>` : ` <span class="note">(${esc(dl.message)})</span>`)) + (g.spent_of_planned !== null ? ` · ${(100 * g.spent_of_planned).toFixed(1)}% of planned GPU-hours spent` : "");
  const tl = d.timeline || {};
  $("timeline").innerHTML = tl.available ? tl.svg : '<p class="note">No attempt has started yet.</p>';
  $("timeline-note").innerHTML = tl.available ? `${num(tl.finished_cases)} of ${num(tl.planned_cases)} cases finished` +
    (tl.ended ? ` · <span data-pace="ended">the run ended ${esc(run.state)}: no pace claim</span>` : "") +
    (!tl.ended && tl.planned_by_now !== null ? ` · planned pace by now ${num(tl.planned_by_now)} (${tl.ahead_by_cases >= 0
      ? `<span class="ok">ahead by ${num(tl.ahead_by_cases)}</span>` : `<span class="warn">behind by ${num(-tl.ahead_by_cases)}</span>`})` : "") +
    ` · at most ${num(tl.peak_gpus)} GPUs busy at once. Finished: ${esc(tl.definitions.finished)}; planned pace: ${esc(tl.definitions.planned)}.`
    : esc(tl.message || "");
  const cn = d.canary, br = d.breaker;
  const canary = cn.available ? `<b class="${cn.state === "failed" ? "warn" : cn.state === "passed" ? "ok" : ""}" data-canary="${esc(cn.state)}">${esc(cn.state)}</b>
      (${num(cn.finished)} / ${num(cn.cases)} cases finished, failure rate ${esc(cn.rate)} against ${esc(cn.threshold)}) ${esc(cn.message || "")}`
    : `<span data-canary="${esc(cn.state || "none")}">${esc(cn.message)}</span>`;
  const breaker = br.available ? `<b class="${br.state === "open" ? "warn" : "ok"}" data-breaker="${esc(br.state)}">${esc(br.state)}</b>
      (${num(br.failures)} failures in ${num(br.finished)}, threshold ${esc(br.threshold)}) ${esc(br.reason || "")}`
    : `<span data-breaker="none">no record</span> <span class="note">(${esc(br.message)})</span>`;
  $("guards").innerHTML = `<p>canary: ${canary}${cn.run ? " · " + link(cn.run.url, "canary run") : ""}</p><p>breaker of the build: ${breaker}</p>`;
  const tr = d.triage || {};
  $("triage").innerHTML = tr.available
    ? `<p>${Object.entries(tr.counts || {}).map(([v, n]) =>
        `${esc(v.replace(/_/g, " "))} <b data-triage="${esc(v)}">${num(n)}</b>`).join(" · ")}` +
      (tr.message ? ` <span class="note">${esc(tr.message)}</span>` : "") + `</p>` +
      ((tr.cases || []).length ? `<p>` + tr.cases.map((c) =>
        `<span data-triage-case="${esc(c.case_id)}" data-verdict="${esc(c.verdict)}">${link(c.url, c.case_id)} ${esc(String(c.verdict).replace(/_/g, " "))}</span>`).join(" · ") + `</p>` : "")
    : `<p class="note">${esc(tr.message || "no triage yet")}</p>`;
  const rl = d.run_phases || [];
  $("run-phases").innerHTML = rl.length ? `<table id="run-phase-table"><thead><tr><th>phase</th><th>state</th><th>task</th><th></th></tr></thead><tbody>` +
    rl.map((r) => `<tr data-run-phase="${esc(r.phase)}" data-shown="${esc(r.shown)}"><td>${esc(r.phase)}</td>
      <td class="${r.attention ? "warn" : r.shown === "passed" ? "passed" : "note"}">${esc(String(r.shown).replace(/_/g, " "))}</td>
      <td>${esc(r.task_state)}</td><td>${esc(r.text)}</td></tr>`).join("") + "</tbody></table>"
    : '<p class="note">This week has no run-level phase.</p>';
  const s = d.shards;
  $("shards").innerHTML = `${num(s.done)} done · ${num(s.running)} running · ${num(s.queued)} queued · ${num(s.not_started)} not started of ${num(s.planned)}` +
    (s.active.length ? " · active: " + s.active.map((r) => link(r.url, `shard ${r.shard}`)).join(", ") : "");
  const rp = d.repairs || [];
  $("repairs").innerHTML = rp.length ? `<b data-repaired="${rp.length}">repaired in place</b>: ` + rp.map((r) =>
    `shard ${esc(r.shard)} (try ${esc(r.parent_try)} of its shards task, ${esc(r.at)}, ${num(r.cleared)} task instances cleared)`).join("; ") : "";
  const f = d.failed;
  $("failed-title").textContent = `Failed phases (${f.total.toLocaleString("en-US")}: ${num(f.attention)} need attention, ` +
    `${num(f.total - f.attention)} failed scenarios)`;
  $("failed").innerHTML = f.items.length ? `<table id="failed-table"><thead><tr><th>case</th><th>graph</th><th>phase</th><th>class</th>
    <th>try</th><th>ended</th><th>reason</th><th>links</th></tr></thead><tbody>` +
    f.items.map((x) => `<tr data-case="${esc(x.case_id)}"><td>${link(x.links.case, x.case_id)}</td><td>${esc(x.graph)}</td><td>${esc(x.phase)}</td>
      <td class="${esc(x.class)}">${esc(x.class)}</td><td class="num">${num(x.try_number)}</td><td>${esc(x.ended_at)}</td>
      <td>${esc(x.reason)}</td><td>${link(x.links.task_instance, "task instance")} · ${link(x.links.artifacts, "artifacts")}</td></tr>`).join("") +
    "</tbody></table>" : '<p class="note">No failed case.</p>';
  $("page").textContent = f.total ? `${f.offset + 1}-${f.offset + f.items.length} of ${f.total}` : "";
  $("prev").disabled = f.offset <= 0;
  $("next").disabled = f.offset + f.items.length >= f.total;
  $("updated").textContent = `updated ${d.generated_at}; refreshes every ${REFRESH / 1000} s`;
  document.body.dataset.loaded = "true";
}

async function load() {
  try {
    const resp = await fetch(`${API}?offset=${offset}&limit=${LIMIT}`, {credentials: "same-origin"});
    if (!resp.ok) throw new Error(`${resp.status} ${resp.statusText}`);
    render(await resp.json());
    $("error").hidden = true;
  } catch (e) {
    $("error").hidden = false;
    $("error").textContent = `could not load the run's progress: ${e.message}`;
  }
}
$("prev").onclick = () => { offset = Math.max(0, offset - LIMIT); load(); };
$("next").onclick = () => { offset += LIMIT; load(); };
load();
setInterval(load, REFRESH);
"""


def _ti_text(ti: Mapping[str, Any]) -> str:
    return f"{ti.get('state') or 'none'}, try {ti.get('try_number')}"


def case_page(doc: Mapping[str, Any], run_link: str | None) -> str:
    """A case's phases: committed outcome, task instance, every attempt, artifacts."""
    case_id = str(doc["case_id"])
    parts = []
    for p in doc["phases"]:
        out = p.get("outcome") or {}
        ti = p.get("task_instance") or {}
        folders = " ".join(_a(f["url"], f["name"]) for f in p.get("attempt_folders") or []) or "—"
        summary = _table(
            ["committed outcome", "attempt", "reason", "task instance", "artifacts"],
            [
                "<tr>"
                + _td(out.get("outcome") or "not committed", str(out.get("outcome") or ""))
                + _td(out.get("attempt"))
                + _td(out.get("reason"))
                + (f"<td>{_a(ti['url'], _ti_text(ti))}</td>" if ti else _td("not found"))
                + f"<td>{_a(p['artifacts'], 'all attempts')}: {folders}</td></tr>"
            ],
        )
        attempts = [
            "<tr>"
            + _td(a.get("attempt"), "num")
            + _td(a.get("outcome"), str(a.get("outcome") or ""))
            + _td(a.get("exit_code"), "num")
            + _td(a.get("started_at"))
            + _td(a.get("ended_at"))
            + _td(round(float(a.get("duration_seconds") or 0), 2), "num")
            + _td(a.get("node_class") or a.get("host"))
            + _td(a.get("reason"))
            + "</tr>"
            for a in p.get("attempts") or []
        ]
        attempt_table = (
            _table(["attempt", "outcome", "exit", "started", "ended", "seconds", "node", "reason"], attempts)
            if attempts
            else '<p class="note">No attempt recorded.</p>'
        )
        parts.append(
            f'<section data-phase="{escape(p["phase"], quote=True)}"><h2>{escape(p["phase"])}</h2>{summary}{attempt_table}</section>'
        )
    meta = f"run <code>{escape(str(doc['run_key']))}</code>" + (
        f" · {_a(run_link, 'weekly run page')}" if run_link else ""
    )
    body = (
        f'<header><h1>case {escape(case_id)}</h1><div class="meta">{meta}</div></header><main>'
        + ("".join(parts) or '<p class="note">Nothing recorded for this case yet.</p>')
        + "</main>"
    )
    return _page(f"avsim case {case_id}", body)


def notice_page(title: str, sentence: str) -> str:
    """A page that says one thing: that what the tab or link names is not for these pages."""
    body = (
        f"<header><h1>{escape(title)}</h1></header>"
        f'<main><p class="notice" id="notice">{escape(sentence)}</p></main>'
    )
    return _page(title, body)


def listing_page(title: str, parent: str | None, entries: Sequence[tuple[str, str, int | None, bool]]) -> str:
    """A folder of a run's artifacts: (name, url, size, is folder) per entry."""
    rows = [
        "<tr>" + f"<td>{_a(url, name + ('/' if is_dir else ''))}</td>" + _td(size, "num") + "</tr>"
        for name, url, size, is_dir in entries
    ]
    up = f"<p>{_a(parent, '..')}</p>" if parent else ""
    body = (
        f"<header><h1>{escape(title)}</h1></header><main>{up}"
        + (_table(["name", "bytes"], rows) if rows else '<p class="note">Empty.</p>')
        + "</main>"
    )
    return _page(title, body)
