"""sample_manifest: realistic, valid, deterministic, fast."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from avsim.manifest.loader import load_manifest
from avsim.manifest.models import ResourceClass
from avsim.manifest.sample import current_iso_week, open_iso_week, sample_manifest, write_sample
from avsim.manifest.validation import validate_manifest


def test_small_sample_is_valid_and_has_three_graph_families() -> None:
    m = validate_manifest(sample_manifest(10, iso_week="2026-W49"))
    assert list(m.graphs) == ["standard", "with_render", "perception"]
    assert [c.id for c in m.cases] == [f"case-{n:05d}" for n in range(1, 11)]
    assert list(m.run_phases) == ["weekly_summary"]
    assert m.run.name == "weekly_regression" and m.run.run_class.value == "weekly"
    assert m.run.build.build_id == "sim-2026.49.1"
    assert m.run.deadline == dt.datetime(2026, 12, 6, 18, tzinfo=dt.UTC)  # Sunday of 2026-W49


def test_graph_shapes() -> None:
    m = validate_manifest(sample_manifest(1, iso_week="2026-W49"))
    shapes = {
        name: {p: (tuple(s.depends_on), s.resources.resource_class) for p, s in g.phases.items()}
        for name, g in m.graphs.items()
    }
    cpu, gpu = ResourceClass.CPU, ResourceClass.GPU
    assert shapes["standard"] == {
        "prepare": ((), cpu),
        "simulate": (("prepare",), gpu),
        "evaluate": (("simulate",), cpu),
        "report": (("evaluate",), cpu),
    }
    assert shapes["with_render"]["render"] == (("simulate",), gpu)
    assert shapes["with_render"]["report"] == (("evaluate", "render"), cpu)
    assert shapes["perception"]["perceive"] == (("prepare",), gpu)
    sim = m.graphs["standard"].phases["simulate"]
    assert sim.checkpoint and sim.resources.gpus == 1 and sim.retry.infrastructure == 3
    assert sim.estimated_duration_seconds == 1800 and sim.timeout_seconds == 5400


def test_phase_commands_drive_the_fake_simulator() -> None:
    doc = sample_manifest(1, time_scale=0.01, scenario_fail_rate=0.1, crash_rate=0.05, iso_week="2026-W49")
    for graph in doc["graphs"].values():
        for kind, phase in graph["phases"].items():
            assert phase["command"] == ["avsim-fakesim"]
            args = phase["args"]
            assert args[0] == kind and args[1] == "--duration"
            assert float(args[2]) == pytest.approx(phase["estimated_duration_seconds"] * 0.01)
            if kind in ("simulate", "perceive"):
                assert args[3:] == ["--scenario-fail-rate", "0.1", "--crash-rate", "0.05"]
            else:
                assert len(args) == 3
    assert doc["run_phases"]["weekly_summary"]["args"] == ["summary", "--duration", "6"]


def test_fake_simulator_accepts_the_arguments() -> None:
    from avsim.devstack.fakesim import parser

    doc = sample_manifest(1, iso_week="2026-W49")
    for graph in doc["graphs"].values():
        for phase in graph["phases"].values():
            parser().parse_args(phase["args"])
    parser().parse_args(doc["run_phases"]["weekly_summary"]["args"])


def test_mixture_cases_and_determinism() -> None:
    doc = sample_manifest(2000, seed=11, iso_week="2026-W49")
    mix = Counter(c["graph"] for c in doc["cases"])
    assert 0.55 < mix["standard"] / 2000 < 0.65
    assert 0.20 < mix["with_render"] / 2000 < 0.30
    assert 0.10 < mix["perception"] / 2000 < 0.20
    case = doc["cases"][0]
    assert case["scenario"]["uri"].startswith("s3://avsim-scenarios/") and case["scenario"]["version"] == "v3"
    assert set(case["parameters"]) == {"ego_speed_kph", "weather", "traffic_density", "sim_duration_factor"}
    assert all(isinstance(c["seed"], int) for c in doc["cases"])
    assert len({c["scenario"]["uri"].split("/")[4] for c in doc["cases"]}) > 10  # many scenario types
    assert sample_manifest(2000, seed=11, iso_week="2026-W49") == doc
    other = sample_manifest(2000, seed=12, iso_week="2026-W49")
    assert other["cases"] != doc["cases"]
    assert other["run"]["build"]["image"] != doc["run"]["build"]["image"]


def test_default_week_is_the_open_iso_week() -> None:
    """This week until its deadline (Sunday 18:00 UTC), then next week: the test itself ran red on a
    Sunday evening when it compared with the calendar's week."""
    doc = sample_manifest(1)
    assert doc["run"]["iso_week"] in {open_iso_week(), open_iso_week(dt.datetime.now(dt.UTC))}
    assert current_iso_week(dt.datetime(2027, 1, 1, tzinfo=dt.UTC)) == "2026-W53"
    sunday = dt.datetime(2026, 12, 6, tzinfo=dt.UTC)  # 2026-W49's last day
    assert open_iso_week(sunday.replace(hour=17, minute=59)) == "2026-W49"
    assert open_iso_week(sunday.replace(hour=18)) == "2026-W50"
    assert open_iso_week(dt.datetime(2026, 12, 7, 9, tzinfo=dt.UTC)) == "2026-W50"


