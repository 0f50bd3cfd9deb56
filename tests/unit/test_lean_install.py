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
from tests.unit.test_report_files import build, layout, read  # noqa: F401 - the fixture

from avsim.artifacts import RunLayout
from avsim.errors import AvsimError
from avsim.report.build import write_report


def _absent(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    for name in [n for n in sys.modules if n == package or n.startswith(f"{package}.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)


def test_the_report_without_matplotlib_has_every_file_but_the_plots_and_says_why(
    layout: RunLayout,  # noqa: F811
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
