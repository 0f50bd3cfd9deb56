"""Provider metadata and the [avsim] settings."""

from __future__ import annotations

import importlib

import pytest

from avsim.errors import ConfigError
from avsim.get_provider_info import get_provider_info
from avsim.settings import OPTIONS, AvsimSettings, load_settings


def test_provider_info_names_importable_modules_and_config() -> None:
    info = get_provider_info()
    assert info["package-name"] == "airflow-provider-avsim"
    for kind in ("operators", "sensors", "triggers"):
        for entry in info.get(kind, []):
            for module in entry["python-modules"]:
                importlib.import_module(module)
    options = info["config"]["avsim"]["options"]
    assert set(options) == set(OPTIONS)
    assert options["shard_size"]["default"] == str(AvsimSettings().shard_size)
    assert options["max_active_shards"]["default"] == str(AvsimSettings().max_active_shards)


def test_settings_defaults_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__AVSIM__SHARD_SIZE", "40")
    monkeypatch.setenv("AIRFLOW__AVSIM__MAX_ACTIVE_SHARDS", "3")
    s = load_settings()
    assert (s.shard_size, s.max_active_shards, s.backend) == (40, 3, "local")
    assert s.resolved_artifact_root.startswith("file://")
    monkeypatch.setenv("AIRFLOW__AVSIM__SHARD_SIZE", "many")
    with pytest.raises(ConfigError, match="wrong type"):
        load_settings()
    with pytest.raises(ConfigError, match="backend"):
        AvsimSettings(backend="slurm")


def test_test_modules_have_unique_basenames() -> None:
    """pytest's default import mode imports a test module by its basename: two files with the
    same name in tests/unit and tests/integration stop the whole collection (a CI run did)."""
    from collections import Counter
    from pathlib import Path

    tests = Path(__file__).resolve().parents[1]
    rootless = [p for p in tests.rglob("test_*.py") if not (p.parent / "__init__.py").exists()]
    names = Counter(p.name for p in rootless)
    assert [n for n, k in names.items() if k > 1] == []
