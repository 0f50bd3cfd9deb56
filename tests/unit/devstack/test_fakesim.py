"""The fake simulator, run as a real process against file:// URIs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from avsim.devstack.fakesim import fs_uri
from avsim.phases import contract


def env_for(tmp_path: Path, out: str = "out", **overrides: Any) -> dict[str, str]:
    env = {
        "RUN_ID": "run-1",
        "CASE_ID": "case-001",
        "PHASE": "simulate",
        "ATTEMPT": "1",
        "SEED": "42",
        "INPUT_URIS": "{}",
        "SCENARIO_URI": "file:///scenarios/cut_in.xosc",
        "SCENARIO_VERSION": "v3",
        "OUTPUT_URI": f"file://{tmp_path / out}",
        "CHECKPOINT_URI": "",
        "PARAMETERS": "{}",
        "BUILD_ID": "b-123",
        "IMAGE": "registry/sim@sha256:" + "0" * 64,
    }
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def fakesim(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in env}
    return subprocess.run(
        [sys.executable, "-m", "avsim.devstack.fakesim", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def result_of(tmp_path: Path, out: str = "out") -> dict[str, Any]:
    return json.loads((tmp_path / out / contract.RESULT_FILE).read_text())


def test_same_seed_same_outputs(tmp_path: Path) -> None:
    for out in ("a", "b"):
        proc = fakesim(
            env_for(tmp_path, out), "simulate", "--duration", "0.05", "--scenario-fail-rate", "0.5"
        )
        assert proc.returncode in (0, 3), proc.stderr
    assert result_of(tmp_path, "a") == result_of(tmp_path, "b")
    trace = (tmp_path / "a" / "trace.jsonl").read_text()
    assert trace == (tmp_path / "b" / "trace.jsonl").read_text()
    assert 24 <= len(trace.splitlines()) <= 100
    other = fakesim(env_for(tmp_path, "c", SEED=43), "simulate", "--duration", "0.05")
    assert other.returncode == 0
    assert result_of(tmp_path, "c")["metrics"] != result_of(tmp_path, "a")["metrics"]
    res = result_of(tmp_path, "a")
    assert {"min_ttc_s", "max_decel_mps2", "collisions", "route_completion"} <= set(res["metrics"])
    assert res["build_id"] == "b-123" and res["seed"] == 42 and res["attempt"] == 1


def test_scenario_failure_is_a_result_carried_downstream(tmp_path: Path) -> None:
    proc = fakesim(env_for(tmp_path, "sim"), "simulate", "--duration", "0.02", "--scenario-fail-rate", "1")
    assert proc.returncode == contract.EXIT_SCENARIO_FAILED, proc.stderr
    sim = result_of(tmp_path, "sim")
    assert sim["outcome"] == "scenario_failed"
    retry = fakesim(
        env_for(tmp_path, "sim2", ATTEMPT=2), "simulate", "--duration", "0.02", "--scenario-fail-rate", "1"
    )
    assert retry.returncode == contract.EXIT_SCENARIO_FAILED

    inputs = json.dumps({"simulate": f"file://{tmp_path / 'sim'}"})
    ev = fakesim(
        env_for(tmp_path, "ev", PHASE="evaluate", INPUT_URIS=inputs), "evaluate", "--duration", "0.02"
    )
    assert ev.returncode == 0, ev.stderr
    evaluated = result_of(tmp_path, "ev")
    assert evaluated["outcome"] == "passed"
    assert evaluated["metrics"]["scenario_verdict"] == "scenario_failed"
    assert json.loads((tmp_path / "ev" / "metrics.json").read_text())["verdict"] == "scenario_failed"
    inputs = json.dumps({"evaluate": f"file://{tmp_path / 'ev'}"})
    rep = fakesim(env_for(tmp_path, "rep", PHASE="report", INPUT_URIS=inputs), "report", "--duration", "0")
    assert rep.returncode == 0, rep.stderr
    assert json.loads((tmp_path / "rep" / "case_report.json").read_text())["verdict"] == "scenario_failed"


def test_passing_chain_writes_each_kinds_artifact(tmp_path: Path) -> None:
    previous: dict[str, str] = {}
    for kind, artifact in [
        ("prepare", "scenario.json"),
        ("simulate", "trace.jsonl"),
        ("render", "frames.json"),
        ("evaluate", "metrics.json"),
        ("report", "case_report.json"),
    ]:
        env = env_for(tmp_path, kind, PHASE=kind, INPUT_URIS=json.dumps(previous))
        proc = fakesim(env, kind, "--duration", "0")
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / kind / artifact).exists()
        previous = {kind: env["OUTPUT_URI"]}
    assert result_of(tmp_path, "render")["metrics"]["frames"] > 0
    assert result_of(tmp_path, "report")["metrics"]["scenario_verdict"] == "passed"


def test_bad_input(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    missing = f"file://{tmp_path / 'empty'}"
    proc = fakesim(env_for(tmp_path, INPUT_URIS=json.dumps({"prepare": missing})), "simulate")
    assert proc.returncode == contract.EXIT_BAD_INPUT
    assert missing in proc.stderr and "result.json" in proc.stderr
    assert not (tmp_path / "out" / contract.RESULT_FILE).exists()

    env = env_for(tmp_path)
    del env["SEED"]
    proc = fakesim({**env, "SEED": ""}, "simulate")
    assert proc.returncode == contract.EXIT_BAD_INPUT and "SEED" in proc.stderr
    assert fakesim(env_for(tmp_path, INPUT_URIS="[1]"), "simulate").returncode == contract.EXIT_BAD_INPUT
    assert fakesim(env_for(tmp_path, ATTEMPT="x"), "simulate").returncode == contract.EXIT_BAD_INPUT
    rate = fakesim(env_for(tmp_path), "simulate", "--bad-input-rate", "1")
    assert rate.returncode == contract.EXIT_BAD_INPUT
    assert fakesim(env_for(tmp_path), "simulate", "--crash-rate", "2").returncode == contract.EXIT_BAD_INPUT


def test_crashes_depend_on_the_attempt(tmp_path: Path) -> None:
    codes = {}
    for attempt in range(1, 9):
        out = f"a{attempt}"
        proc = fakesim(
            env_for(tmp_path, out, ATTEMPT=attempt), "simulate", "--duration", "0.02", "--crash-rate", "0.5"
        )
        codes[attempt] = proc.returncode
        if proc.returncode == 1:
            assert "crash" in proc.stderr
            assert not (tmp_path / out / contract.RESULT_FILE).exists()
            assert (tmp_path / out / "trace.jsonl").exists()  # the partial file a crash leaves
    assert set(codes.values()) == {0, 1}, codes
    passed = [a for a, c in codes.items() if c == 0]
    assert result_of(tmp_path, f"a{passed[0]}")["metrics"] == result_of(tmp_path, f"a{passed[-1]}")["metrics"]


def test_checkpoint_resume_does_less_work(tmp_path: Path) -> None:
    ckpt = f"file://{tmp_path / 'ckpt'}"
    params = json.dumps({"fakesim": {"simulate": "crash_once"}})
    args = ("simulate", "--duration", "1.0", "--jitter", "0", "--checkpoint-every", "0.1")
    first = fakesim(env_for(tmp_path, "a1", CHECKPOINT_URI=ckpt, PARAMETERS=params, SEED=7), *args)
    assert first.returncode == 1, first.stderr
    written = sorted(p.name for p in (tmp_path / "ckpt").glob("ckpt-*.json"))
    assert written, "the crashed attempt left no checkpoint"
    assert json.loads((tmp_path / "ckpt" / written[-1]).read_text())["attempt"] == 1
    second = fakesim(
        env_for(tmp_path, "a2", CHECKPOINT_URI=ckpt, PARAMETERS=params, SEED=7, ATTEMPT=2), *args
    )
    assert second.returncode == 0, second.stderr
    resumed = result_of(tmp_path, "a2")
    assert resumed["resumed_from"] > 0
    assert resumed["work_seconds"] < 1.0

    fresh = fakesim(env_for(tmp_path, "b", CHECKPOINT_URI=f"file://{tmp_path / 'other'}", SEED=7), *args)
    assert fresh.returncode == 0
    restart = result_of(tmp_path, "b")
    assert restart["resumed_from"] == 0 and restart["work_seconds"] == pytest.approx(1.0)
    assert resumed["metrics"] == restart["metrics"]


def test_summary_counts_shard_summaries(tmp_path: Path) -> None:
    shard = tmp_path / "shards" / "00000"
    shard.mkdir(parents=True)
    cases = [
        {"case_id": "a", "graph": "standard", "outcome": "passed"},
        {"case_id": "b", "graph": "standard", "outcome": "scenario_failed"},
    ]
    (shard / "result.json").write_text(json.dumps({"shard": 0, "cases": cases}))
    env = env_for(
        tmp_path,
        "sum",
        CASE_ID="_run",
        PHASE="weekly_summary",
        INPUT_URIS=json.dumps({"shard_00000": f"file://{shard}"}),
    )
    proc = fakesim(env, "summary", "--duration", "0")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "sum" / "summary.json").read_text())
    assert summary["cases"] == 2 and summary["by_outcome"] == {"passed": 1, "scenario_failed": 1}


def test_fs_uri_and_light_imports() -> None:
    assert fs_uri("s3://aws_default@bucket/runs/x") == "s3://bucket/runs/x"
    assert fs_uri("file:///tmp/x") == "file:///tmp/x"
    code = "import sys, avsim.devstack.fakesim as m; assert not {'airflow', 'fsspec'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_writes_to_s3(tmp_path: Path, s3_server: str) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_server)
    # ObjectStoragePath spelling (conn@bucket) for the output, plain s3:// for the checkpoints
    env = env_for(
        tmp_path,
        OUTPUT_URI="s3://avsim_s3@avsim/cases/c/simulate/attempt-1",
        CHECKPOINT_URI="s3://avsim/checkpoints/c/simulate",
    )
    proc = fakesim(env, "simulate", "--duration", "0.2", "--checkpoint-every", "0.05")
    assert proc.returncode == 0, proc.stderr
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="avsim")["Contents"]}
    assert {"cases/c/simulate/attempt-1/result.json", "cases/c/simulate/attempt-1/trace.jsonl"} <= keys
    assert any(k.startswith("checkpoints/c/simulate/ckpt-") for k in keys)
    again = fakesim(
        {**env, "ATTEMPT": "2", "OUTPUT_URI": "s3://avsim/cases/c/simulate/attempt-2"},
        "simulate",
        "--duration",
        "0.2",
        "--checkpoint-every",
        "0.05",
    )
    assert again.returncode == 0, again.stderr
    body = s3.get_object(Bucket="avsim", Key="cases/c/simulate/attempt-2/result.json")["Body"].read()
    assert json.loads(body)["resumed_from"] > 0


def test_crash_before_crashes_until_the_named_attempt(tmp_path: Path) -> None:
    params = json.dumps({"fakesim": {"evaluate": "crash_before:3"}})
    codes = [
        fakesim(
            env_for(tmp_path, f"e{a}", PHASE="evaluate", ATTEMPT=a, PARAMETERS=params),
            "evaluate",
            "--duration",
            "0",
        ).returncode
        for a in (1, 2, 3, 4)
    ]
    assert codes == [1, 1, 0, 0]


def test_heartbeat_renews_once_per_interval_counting_the_start(tmp_path: Path) -> None:
    """The phase's start counts as its first sign of life: the first renewal is one interval in."""
    from avsim.phases.heartbeat import FileHeartbeat

    hb = FileHeartbeat(0.3, tmp_path / "hb")
    hb.beat()
    assert hb.beats == 0 and not (tmp_path / "hb").exists()
    hb.beat(force=True)
    assert hb.beats == 1 and (tmp_path / "hb").exists()
    hb.beat()
    assert hb.beats == 1
    time.sleep(0.35)
    hb.beat()
    assert hb.beats == 2


