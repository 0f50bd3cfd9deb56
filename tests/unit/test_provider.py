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


def _provider_modules() -> list[str]:
    """Every module of the avsim package, found by walking its files (triggers/ is a namespace
    package, which pkgutil.walk_packages would skip)."""
    from pathlib import Path

    import avsim

    root = Path(avsim.__file__).resolve().parent
    return sorted(
        ".".join(("avsim", *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        for p in root.rglob("*.py")
        if p.name != "__main__.py"
    )


def test_provider_info_lists_every_operator_sensor_trigger_hook_and_link_present() -> None:
    import inspect

    from airflow.sdk import BaseHook, BaseOperator, BaseOperatorLink, BaseSensorOperator
    from airflow.triggers.base import BaseTrigger

    kinds = (
        ("sensors", BaseSensorOperator),  # before operators: a sensor is an operator too
        ("operators", BaseOperator),
        ("triggers", BaseTrigger),
        ("hooks", BaseHook),
    )
    found: dict[str, set[str]] = {kind: set() for kind, _ in kinds}
    links: set[str] = set()
    for name in _provider_modules():
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if not inspect.isclass(obj) or obj.__module__ != name:
                continue
            if issubclass(obj, BaseOperatorLink):
                links.add(f"{name}.{obj.__qualname__}")
            for kind, base in kinds:
                if issubclass(obj, base):
                    found[kind].add(name)
                    break
    info = get_provider_info()
    listed = {kind: {m for entry in info.get(kind, []) for m in entry["python-modules"]} for kind, _ in kinds}
    assert listed == found
    assert set(info["extra-links"]) == links
    # The walk found what this provider is known to have (a broken walk must not pass vacuously).
    assert {"avsim.triggers.phase_pod", "avsim.triggers.canary", "avsim.triggers.shard_run"} <= found[
        "triggers"
    ]
    assert "avsim.sensors.canary_gate" in found["sensors"]
    assert "avsim.operators.kubernetes" in found["operators"]
    assert "avsim.links.AvsimArtifactsLink" in links
    # Every listed module and class imports.
    from airflow.sdk.module_loading import import_string

    for kind, _ in kinds:
        for module in listed[kind]:
            importlib.import_module(module)
    for path in info["extra-links"]:
        import_string(path)
    for conn in info["connection-types"]:
        hook = import_string(conn["hook-class-name"])
        assert hook.conn_type == conn["connection-type"]


def test_configuration_is_read_one_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only settings.airflow_config reads Airflow's configuration; everything else asks it."""
    import re
    from pathlib import Path

    import avsim
    from avsim.links import _base_path
    from avsim.settings import airflow_config

    root = Path(avsim.__file__).resolve().parent
    reads = re.compile(r"from airflow(\.sdk)?\.configuration import|airflow(\.sdk)?\.configuration\.conf")
    readers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if reads.search(p.read_text()))
    assert readers == ["settings.py"]

    monkeypatch.setenv("AIRFLOW__AVSIM__SHARD_SIZE", "17")
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/team-a/")
    assert airflow_config("avsim", "shard_size", "250") == "17"
    assert load_settings().shard_size == 17
    assert airflow_config("avsim", "no_such_option", "fallback") == "fallback"
    # links.py reads the UI's base path through it.
    assert _base_path() == "/team-a"


def test_the_plugin_registers_the_phase_link_the_operators_declare() -> None:
    """The API server knows the phases' link through the plugin; the link lives in avsim.links (below the
    pages, docs/design.md "Layers"), and its class name is the XCom key under which every phase already
    stored its URL, so it must not change when the module moves."""
    from avsim.links import PHASE_LINKS, AvsimArtifactsLink
    from avsim.operators.kubernetes import KubernetesPhaseOperator
    from avsim.operators.phase import LocalPhaseOperator
    from avsim.plugin import AvsimPlugin

    [registered] = AvsimPlugin.operator_extra_links
    assert type(registered) is AvsimArtifactsLink and AvsimArtifactsLink.__module__ == "avsim.links"
    assert [link.xcom_key for link in PHASE_LINKS] == ["_link_AvsimArtifactsLink"]
    assert {link.name for link in LocalPhaseOperator.operator_extra_links} == {registered.name}
    assert KubernetesPhaseOperator.operator_extra_links == LocalPhaseOperator.operator_extra_links
