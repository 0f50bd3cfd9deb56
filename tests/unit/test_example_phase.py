"""The example phase image's entrypoint (examples/phase-image/) follows the phase contract.

It runs as a local process, as the local backend runs any phase: a real ``LocalPhaseOperator`` on a
prepared week with a ``file://`` ledger launches it, watches its heartbeat against a short lease,
classes its exit code and checks its declared outputs before it commits (the checks a real simulator
image meets on either backend). The boundary, as in ``tests/unit/operators/test_lifecycle.py``:
Airflow's task instance is a stand-in holding the try number and the XCom table. Docker is not
needed: the test runs the same file the Dockerfile installs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.support.lifecycle import TaskInstance

from avsim.artifacts import RunLayout
from avsim.dagbuild import tasks
from avsim.dagbuild.factory import load_plan
from avsim.dagbuild.prepare import prepare_week
from avsim.ledger.store import Ledger
from avsim.manifest.sample import sample_manifest
from avsim.phases import contract
from avsim.phases.contract import Outcome
from avsim.settings import AvsimSettings

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "examples" / "phase-image" / "entrypoint.py"


def example_week(tmp_path: Path, *, steps: int = 30, step_seconds: float = 0.05) -> tuple[Any, Any, Ledger]:
    """A prepared 4-case week whose every phase runs the example entrypoint, with a 0.2 s heartbeat
    and a 1 s lease: a phase that stopped beating would be killed as ``lease_expired``."""
    settings = AvsimSettings(shard_size=4, artifact_root=f"file://{tmp_path / 'artifacts'}")
    plan = load_plan(ROOT / "dags" / "avsim_graphs.yaml", settings)
    doc = sample_manifest(4)
    for case in doc["cases"]:
        case.pop("phases", None)
    for graph in doc["graphs"].values():
        for name, phase in graph["phases"].items():
            phase["command"] = [sys.executable, str(ENTRYPOINT)]
            phase["args"] = [name, "--steps", str(steps), "--step-seconds", str(step_seconds)]
            phase.update(heartbeat_seconds=0.2, lease_seconds=1)
    path = tmp_path / "week.json"
    path.write_text(json.dumps(doc))
    prepared = prepare_week(
        source=str(path), plan=plan, settings=settings, dag_id="avsim_weekly", run_id="w1"
    )
    loaded = tasks.load_shard(prepared["shards"][0]["conf"], plan)
    family = next(k for k, v in loaded.items() if k.startswith("cases_") and v)
    layout = RunLayout(settings.resolved_artifact_root, prepared["run"]["run_key"])
    return prepared["run"], loaded[family][0], Ledger(layout)


def test_the_example_phase_runs_a_case_through_the_local_backend_and_commits(tmp_path: Path) -> None:
    """prepare, then simulate reading prepare's committed output: both pass the contract's checks
    (exit code, declared outputs present, heartbeat within the lease) and are committed with their
    metrics; simulate runs 1.5 s, past its 1 s lease, so its heartbeat is what keeps it alive."""
    from avsim.operators.phase import LocalPhaseOperator

    run, case, ledger = example_week(tmp_path)
    graph = case["graph"]
    prepare = LocalPhaseOperator(task_id=f"{graph}.prepare", phase="prepare", case=case, run=run, retries=2)
    ti = TaskInstance(prepare.task_id, try_number=1, max_tries=2)
    first = prepare.execute({"ti": ti})
    assert (first["outcome"], first["attempt"]) == ("passed", 1), first

    simulate = LocalPhaseOperator(
        task_id=f"{graph}.simulate",
        phase="simulate",
        case=case,
        run=run,
        upstream_phases={"prepare": prepare.task_id},
        role="spot",
        gpus=1,
        retries=5,
    )
    ti.xcoms[(prepare.task_id, "return_value", ti.map_index)] = first
    sim_ti = TaskInstance(simulate.task_id, try_number=1, max_tries=5, xcoms=ti.xcoms)
    second = simulate.execute({"ti": sim_ti})
    assert second["outcome"] == "passed", second

    committed = ledger.outcome(case["case_id"], "simulate")
    assert committed is not None and committed.outcome is Outcome.PASSED and not committed.detail
    assert committed.result["metrics"]["steps"] == 30
    out = Path(committed.output_uri.removeprefix("file://"))
    doc = json.loads((out / contract.RESULT_FILE).read_text())
    assert doc["inputs"] == {"prepare": "passed"}
    assert contract.declared_outputs(doc) == ("result.json", "trace.csv")
    assert (out / "trace.csv").read_text().startswith("step,gap_m\n")


def contract_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", ""),
        contract.ENV_RUN_ID: "avsim_weekly__w1",
        contract.ENV_CASE_ID: "case-00001",
        contract.ENV_PHASE: "simulate",
        contract.ENV_ATTEMPT: "1",
        contract.ENV_SEED: "11",
        contract.ENV_INPUT_URIS: "{}",
        contract.ENV_PARAMETERS: "{}",
        contract.ENV_OUTPUT_URI: f"file://{tmp_path}/out/attempt-1",
        contract.ENV_CHECKPOINT_URI: f"file://{tmp_path}/checkpoints",
        contract.ENV_HEARTBEAT_FILE: str(tmp_path / "heartbeat"),
        contract.ENV_HEARTBEAT_SECONDS: "0.1",
    }
    return {**env, **extra}


def run_phase(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(ENTRYPOINT), "simulate", "--step-seconds", "0", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({contract.ENV_OUTPUT_URI: ""}, "OUTPUT_URI is missing"),
        ({contract.ENV_SEED: "eleven"}, "must be integers"),
        ({contract.ENV_PARAMETERS: "[1]"}, "PARAMETERS must be a JSON object"),
        ({contract.ENV_PARAMETERS: '{"min_gap_m": "near"}'}, "is not a number"),
        ({contract.ENV_INPUT_URIS: '{"prepare": "file:///nowhere/attempt-1"}'}, "cannot read"),
    ],
)
def test_malformed_input_exits_65_which_avsim_never_retries(
    tmp_path: Path, change: dict[str, str], message: str
) -> None:
    done = run_phase(contract_env(tmp_path, **change))
    assert done.returncode == contract.EXIT_BAD_INPUT and message in done.stderr, done.stderr
    assert contract.classify_exit_code(done.returncode) is Outcome.BAD_INPUT


def test_a_bad_argument_from_the_manifest_is_bad_input_too(tmp_path: Path) -> None:
    done = run_phase(contract_env(tmp_path), "--steps", "many")
    assert done.returncode == contract.EXIT_BAD_INPUT, done.stderr


def test_a_failed_scenario_exits_3_with_its_result_written(tmp_path: Path) -> None:
    done = run_phase(contract_env(tmp_path, **{contract.ENV_PARAMETERS: '{"min_gap_m": 100}'}))
    assert contract.classify_exit_code(done.returncode) is Outcome.SCENARIO_FAILED, done.stderr
    doc = json.loads((tmp_path / "out" / "attempt-1" / "result.json").read_text())
    assert doc["outcome"] == "scenario_failed" and doc["metrics"]["min_gap_m"] < 100


def test_sigterm_saves_a_checkpoint_exits_143_and_the_next_attempt_resumes_to_the_same_trace(
    tmp_path: Path,
) -> None:
    """A spot reclaim: SIGTERM mid-run. The attempt ends preempted after saving its step; attempt 2
    (a new OUTPUT_URI, the same CHECKPOINT_URI) resumes there, and its trace is the one an
    uninterrupted run of the same seed writes."""
    env = contract_env(tmp_path)
    argv = [sys.executable, str(ENTRYPOINT), "simulate", "--steps", "400", "--step-seconds", "0.01"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpt = tmp_path / "checkpoints" / "checkpoint.json"
    deadline = time.monotonic() + 30
    while not ckpt.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    heartbeat_before = (tmp_path / "heartbeat").stat().st_mtime
    time.sleep(0.3)
    assert (tmp_path / "heartbeat").stat().st_mtime > heartbeat_before, "the heartbeat was not renewed"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert contract.classify_exit_code(proc.returncode) is Outcome.PREEMPTED, err
    stopped_at = json.loads(ckpt.read_text())["step"]
    assert 0 < stopped_at < 400, stopped_at

    second = {**env, contract.ENV_ATTEMPT: "2", contract.ENV_OUTPUT_URI: f"file://{tmp_path}/out/attempt-2"}
    assert run_phase(second, "--steps", "400").returncode == contract.EXIT_PASSED
    resumed = json.loads((tmp_path / "out" / "attempt-2" / "result.json").read_text())
    assert resumed["metrics"]["resumed_from_step"] == stopped_at

    fresh = {**env, contract.ENV_CHECKPOINT_URI: "", contract.ENV_OUTPUT_URI: f"file://{tmp_path}/fresh"}
    assert run_phase(fresh, "--steps", "400").returncode == contract.EXIT_PASSED
    trace = (tmp_path / "out" / "attempt-2" / "trace.csv").read_text()
    assert trace == (tmp_path / "fresh" / "trace.csv").read_text()