def test_a_lost_write_exits_as_a_pass_and_leaves_nothing(tmp_path: Path) -> None:
    """``no_output_once``: attempt 1 exits 0 with nothing under OUTPUT_URI (the fault avsim must catch:
    issue 31 item 6); attempt 2 writes its result.json and the artifact it lists."""
    params = json.dumps({"fakesim": {"simulate": "no_output_once"}})
    lost = fakesim(env_for(tmp_path, "a1", PARAMETERS=params), "simulate", "--duration", "0")
    assert lost.returncode == contract.EXIT_PASSED, lost.stderr
    assert not (tmp_path / "a1").exists()
    kept = fakesim(env_for(tmp_path, "a2", ATTEMPT=2, PARAMETERS=params), "simulate", "--duration", "0")
    assert kept.returncode == contract.EXIT_PASSED, kept.stderr
    doc = result_of(tmp_path, "a2")
    assert contract.declared_outputs(doc)[0] == contract.RESULT_FILE
    assert all((tmp_path / "a2" / name).exists() for name in contract.declared_outputs(doc))


def test_bad_input_until_the_missing_input_is_restored(tmp_path: Path) -> None:
    marker = tmp_path / "scenario-restored"
    params = json.dumps({"fakesim": {"prepare": f"bad_input_until:file://{marker}"}})

    def run(attempt: int) -> int:
        env = env_for(tmp_path, f"p{attempt}", PHASE="prepare", ATTEMPT=attempt, PARAMETERS=params)
        return fakesim(env, "prepare", "--duration", "0").returncode

    assert run(1) == contract.EXIT_BAD_INPUT
    marker.touch()
    assert run(2) == 0