def test_a_deadline_brings_its_own_week() -> None:
    """A week due an hour from now on a Sunday evening is this calendar week, not the open one
    (three integration tests once set the week by hand and broke every Sunday after 18:00)."""
    sunday_evening = dt.datetime(2026, 12, 6, 19, 30, 15, 123456, tzinfo=dt.UTC)  # 2026-W49
    doc = sample_manifest(2, deadline=sunday_evening)
    assert doc["run"]["iso_week"] == "2026-W49"
    assert doc["run"]["deadline"] == "2026-12-06T19:30:15Z"
    assert validate_manifest(doc).run.iso_week == "2026-W49"
    # another zone: the deadline is written in UTC and its UTC week counts
    in_tokyo = dt.datetime(2026, 12, 7, 4, 30, tzinfo=dt.timezone(dt.timedelta(hours=9)))
    doc = sample_manifest(1, deadline=in_tokyo)
    assert (doc["run"]["iso_week"], doc["run"]["deadline"]) == ("2026-W49", "2026-12-06T19:30:00Z")
    # a week given outright still wins
    assert sample_manifest(1, iso_week="2026-W50", deadline=sunday_evening)["run"]["iso_week"] == "2026-W50"
    with pytest.raises(ValueError, match="no time zone"):
        sample_manifest(1, deadline=dt.datetime(2026, 12, 6, 19, 30))


@pytest.mark.parametrize(
    "kw", [{"cases": 0}, {"cases": 1, "iso_week": "2026-49"}, {"cases": 1, "crash_rate": 2}]
)
def test_bad_arguments(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        sample_manifest(**kw)  # type: ignore[arg-type]


def test_10000_cases_build_and_validate() -> None:
    # How long it takes is a bench's figure (docs/performance.md), never a test's assertion.
    assert len(validate_manifest(sample_manifest(10_000)).cases) == 10_000


@pytest.mark.parametrize("ext", ["yaml", "json"])
def test_write_sample(tmp_path: Path, ext: str) -> None:
    path = write_sample(tmp_path / "sub" / f"week.{ext}", cases=4, seed=3, iso_week="2026-W49")
    text = path.read_text()
    parsed = json.loads(text) if ext == "json" else yaml.safe_load(text)
    assert parsed == sample_manifest(4, seed=3, iso_week="2026-W49")
    assert "&id" not in text  # no YAML anchors for shared sub-objects
    assert load_manifest(path).case_count == 4


def test_write_sample_needs_a_known_extension(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"name it \.yaml, \.yml or \.json"):
        write_sample(tmp_path / "week.txt", cases=1)


def test_the_demo_week_compresses_its_retry_delays_with_its_phases() -> None:
    real = validate_manifest(sample_manifest(3, iso_week="2026-W49"))
    sim = real.graphs["standard"].phases["simulate"].retry
    assert (sim.delay_seconds, sim.max_delay_seconds, sim.preemption_delay_seconds) == (30, 1800, 10)

    demo = validate_manifest(sample_manifest(3, iso_week="2026-W49", compress_retry_delays=True))
    for spec in [p.retry for g in demo.graphs.values() for p in g.phases.values()] + [
        demo.run_phases["weekly_summary"].retry
    ]:
        # x 0.001, but never under a second: a retry stays a later try, not the same instant.
        assert (spec.delay_seconds, spec.max_delay_seconds, spec.preemption_delay_seconds) == (1.0, 1.8, 1.0)
    assert demo.graphs["standard"].phases["simulate"].retry.infrastructure == sim.infrastructure

    slow = validate_manifest(
        sample_manifest(3, iso_week="2026-W49", time_scale=0.1, compress_retry_delays=True)
    )
    assert slow.graphs["standard"].phases["simulate"].retry.delay_seconds == 3.0
    assert slow.graphs["standard"].phases["simulate"].retry.max_delay_seconds == 180.0
