"""A realistic, deterministic sample weekly manifest (for the demo, tests and benchmarks).

Three graph families share their phase graphs across cases: ``standard`` (~60%), ``with_render``
(~25%: render[gpu] after simulate, report after both) and ``perception`` (~15%). Every phase runs
``avsim-fakesim`` for its estimated duration times ``time_scale``; only simulate and perceive carry the
scenario-failure and crash rates; a run-level ``weekly_summary`` runs after every case. On request (the
demo) the retry delays are scaled with the phases, to at least a second. The same arguments always
give the same document.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

from avsim.manifest.deadline import iso_week_of, week_start

#: (category, scenario, simulate-duration factor, ego speed range in km/h, weather choices)
SCENARIOS: tuple[tuple[str, str, float, tuple[int, int], tuple[str, ...]], ...] = (
    ("highway", "cut-in", 0.8, (80, 130), ("clear", "overcast", "rain")),
    ("highway", "merge", 0.9, (70, 120), ("clear", "overcast", "rain")),
    ("highway", "lane-drop", 0.7, (80, 120), ("clear", "overcast")),
    ("highway", "stopped-vehicle", 0.6, (90, 130), ("clear", "fog")),
    ("urban", "unprotected-left", 1.2, (20, 50), ("clear", "overcast", "rain")),
    ("urban", "pedestrian-crossing", 1.1, (15, 50), ("clear", "overcast", "rain")),
    ("urban", "roundabout", 1.3, (20, 40), ("clear", "overcast")),
    ("urban", "construction-zone", 1.5, (10, 40), ("clear", "overcast", "dust")),
    ("urban", "double-parked", 1.0, (15, 40), ("clear", "overcast")),
    ("suburban", "school-zone", 1.0, (15, 30), ("clear", "overcast")),
    ("suburban", "cyclist-overtake", 0.9, (30, 60), ("clear", "overcast")),
    ("weather", "night-rain", 1.4, (30, 90), ("rain", "heavy-rain")),
    ("weather", "fog-bank", 1.2, (40, 100), ("fog",)),
    ("parking", "reverse-out", 0.5, (3, 10), ("clear", "overcast")),
)
TRAFFIC = ("low", "medium", "high")
#: (graph, cumulative share)
GRAPH_MIX = (("standard", 0.60), ("with_render", 0.85), ("perception", 1.0))

# phase kind -> (resource class, gpus, cpus, memory, estimated seconds, timeout seconds, retries, checkpoint)
_PHASES: dict[str, tuple[str, int, float, str, float, float, int, bool]] = {
    "prepare": ("cpu", 0, 2, "4Gi", 180, 600, 2, False),
    "simulate": ("gpu", 1, 8, "32Gi", 1800, 5400, 3, True),
    "perceive": ("gpu", 1, 8, "24Gi", 1200, 3600, 3, True),
    "evaluate": ("cpu", 0, 2, "8Gi", 300, 900, 2, False),
    "render": ("gpu", 1, 4, "16Gi", 600, 1800, 2, False),
    "report": ("cpu", 0, 1, "2Gi", 60, 300, 2, False),
}
_DRIVING = frozenset({"simulate", "perceive"})
_GRAPHS: dict[str, tuple[str, tuple[tuple[str, tuple[str, ...]], ...]]] = {
    "standard": (
        "prepare -> simulate -> evaluate -> report",
        (("prepare", ()), ("simulate", ("prepare",)), ("evaluate", ("simulate",)), ("report", ("evaluate",))),
    ),
    "with_render": (
        "prepare -> simulate -> evaluate -> report, with render after simulate",
        (
            ("prepare", ()),
            ("simulate", ("prepare",)),
            ("evaluate", ("simulate",)),
            ("render", ("simulate",)),
            ("report", ("evaluate", "render")),
        ),
    ),
    "perception": (
        "prepare -> perceive -> evaluate -> report",
        (("prepare", ()), ("perceive", ("prepare",)), ("evaluate", ("perceive",)), ("report", ("evaluate",))),
    ),
}


def current_iso_week(now: dt.datetime | None = None) -> str:
    return iso_week_of(now or dt.datetime.now(dt.UTC))


def open_iso_week(now: dt.datetime | None = None) -> str:
    """This week, or next week once this week's deadline (Sunday 18:00 UTC) has passed: the sample's
    default week, so that a sample written on a Sunday evening can still be run."""
    now = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    if now.isoweekday() == 7 and now.time() >= dt.time(18, 0):
        return iso_week_of(now + dt.timedelta(days=1))
    return iso_week_of(now)


def _fmt(x: float) -> str:
    return f"{x:.6g}"


#: The retry delays a sample week compresses (``RetrySpec``'s fields; their defaults are the start).
RETRY_DELAYS = ("delay_seconds", "max_delay_seconds", "preemption_delay_seconds")


def _retry(infrastructure: int, time_scale: float) -> dict[str, Any]:
    """A phase's retry rules: its infrastructure budget, and the default delays at ``time_scale``."""
    rules: dict[str, Any] = {"infrastructure": infrastructure}
    if time_scale < 1:
        from avsim.manifest.models import RetrySpec

        for key in RETRY_DELAYS:
            rules[key] = round(max(1.0, float(RetrySpec.model_fields[key].default) * time_scale), 3)
    return rules