BUILD_A = "registry/sim@sha256:" + "a" * 64
BUILD_B = "registry/sim@sha256:" + "b" * 64


def test_a_scenario_fault_keyed_on_the_build_fails_on_that_build_only(tmp_path: Path) -> None:
    params = json.dumps({"fakesim": {"simulate": "scenario_failed_on:sha256:bbbbbb"}})
    on_b = fakesim(env_for(tmp_path, "b", IMAGE=BUILD_B, PARAMETERS=params), "simulate", "--duration", "0")
    assert on_b.returncode == contract.EXIT_SCENARIO_FAILED, on_b.stderr
    assert result_of(tmp_path, "b")["outcome"] == "scenario_failed"
    on_a = fakesim(env_for(tmp_path, "a", IMAGE=BUILD_A, PARAMETERS=params), "simulate", "--duration", "0")
    assert on_a.returncode == contract.EXIT_PASSED, on_a.stderr
    vague = json.dumps({"fakesim": {"simulate": "scenario_failed_on:sha256:"}})
    refused = fakesim(env_for(tmp_path, "v", PARAMETERS=vague), "simulate", "--duration", "0")
    assert refused.returncode == contract.EXIT_BAD_INPUT and "6 to 64 hex digits" in refused.stderr


def _flakes(tmp_path: Path, out: str, rate: str, **env: Any) -> bool:
    from avsim.devstack.fakesim import PhaseEnv

    params = json.dumps({"fakesim": {"simulate": f"flake:{rate}"}})
    return PhaseEnv.from_environ(env_for(tmp_path, out, PARAMETERS=params, **env)).flakes()


