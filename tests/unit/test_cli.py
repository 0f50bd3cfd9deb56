"""The avsim command: sample, validate and catalog write, through typer's runner (the real functions)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from avsim.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_sample_then_validate_against_the_deployed_catalog(tmp_path: Path) -> None:
    out = tmp_path / "week.yaml"
    done = runner.invoke(app, ["manifest", "sample", "--cases", "25", "--out", str(out)])
    assert done.exit_code == 0, done.output
    checked = runner.invoke(
        app, ["manifest", "validate", str(out), "--catalog", str(ROOT / "dags" / "avsim_graphs.yaml")]
    )
    assert checked.exit_code == 0, checked.output
    assert "valid. 25 cases" in checked.output and "families:" in checked.output


def test_validate_prints_every_problem_and_fails(tmp_path: Path) -> None:
    from avsim.manifest.sample import sample_manifest

    doc = sample_manifest(5)
    doc["cases"][3]["graph"] = "perception_v2"
    doc["cases"][1]["seed"] = "12"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    done = runner.invoke(app, ["manifest", "validate", str(bad)])
    assert done.exit_code == 1
    assert "cases[3].graph: unknown graph 'perception_v2'" in done.output
    assert "cases[1].seed" in done.output


def test_catalog_write_reproduces_the_deployed_catalog(tmp_path: Path) -> None:
    out = tmp_path / "graphs.yaml"
    assert runner.invoke(app, ["catalog", "write", str(out)]).exit_code == 0
    assert out.read_text() == (ROOT / "dags" / "avsim_graphs.yaml").read_text()