def _phase(
    kind: str, deps: tuple[str, ...], time_scale: float, fail: float, crash: float, retry_scale: float
) -> dict[str, Any]:
    rc, gpus, cpus, memory, estimate, timeout, retries, checkpoint = _PHASES[kind]
    args = [kind, "--duration", _fmt(estimate * time_scale)]
    if kind in _DRIVING:
        args += ["--scenario-fail-rate", _fmt(fail), "--crash-rate", _fmt(crash)]
    phase: dict[str, Any] = {}
    if deps:
        phase["depends_on"] = list(deps)
    phase["resources"] = {"class": rc, "gpus": gpus, "cpus": cpus, "memory": memory}
    phase["estimated_duration_seconds"] = estimate
    phase["timeout_seconds"] = timeout
    phase["retry"] = _retry(retries, retry_scale)
    if checkpoint:
        phase["checkpoint"] = True
    if rc == "gpu":
        # Simulators use shared memory; label the pods for the platform team's dashboards.
        phase["pod"] = {"shm_size": "2Gi", "labels": {"team": "simulation"}}
    phase["command"] = ["avsim-fakesim"]
    phase["args"] = args
    return phase


def sample_manifest(
    cases: int,
    *,
    seed: int = 7,
    time_scale: float = 0.001,
    iso_week: str | None = None,
    deadline: dt.datetime | None = None,
    scenario_fail_rate: float = 0.03,
    crash_rate: float = 0.0,
    canary: dict[str, Any] | None = None,
    breaker: dict[str, Any] | None = None,
    compress_retry_delays: bool = False,
) -> dict[str, Any]:
    """A weekly manifest of ``cases`` cases, valid under :func:`~avsim.manifest.validation.validate_manifest`.

    The week is ``iso_week``, else ``deadline``'s week, else :func:`open_iso_week`; the deadline is
    ``deadline``, else the week's Sunday 18:00 UTC.
    ``canary`` and ``breaker`` set ``run.canary`` / ``run.breaker`` (the manifest's defaults otherwise).
    ``compress_retry_delays=True`` compresses the retry delays with the phases (the demo's week);
    by default they are the manifest's defaults, as a real week's are (``avsim manifest sample`` writes
    this document as a starting point, and the deployed graph catalog is cut from it).
    """
    if cases < 1:
        raise ValueError(f"cases must be at least 1, got {cases}")
    if time_scale <= 0:
        raise ValueError(f"time_scale must be positive, got {time_scale}")
    for label, rate in (("scenario_fail_rate", scenario_fail_rate), ("crash_rate", crash_rate)):
        if not 0 <= rate <= 1:
            raise ValueError(f"{label} must be between 0 and 1, got {rate}")
    retry_scale = time_scale if compress_retry_delays else 1.0
    if deadline is not None:
        if deadline.tzinfo is None:
            raise ValueError(f"deadline {deadline.isoformat()} has no time zone; give it one (UTC)")
        deadline = deadline.astimezone(dt.UTC)
    week = iso_week or (iso_week_of(deadline) if deadline else open_iso_week())
    monday = week_start(week)
    if monday is None:
        raise ValueError(f"iso_week {week!r} is not an ISO week; write it like '2026-W49'")
    if deadline is None:  # the week's Sunday, 18:00 UTC
        deadline = monday + dt.timedelta(days=6, hours=18)
    digest = hashlib.sha256(f"avsim-simulator-build:{seed}".encode()).hexdigest()

    graphs = {
        name: {
            "description": description,
            "phases": {
                kind: _phase(kind, deps, time_scale, scenario_fail_rate, crash_rate, retry_scale)
                for kind, deps in phases
            },
        }
        for name, (description, phases) in _GRAPHS.items()
    }
    rng = random.Random(seed)
    rand, randrange, choice = rng.random, rng.randrange, rng.choice
    out_cases: list[dict[str, Any]] = []
    for n in range(1, cases + 1):
        r = rand()
        graph = next(g for g, cut in GRAPH_MIX if r < cut)
        category, scenario, factor, (lo, hi), weathers = choice(SCENARIOS)
        weather = choice(weathers)
        tags = [category, scenario]
        if scenario == "night-rain":
            tags.append("night")
        if graph != "standard":
            tags.append(graph)
        out_cases.append(
            {
                "id": f"case-{n:05d}",
                "graph": graph,
                "scenario": {
                    "uri": f"s3://avsim-scenarios/{category}/{scenario}/{randrange(1, 5000):06d}.json",
                    "version": "v3",
                },
                "seed": randrange(2**31),
                "parameters": {
                    "ego_speed_kph": randrange(lo, hi + 1),
                    "weather": weather,
                    "traffic_density": choice(TRAFFIC),
                    "sim_duration_factor": round(factor * (0.85 + 0.3 * rand()), 2),
                },
                "tags": tags,
            }
        )
    summary = {
        "resources": {"class": "cpu", "gpus": 0, "cpus": 2, "memory": "8Gi"},
        "estimated_duration_seconds": 600,
        "timeout_seconds": 3600,
        "retry": _retry(2, retry_scale),
        "command": ["avsim-fakesim"],
        "args": ["summary", "--duration", _fmt(600 * time_scale)],
    }
    run: dict[str, Any] = {
        "name": "weekly_regression",
        "iso_week": week,
        "run_class": "weekly",
        "deadline": deadline.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "build": {
            "build_id": f"sim-{week[:4]}.{week[6:]}.1",
            "image": f"registry.example.com/avsim/simulator@sha256:{digest}",
        },
    }
    if canary is not None:
        run["canary"] = dict(canary)
    if breaker is not None:
        run["breaker"] = dict(breaker)
    return {
        "apiVersion": "avsim/v1",
        "run": run,
        "graphs": graphs,
        "cases": out_cases,
        "run_phases": {"weekly_summary": summary},
    }


