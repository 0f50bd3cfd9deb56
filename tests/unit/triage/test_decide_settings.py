"""``[avsim] triage_gpu_share``, ``triage_reruns``, ``determinism_sample``: declared, read, checked."""

from __future__ import annotations

import pytest

from avsim.errors import ConfigError
from avsim.get_provider_info import get_provider_info
from avsim.settings import OPTIONS, TriageSettings, load_settings
from avsim.triage import decide
from avsim.triage.decide import Candidate, RerunCost, audit_sample, fit_budget

KEYS = ("triage_gpu_share", "triage_reruns", "determinism_sample")


def test_the_defaults_are_declared_once_and_published() -> None:
    options = get_provider_info()["config"]["avsim"]["options"]
    published = {k: options[k]["default"] for k in KEYS}
    assert published == {"triage_gpu_share": "0.02", "triage_reruns": "2", "determinism_sample": "0.005"}
    defaults = TriageSettings()
    assert (defaults.gpu_share, defaults.reruns, defaults.determinism_sample) == (0.02, 2, 0.005)
    declared = (defaults.gpu_share, defaults.reruns, defaults.determinism_sample)
    assert [OPTIONS[k][0] for k in KEYS] == [str(v) for v in declared]
    assert (decide.GPU_SHARE, decide.RERUNS, decide.AUDIT_SHARE) == (0.02, 2, 0.005)
    assert load_settings().triage == defaults


def test_the_environment_sets_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__AVSIM__TRIAGE_GPU_SHARE", "0.05")
    monkeypatch.setenv("AIRFLOW__AVSIM__TRIAGE_RERUNS", "3")
    monkeypatch.setenv("AIRFLOW__AVSIM__DETERMINISM_SAMPLE", "0")
    assert load_settings().triage == TriageSettings(gpu_share=0.05, reruns=3, determinism_sample=0.0)
    monkeypatch.setenv("AIRFLOW__AVSIM__TRIAGE_RERUNS", "two")
    with pytest.raises(ConfigError, match="wrong type"):
        load_settings()


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"gpu_share": 2.0}, r"triage_gpu_share = 2.0; use a share in \[0, 1\]"),
        ({"gpu_share": float("nan")}, "triage_gpu_share = nan"),
        ({"reruns": 0}, "triage_reruns = 0; use 1..10"),
        ({"determinism_sample": -0.1}, "determinism_sample = -0.1"),
    ],
)
def test_values_out_of_range_are_refused_naming_the_option(values: dict[str, float], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        TriageSettings(**values)  # type: ignore[arg-type]


def test_a_zero_share_turns_triage_and_the_audit_off() -> None:
    found = [Candidate(case_id="c", graph="g", failing_phase="evaluate")]
    cpu_only = {"c": RerunCost(gpu_seconds=0, wall_seconds=60)}
    decision = fit_budget(found, cpu_only, week_gpu_seconds=10**6, seconds_left=10**6, share=0)
    assert decision.chosen == ()
    assert [c.reason for c in decision.not_triaged] == ["[avsim] triage_gpu_share is 0: triage is off"]
    assert fit_budget(found, cpu_only, week_gpu_seconds=10**6, seconds_left=10**6).chosen == tuple(found)
    assert audit_sample([f"p{i}" for i in range(100)], "2026-W50", share=0) == ()