def test_a_flake_differs_between_attempt_scopes_and_repeats_within_one(tmp_path: Path) -> None:
    scopes = [f"runs/k/cases/c/simulate/rerun-{i}/attempt-1" for i in range(200)]
    draws = [_flakes(tmp_path, s, "0.3") for s in scopes]
    assert 40 <= sum(draws) <= 80  # about 30 % of 200
    assert draws == [_flakes(tmp_path, s, "0.3") for s in scopes]  # reproducible
    assert draws != [_flakes(tmp_path, s, "0.3", SEED=43) for s in scopes]  # the seed counts
    assert not any(_flakes(tmp_path, s, "0") for s in scopes[:20])
    assert all(_flakes(tmp_path, s, "1") for s in scopes[:20])
    failing = scopes[draws.index(True)]
    passing = scopes[draws.index(False)]
    params = json.dumps({"fakesim": {"simulate": "flake:0.3"}})
    for out, code in ((failing, contract.EXIT_SCENARIO_FAILED), (passing, contract.EXIT_PASSED)):
        proc = fakesim(env_for(tmp_path, out, PARAMETERS=params), "simulate", "--duration", "0")
        assert proc.returncode == code, proc.stderr
    bad = json.dumps({"fakesim": {"simulate": "flake:often"}})
    refused = fakesim(env_for(tmp_path, "x", PARAMETERS=bad), "simulate", "--duration", "0")
    assert refused.returncode == contract.EXIT_BAD_INPUT and "probability between 0 and 1" in refused.stderr


def test_a_fault_in_a_scope_hits_only_the_attempts_written_there(tmp_path: Path) -> None:
    """``crash_in:TEXT``: a pool broken for one kind of attempt (a triage rerun) and not for the week's."""
    params = json.dumps({"fakesim": {"simulate": "scenario_failed_on:sha256:bbbbbb+crash_in:/triage/"}})
    week = fakesim(env_for(tmp_path, "week/attempt-1", IMAGE=BUILD_B, PARAMETERS=params), "simulate",
                   "--duration", "0")  # fmt: skip
    assert week.returncode == contract.EXIT_SCENARIO_FAILED, week.stderr
    rerun = fakesim(env_for(tmp_path, "x/triage/this-1/attempt-1", IMAGE=BUILD_B, PARAMETERS=params),
                    "simulate", "--duration", "0.02")  # fmt: skip
    assert rerun.returncode == 1 and "simulated crash" in rerun.stderr
