"""The core install without its extras: the report without matplotlib, the service role without FAB.

A deployment that installs ``airflow-provider-avsim`` without ``[report]`` or ``[fab]`` has no
matplotlib or FAB provider; here they are made unimportable (``sys.modules[name] = None``, which
is what Python's import system does for an absent package), the honest boundary for "not installed".
The install tier (tests/install) runs a week on a real core-only install.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tests.support.report_week import build, read, week_layout

from avsim.artifacts import RunLayout
from avsim.errors import AvsimError
from avsim.report.build import write_report


@pytest.fixture
def layout(tmp_path: Path) -> RunLayout:
    return week_layout(tmp_path)


def _absent(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    for name in [n for n in sys.modules if n == package or n.startswith(f"{package}.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)


def test_the_report_without_matplotlib_has_every_file_but_the_plots_and_says_why(
    layout: RunLayout,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _absent(monkeypatch, "matplotlib")
    uris = write_report(layout, build())
    assert set(uris) == {"csv", "html", "json"}
    folder = Path(layout.report_dir.removeprefix("file://"))
    assert sorted(p.name for p in folder.iterdir()) == ["cases.csv", "report.html", "report.json"]
    html = read(uris["html"])
    assert "airflow-provider-avsim[report]" in html
    assert "no phase has finished yet" not in html


def test_the_service_role_without_the_fab_provider_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from avsim.service_role import sync_role

    _absent(monkeypatch, "airflow.providers.fab")
    with pytest.raises(AvsimError, match=r"FAB auth manager.*airflow-provider-avsim\[fab\]"):
        sync_role("avsim-service", [])


def test_the_planners_plot_without_matplotlib_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from avsim.planner.plot import write_progress_plot

    _absent(monkeypatch, "matplotlib")
    with pytest.raises(AvsimError, match=r"matplotlib.*airflow-provider-avsim\[report\]"):
        write_progress_plot(None, tmp_path / "plan.png")  # type: ignore[arg-type]
    assert not (tmp_path / "plan.png").exists()


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    import zipfile

    from hatchling.builders.wheel import WheelBuilder

    root = Path(__file__).resolve().parents[2]
    (built,) = WheelBuilder(str(root)).build(
        directory=str(tmp_path_factory.mktemp("wheel")), versions=["standard"]
    )
    with zipfile.ZipFile(built) as zf:
        return {n: zf.read(n).decode("utf-8", "replace") for n in zf.namelist() if not n.endswith(".pyc")}


def test_the_core_requires_neither_celery_fab_nor_matplotlib_and_ranges_airflow(
    wheel_files: dict[str, str],
) -> None:
    metadata = next(text for name, text in wheel_files.items() if name.endswith(".dist-info/METADATA"))
    requires = [
        line.removeprefix("Requires-Dist: ")
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist: ")
    ]
    core = [r for r in requires if "extra ==" not in r]
    assert "apache-airflow<3.4,>=3.3.0" in core
    assert not [r for r in core if "==" in r], "the core pins nothing"
    for package in ("apache-airflow-providers-celery", "apache-airflow-providers-fab", "matplotlib"):
        assert not [r for r in core if r.startswith(package)], package
        assert [r for r in requires if r.startswith(package) and "extra ==" in r], f"{package} is an extra"
    assert "License-Expression: Apache-2.0" in metadata


def test_the_wheel_carries_the_license_and_the_sample_catalogs(wheel_files: dict[str, str]) -> None:
    licenses = [n for n in wheel_files if n.endswith("/LICENSE") and ".dist-info/" in n]
    assert licenses and "Apache License" in wheel_files[licenses[0]]
    assert "apiVersion: avsim/v1" in wheel_files["avsim/catalogs/avsim_graphs.yaml"]
    assert "kind: Capacity" in wheel_files["avsim/catalogs/avsim_capacity.yaml"]
