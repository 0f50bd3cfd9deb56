"""The avsim plugin registers itself from the installed package, once, whatever the plugins folder holds.

Airflow's plugin manager runs in a subprocess here, as ``airflow plugins`` runs it, on the installed
distribution's metadata (its entry points and provider info): no plugin file is copied anywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from avsim.get_provider_info import get_provider_info

ROOT = Path(__file__).resolve().parents[2]
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
#: Prints the plugins Airflow loaded and the plugin import errors it recorded, as JSON.
PROBE = (
    "import json; from airflow import plugins_manager as pm; plugins, errors = pm._get_plugins(); "
    "print('PLUGINS', json.dumps({'names': [p.name for p in plugins], 'errors': errors}))"
)


def _env(home: Path, plugins_folder: Path, lazy_discover_providers: bool) -> dict[str, str]:
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins_folder),
        "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": str(lazy_discover_providers),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
    }


def _loaded(env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("PLUGINS "))
    return dict(json.loads(line.removeprefix("PLUGINS ")))


def test_the_installed_package_declares_its_plugin_twice_over() -> None:
    """The provider info (read when providers are discovered eagerly) and an entry point (always)."""
    assert get_provider_info()["plugins"] == [{"name": "avsim", "plugin-class": "avsim.plugin.AvsimPlugin"}]
    found = [(e.name, e.value) for e in entry_points(group="airflow.plugins") if e.module == "avsim.plugin"]
    assert found == [("avsim", "avsim.plugin:ENTRY_POINT")], (
        'pyproject.toml declares [project.entry-points."airflow.plugins"] avsim = "avsim.plugin:ENTRY_POINT"; '
        "reinstall the package (make install) after changing it"
    )


def test_airflow_plugins_lists_avsim_once_from_an_empty_plugins_folder(tmp_path: Path) -> None:
    """What a deployment that installed the package sees, with Airflow's default settings."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    done = subprocess.run(
        [AIRFLOW, "plugins", "-o", "json"],
        env=_env(tmp_path, folder, True),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    listed = json.loads(done.stdout[done.stdout.index("[") :])
    avsim = [p for p in listed if p["name"] == "avsim"]
    assert len(avsim) == 1
    assert "avsim-progress" in json.dumps(avsim[0]["external_views"])
    assert "avsim.priority" in json.dumps(avsim[0]["priority_weight_strategies"])


@pytest.mark.parametrize(
    ("folder", "lazy"),
    [("empty", False), ("repo", True), ("repo", False)],
    ids=["eager-providers", "repo-plugins-folder", "repo-plugins-folder-eager-providers"],
)
def test_the_plugin_loads_once_without_an_import_error(tmp_path: Path, folder: str, lazy: bool) -> None:
    """Eager provider discovery reads the provider info: the entry point stands aside. The repo's own
    plugins folder (the tests' and the demo's) holds no copy of the plugin that would be a second one."""
    plugins = ROOT / "plugins" if folder == "repo" else tmp_path / "plugins"
    plugins.mkdir(exist_ok=True)
    loaded = _loaded(_env(tmp_path, plugins, lazy))
    assert loaded == {"names": ["avsim"], "errors": {}}