def write_sample(
    path: str | os.PathLike[str], *, max_cases: int | None = None, max_bytes: int | None = None, **kw: Any
) -> Path:
    """Write :func:`sample_manifest` (``**kw``) as YAML (``.yaml``/``.yml``) or JSON (``.json``).

    ``max_cases`` / ``max_bytes``: the limits the validator applies (``[avsim] max_manifest_cases`` /
    ``max_manifest_bytes``); a sample above either is refused and nothing is written.
    """
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in (".json", ".yaml", ".yml"):
        raise ValueError(f"cannot tell the format of {target}: name it .yaml, .yml or .json")
    cases = kw.get("cases", 0)
    if max_cases is not None and cases > max_cases:
        raise ValueError(
            f"--cases {cases} is above [avsim] max_manifest_cases ({max_cases}), so validate would refuse "
            "the file; ask for fewer cases or raise the setting"
        )
    doc = sample_manifest(**kw)
    if suffix == ".json":
        text = json.dumps(doc, indent=1) + "\n"
    else:
        import yaml

        base = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

        class _NoAliases(base):  # type: ignore[misc, valid-type]
            def ignore_aliases(self, data: Any) -> bool:
                return True

        text = yaml.dump(doc, Dumper=_NoAliases, sort_keys=False, width=120)
    size = len(text.encode("utf-8"))
    if max_bytes is not None and size > max_bytes:
        raise ValueError(
            f"the sample would be {size} bytes, above [avsim] max_manifest_bytes ({max_bytes}), so validate "
            "would refuse it; ask for fewer cases or raise the setting. Nothing was written"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return target
