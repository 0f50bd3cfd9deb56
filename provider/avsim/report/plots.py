"""The report's plots, as SVG documents: progress over time, phase durations, failure classes.

matplotlib (Agg backend) is imported only when a plot is drawn. Each function returns the SVG
text, or None when there is nothing to draw; :func:`render_plots` draws them all.
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from avsim.phases.contract import CLASS_COLOURS, Outcome
from avsim.report.cases import parse_time

if TYPE_CHECKING:
    from avsim.report.timeline import Timeline

#: Outcome class -> colour (the class table's, avsim.phases.contract.CLASS_RULES; the HTML page
#: and the avsim pages take their colours from here).
COLOURS = CLASS_COLOURS
_PASSED, _ALARM = Outcome.PASSED.value, Outcome.INFRA_FAILED.value
PLOTS = {"progress": "progress.svg", "durations": "durations.svg", "failures": "failures.svg"}
#: A deadline at most this share of the data's span beyond its end is drawn on the time axis;
#: one further ahead is an annotation at the axis' right edge ("deadline in 7 h 55 min →").
NEAR_DEADLINE_SHARE = 0.5
#: The shortest time axis (a week that ran for seconds still gets a readable one).
MIN_SPAN = dt.timedelta(seconds=10)


@dataclass(frozen=True)
class TimeAxis:
    """The time axis of a progress chart: scaled to the data, the deadline on it only when near."""

    start: dt.datetime
    end: dt.datetime
    deadline: dt.datetime | None
    #: The deadline lies within the axis (drawn as a line); else it is an annotation.
    deadline_on_axis: bool
    #: The run has ended: the axis ends with it, and the annotation says "later", not "in".
    ended: bool = False

    @property
    def deadline_note(self) -> str:
        """The annotation of a deadline beyond the axis (empty when it is on the axis or unknown)."""
        if self.deadline is None or self.deadline_on_axis:
            return ""
        ahead = _duration(self.deadline - self.end)
        return f"deadline {ahead} later →" if self.ended else f"deadline in {ahead} →"


def time_axis(
    start: dt.datetime, data_end: dt.datetime, deadline: dt.datetime | None, *, ended: bool = False
) -> TimeAxis:
    """The axis from ``start`` to ``data_end`` (the last point, or now), stretched to the deadline
    only when it lies at most :data:`NEAR_DEADLINE_SHARE` of the data's span beyond it."""
    end = max(data_end, start + MIN_SPAN)
    if deadline is None:
        return TimeAxis(start, end, None, False, ended)
    if deadline <= end:
        return TimeAxis(start, end, deadline, deadline >= start, ended)
    if deadline - end <= (end - start) * NEAR_DEADLINE_SHARE:
        return TimeAxis(start, deadline, deadline, True, ended)
    return TimeAxis(start, end, deadline, False, ended)


def _duration(delta: dt.timedelta) -> str:
    """``3 d 4 h``, ``7 h 55 min`` or ``12 min``: the two largest units, rounded to the minute."""
    minutes = max(0, round(delta.total_seconds() / 60))
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    return f"{hours} h {mins} min" if hours else f"{mins} min"


#: What a report without plots says: they come with the ``[report]`` extra.
PLOTS_NEED = 'the plots need matplotlib: pip install "airflow-provider-avsim[report]"'


def plots_available() -> bool:
    """Whether matplotlib is installed (the ``[report]`` extra); without it the report has no plots."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


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
    axis = time_axis(times[0], times[-1], parse_time(deadline), ended=True)
    _deadline_mark(ax, axis, label="deadline")
    ax.set_xlim(axis.start, axis.end)
    ax.set_ylabel("cases finished")
    ax.set_xlabel("time (UTC)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.autofmt_xdate()
    return _svg(fig)


def _deadline_mark(ax: Any, axis: TimeAxis, label: str | None = None) -> None:
    """The deadline as a line on the axis when near, else (with a ``label``) a note at its right edge."""
    if axis.deadline_on_axis and axis.deadline is not None:
        ax.axvline(axis.deadline, color=COLOURS[_ALARM], linestyle=":", linewidth=1.4, label=label)
    elif axis.deadline_note and label:
        ax.annotate(
            axis.deadline_note,
            xy=(1.0, 1.0),
            xycoords="axes fraction",
            xytext=(-4, -12),
            textcoords="offset points",
            ha="right",
            color=COLOURS[_ALARM],
            fontsize=9,
        )


def timeline_svg(timeline: Timeline, ended: bool = True) -> str | None:
    """Cases finished against the planned pace and the deadline (top), GPUs busy (bottom).

    The time axis spans the data (:func:`time_axis`): a deadline far beyond it is a note, not a
    stretch of empty axis. ``ended``: the run is over (the report is written at its end).
    """
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
    assert timeline.start is not None
    last = [timeline.now, *(t for t, _ in timeline.finished), *(t for t, _ in timeline.gpus_busy)]
    axis = time_axis(timeline.start, max(last), timeline.deadline, ended=ended)
    _deadline_mark(top, axis, label="deadline")
    _deadline_mark(bottom, axis)
    top.set_xlim(axis.start, axis.end)
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
    """File name -> SVG text of every plot there is data for (none without matplotlib).

    With a ``timeline`` (from the ledger), the progress plot is :func:`timeline_svg`; without one,
    cases finished from the rows' ``finished_at``.
    """
    if not plots_available():
        return {}
    progress = timeline_svg(timeline) if timeline is not None else None
    drawn = {
        PLOTS["progress"]: progress or progress_svg(rows, planned, deadline),
        PLOTS["durations"]: durations_svg(rows),
        PLOTS["failures"]: failures_svg(rows),
    }
    return {name: svg for name, svg in drawn.items() if svg}
