"""avsim rerun-failed's manifest: only the failed cases, the same pins unless a new build is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from avsim.artifacts import RunLayout
from avsim.contracts.week import ShardSummary
from avsim.dagbuild.factory import load_plan
from avsim.dagbuild.prepare import prepare_week
from avsim.errors import AvsimError
from avsim.ledger.store import Ledger
from avsim.manifest.sample import sample_manifest
from avsim.manifest.validation import validate_manifest
from avsim.phases.contract import Outcome
from avsim.rerun import plan_rerun, rerun_manifest
from avsim.settings import AvsimSettings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def run(tmp_path: Path) -> tuple[RunLayout, dict]:
    settings = AvsimSettings(shard_size=4, artifact_root=f"file://{tmp_path / 'artifacts'}")
    plan = load_plan(ROOT / "dags" / "avsim_graphs.yaml", settings)
    doc = sample_manifest(6)
    path = tmp_path / "week.json"
    path.write_text(json.dumps(doc))
    prepared = prepare_week(
        source=str(path), plan=plan, settings=settings, dag_id="avsim_weekly", run_id="w1"
    )
    layout = RunLayout(settings.resolved_artifact_root, prepared["run"]["run_key"])
    outcomes = ["passed", "infra_failed", "scenario_failed", "preempted", "passed", "bad_build"]
    ledger = Ledger(layout)
    for shard, cases, outs in ((1, doc["cases"][:4], outcomes[:4]), (2, doc["cases"][4:], outcomes[4:])):
        ledger.write_shard_summary(
            ShardSummary.model_validate(
                {
                    "shard": shard,
                    "cases": [{"case_id": c["id"], "outcome": o} for c, o in zip(cases, outs, strict=True)],
                }
            )
        )
    return layout, doc


def test_only_failed_cases_with_the_same_pins(run: tuple[RunLayout, dict]) -> None:
    layout, doc = run
    rerun, ids = rerun_manifest(layout)
    assert ids == [doc["cases"][i]["id"] for i in (1, 3, 5)]  # infra_failed, preempted, bad_build
    original = {c["id"]: c for c in doc["cases"]}
    for case in rerun["cases"]:
        o = original[case["id"]]
        assert (case["seed"], case["scenario"], case["parameters"]) == (
            o["seed"],
            o["scenario"],
            o["parameters"],
        )
    assert rerun["run"]["build"] == doc["run"]["build"] and rerun["run"]["rerun_of"] == layout.run_key
    assert rerun["graphs"] == validate_manifest(doc).model_dump(mode="json", by_alias=True)["graphs"]
    validate_manifest(rerun)


def test_a_new_build_is_named_explicitly(run: tuple[RunLayout, dict]) -> None:
    layout, doc = run
    image = "registry.example.com/avsim/simulator@sha256:" + "f" * 64
    plan, rerun = plan_rerun(layout, image=image, build_id="sim-fix-1")
    assert plan.new_build and rerun["run"]["build"] == {"build_id": "sim-fix-1", "image": image}
    assert plan.manifest_uri.startswith(f"{layout.root}/reruns/{layout.run_key}/") and plan.run_id.startswith(
        "rerun__"
    )
    with pytest.raises(AvsimError, match="the run's own build"):
        rerun_manifest(layout, image=doc["run"]["build"]["image"])
    with pytest.raises(AvsimError, match="--build IMAGE"):
        rerun_manifest(layout, build_id="x")
    with pytest.raises(Exception, match="not pinned by digest"):
        plan_rerun(layout, image="registry.example.com/avsim/simulator:latest")


def test_nothing_to_rerun_is_said(tmp_path: Path, run: tuple[RunLayout, dict]) -> None:
    layout, _ = run
    ledger = Ledger(layout)
    for k in (1, 2):
        s = ledger.shard_summaries()[k - 1]
        passed = tuple(c.model_copy(update={"outcome": Outcome.PASSED}) for c in s.cases)
        ledger.write_shard_summary(s.model_copy(update={"cases": passed}))
    with pytest.raises(AvsimError, match="no failed case"):
        rerun_manifest(layout)
    with pytest.raises(AvsimError, match="no manifest snapshot"):
        rerun_manifest(RunLayout(layout.root, "never-ran"))
    import shutil

    shutil.rmtree(Path(layout.ledger.removeprefix("file://")) / "shards")
    with pytest.raises(AvsimError, match="no shard summaries"):
        rerun_manifest(layout)
