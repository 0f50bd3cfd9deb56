"""The report's plots, as SVG documents: progress over time, phase durations, failure classes.

matplotlib (Agg backend) is imported only when a plot is drawn. Each function returns the SVG
text, or None when there is nothing to draw; :func:`render_plots` draws them all.
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from avsim.phases.contract import Outcome
from avsim.report.cases import parse_time

if TYPE_CHECKING:
    from avsim.report.timeline import Timeline

#: Outcome class -> colour (the same as the HTML page's).
COLOURS = {
    Outcome.PASSED.value: "#1c7c3c",
    Outcome.SCENARIO_FAILED.value: "#b35c00",
    Outcome.BAD_INPUT.value: "#a1127b",
    Outcome.INFRA_FAILED.value: "#c0262d",
    Outcome.PREEMPTED.value: "#6a4fb3",
    Outcome.BAD_BUILD.value: "#5b2a0e",
}
_PASSED, _ALARM = Outcome.PASSED.value, Outcome.INFRA_FAILED.value
PLOTS = {"progress": "progress.svg", "durations": "durations.svg", "failures": "failures.svg"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _svg(fig: Any) -> str:
    plt = _pyplot()
    buf = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "avsim"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return buf.getvalue()


def progress_svg(
    rows: Sequence[Mapping[str, Any]], planned: int | None = None, deadline: str | None = None
) -> str | None:
    """Cases finished against time (a step line), with the planned total and the deadline."""
    times = sorted(t for t in (parse_time(r.get("finished_at")) for r in rows) if t is not None)
    if not times:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.6))
    xs = [times[0], *times]
    ys = [0, *range(1, len(times) + 1)]
    ax.step(xs, ys, where="post", color=COLOURS[_PASSED], linewidth=1.6, label="cases finished")
    if planned:
        ax.axhline(planned, color="#5b6475", linestyle="--", linewidth=1, label=f"planned ({planned:,})")
    due = parse_time(deadline)
    if due is not None and due - times[-1] < dt.timedelta(days=14):
        ax.axvline(due, color=COLOURS[_ALARM], linestyle=":", linewidth=1.4, label="deadline")
    ax.set_ylabel("cases finished")
    ax.set_xlabel("time (UTC)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.autofmt_xdate()
    return _svg(fig)


def timeline_svg(timeline: Timeline) -> str | None:
    """Cases finished against the planned pace and the deadline (top), GPUs busy (bottom)."""
    if timeline.empty or not (timeline.finished or timeline.gpus_busy):
        return None
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(9, 5.4), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    if timeline.finished:
        xs, ys = zip(*timeline.finished, strict=True)
        top.step(xs, ys, where="post", color=COLOURS[_PASSED], linewidth=1.6, label="cases finished")
    if timeline.planned:
        xs, ys = zip(*timeline.planned, strict=True)
        top.plot(xs, ys, color="#5b6475", linestyle="--", linewidth=1, label="planned pace")
    if timeline.planned_cases:
        top.axhline(timeline.planned_cases, color="#b7bcc6", linewidth=0.8)
    if timeline.deadline is not None:
        for ax in (top, bottom):
            ax.axvline(timeline.deadline, color=COLOURS[_ALARM], linestyle=":", linewidth=1.4)
        top.plot([], [], color=COLOURS[_ALARM], linestyle=":", label="deadline")
    top.set_ylabel("cases")
    top.set_ylim(bottom=0)
    top.grid(alpha=0.3)
    top.legend(loc="upper left", fontsize=8)
    if timeline.gpus_busy:
        xs, gpus = zip(*timeline.gpus_busy, strict=True)
        bottom.step(xs, gpus, where="post", color="#2f6fb0", linewidth=1.2)
        bottom.fill_between(xs, gpus, step="post", color="#2f6fb0", alpha=0.2)
    bottom.set_ylabel("GPUs busy")
    bottom.set_xlabel("time (UTC)")
    bottom.set_ylim(bottom=0)
    bottom.grid(alpha=0.3)
    fig.autofmt_xdate()
    return _svg(fig)


def durations_svg(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """Distribution of each phase's duration (box plot, whiskers at the 5th and 95th percentiles)."""
    per_phase: dict[str, list[float]] = {}
    for r in rows:
        for name, seconds in (r.get("durations") or {}).items():
            if isinstance(seconds, int | float):
                per_phase.setdefault(str(name), []).append(float(seconds))
    per_phase = {k: v for k, v in per_phase.items() if v}
    if not per_phase:
        return None
    plt = _pyplot()
    names = list(per_phase)
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(names) + 1.4))
    import matplotlib

    # matplotlib 3.10 replaced vert= with orientation=; the lock pins 3.11, older ones still work.
    horizontal = (
        {"orientation": "horizontal"}
        if tuple(int(x) for x in matplotlib.__version__.split(".")[:2]) >= (3, 10)
        else {"vert": False}
    )
    ax.boxplot(
        [per_phase[n] for n in names],
        **horizontal,
        whis=(5, 95),
        showfliers=False,
        patch_artist=True,
        boxprops={"facecolor": "#d8ecf3"},
        medianprops={"color": "#1d2330"},
    )
    ax.set_yticks(range(1, len(names) + 1), [f"{n} ({len(per_phase[n]):,})" for n in names])
    low = min(min(v) for v in per_phase.values())
    high = max(max(v) for v in per_phase.values())
    if low > 0 and high / low > 50:
        ax.set_xscale("log")
    ax.set_xlabel("seconds (committed attempt)")
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig)


def failures_svg(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """Failed cases by class, split by the phase that failed them."""
    table: dict[str, dict[str, int]] = {}
    for r in rows:
        outcome = str(r.get("outcome") or "")
        if outcome and outcome != _PASSED:
            phase = str(r.get("failing_phase") or "?")
            per = table.setdefault(outcome, {})
            per[phase] = per.get(phase, 0) + 1
    if not table:
        return None
    plt = _pyplot()
    classes = sorted(table, key=lambda c: -sum(table[c].values()))
    phases = sorted({p for per in table.values() for p in per})
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(classes) + 1.4))
    left = [0] * len(classes)
    cmap = plt.get_cmap("tab10")
    for i, phase in enumerate(phases):
        widths = [table[c].get(phase, 0) for c in classes]
        ax.barh(classes, widths, left=left, color=cmap(i % 10), label=phase)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:,}", va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("failed cases (colour: the phase that failed them)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig)


def render_plots(
    rows: Sequence[Mapping[str, Any]],
    planned: int | None = None,
    deadline: str | None = None,
    timeline: Timeline | None = None,
) -> dict[str, str]:
    """File name -> SVG text of every plot there is data for.

    With a ``timeline`` (from the ledger), the progress plot is :func:`timeline_svg`; without one,
    cases finished from the rows' ``finished_at``.
    """
    progress = timeline_svg(timeline) if timeline is not None else None
    drawn = {
        PLOTS["progress"]: progress or progress_svg(rows, planned, deadline),
        PLOTS["durations"]: durations_svg(rows),
        PLOTS["failures"]: failures_svg(rows),
    }
    return {name: svg for name, svg in drawn.items() if svg}
