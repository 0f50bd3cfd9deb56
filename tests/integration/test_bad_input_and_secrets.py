"""Bad input and secrets on a real stack (scheduler, dag-processor, triggerer, api-server; PostgreSQL;
the artifact store on a real S3 API, reached through an Airflow connection).

One stack for both of issue 7's items (so one module):

* bad input: bad manifests and a bad conf fail the weekly run's ``prepare`` on its first try with
  the field in its log and start no shard run (also a depth bomb inline in the conf, after which the
  worker serves the next week: issue 28); a conf the trigger's parameters refuse starts no
  run at all; shard runs started by hand with a bad conf fail at once; a broken DAG file (a
  catalog-shaped one whose catalog is bad) gets an import error while ``avsim_weekly`` and
  ``avsim_weekly_shard`` stay parsed and a good week still succeeds;
* no secret leaks: the S3 connection's secret key (``AIRFLOW_CONN_AVSIM_S3``, also the phases'
  ``AWS_SECRET_ACCESS_KEY``), a Variable (``AIRFLOW_VAR_...``) and a password written into a
  rejected manifest appear in no log file, nowhere in the metadata database (XCom, conf, rendered
  fields, serialized DAGs: a full dump) and in no object of the artifact store (ledger, report).
  The same scan finds the week's run id and a case marker in all three (it reads what it claims to).

Nothing is mocked; the S3 API is moto's server (the stand-in the test suite uses for S3).
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.airflow_run import query, run_descriptor, trigger, wait_for_run
from tests.support.postgres import _bin, postgres_cluster
from tests.support.stacks import fast_retry_catalog

from avsim.devstack.demo import demo_pools, wait_for_dag
from avsim.devstack.stack import LocalStack
from avsim.manifest.sample import sample_manifest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "unit" / "corpus"
BUCKET = "avsim"
#: Distinctive per test run, so no file of the repository can hold them.
S3_SECRET = "s3SecretKey" + secrets.token_hex(12)
VAR_SECRET = "varSecret" + secrets.token_hex(12)
MANIFEST_PASSWORD = "Tr0ub4dor3"  # written in tests/unit/corpus/bad_secret_uri_password.yaml
MARKER = "leakscan-" + secrets.token_hex(6)
GOOD_RUN = "it__good_week"
#: (Airflow's DAG discovery safe mode parses only files that mention "airflow" and "dag".)
BROKEN_DAG = '''"""A second weekly Airflow DAG, built from a catalog with a forbidden pod field."""
from pathlib import Path

from avsim.dagbuild.factory import load_weekly_dags

globals().update(load_weekly_dags(catalog=Path(__file__).with_name("broken_graphs.yaml"), dag_id="avsim_broken"))
'''


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        boto3.client(
            "s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b"
        ).create_bucket(Bucket=BUCKET)
        yield url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, s3: str) -> Iterator[LocalStack]:
    base = tmp_path_factory.mktemp("badinput")
    dags = base / "dags"
    dags.mkdir()
    for name in ("avsim_weekly.py", "avsim_weekly_shard.py"):
        shutil.copy(ROOT / "dags" / name, dags / name)
    fast_retry_catalog(dags / "avsim_graphs.yaml")  # the DAG files read the catalog next to them
    access_key = "AKIA" + secrets.token_hex(8).upper()
    connection = {
        "conn_type": "aws",
        "login": access_key,
        "password": S3_SECRET,
        "extra": {"endpoint_url": s3, "region_name": "us-east-1"},
    }
    with postgres_cluster() as url:
        stack = LocalStack(
            home=base / "airflow",
            dags_folder=dags,
            plugins_folder=ROOT / "plugins",
            sql_alchemy_conn=url,
            extra_env={
                "AIRFLOW__AVSIM__SHARD_SIZE": "10",
                "AIRFLOW__AVSIM__MAX_ACTIVE_SHARDS": "2",
                "AIRFLOW__AVSIM__SHARD_POLL_SECONDS": "1",
                "AIRFLOW__AVSIM__ARTIFACT_ROOT": f"s3://avsim_s3@{BUCKET}/artifacts",
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "20",
                "AIRFLOW_CONN_AVSIM_S3": json.dumps(connection),
                "AIRFLOW_VAR_AVSIM_WEBHOOK_TOKEN": VAR_SECRET,
                # The phases reach the store as a container would: fsspec and the standard AWS variables.
                "AWS_ENDPOINT_URL": s3,
                "AWS_ACCESS_KEY_ID": access_key,
                "AWS_SECRET_ACCESS_KEY": S3_SECRET,
                "AWS_DEFAULT_REGION": "us-east-1",
            },
        )
        stack.set_pools(demo_pools(gpus=4, cpus=8))
        stack.start()
        try:
            wait_for_dag(stack, "avsim_weekly")
            wait_for_dag(stack, "avsim_weekly_shard")
            yield stack
        finally:
            stack.stop()


def _task_log(stack: LocalStack, dag_id: str, run_id: str, task_id: str) -> str:
    logs = sorted((stack.home / "logs").glob(f"dag_id={dag_id}/run_id={run_id}/task_id={task_id}/**/*.log"))
    assert logs, f"no log of {dag_id}/{run_id}/{task_id}"
    return "\n".join(p.read_text(errors="replace") for p in logs)


def _until(what: str, probe: Any, timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(1)
    raise TimeoutError(f"{what} within {timeout:.0f}s")


def _parsed_at(stack: LocalStack, dag_id: str) -> Any:
    return query(stack, "SELECT last_parsed_time FROM dag WHERE dag_id = :d", d=dag_id)[0][0]


# ------------------------------------------------------------------------------------ bad input


def test_a_broken_dag_file_gets_an_import_error_and_the_weekly_dags_stay(stack: LocalStack) -> None:
    dags = Path(stack.dags_folder)
    catalog = (dags / "avsim_graphs.yaml").read_text()
    broken = catalog.replace("        pod:\n", "        pod:\n          privileged: true\n", 1)
    assert broken != catalog
    (dags / "broken_graphs.yaml").write_text(broken)
    (dags / "avsim_broken.py").write_text(BROKEN_DAG)
    errors = _until(
        "an import error for avsim_broken.py",
        lambda: query(stack, "SELECT filename, stacktrace FROM import_error"),
    )
    assert [Path(f).name for f, _ in errors] == ["avsim_broken.py"]
    trace = errors[0][1]
    assert "pod.privileged: pod field 'privileged' is not allowed: pods never run privileged" in trace
    served = query(
        stack,
        "SELECT dag_id FROM serialized_dag WHERE dag_id IN ('avsim_weekly', 'avsim_weekly_shard', 'avsim_broken')",
    )
    assert sorted(d for (d,) in served) == ["avsim_weekly", "avsim_weekly_shard"]
    stack.home.joinpath("import_error_seen").write_text(str(_parsed_at(stack, "avsim_weekly")))


#: run id -> (conf, the text the prepare log must hold)
BAD_WEEKLY_RUNS = {
    "it__bad_pod": (
        {"manifest": str(CORPUS / "bad_pod_privileged.yaml")},
        "graphs.standard.phases.simulate.pod.privileged: pod field 'privileged' is not allowed",
    ),
    "it__bad_secret": (
        {"manifest": str(CORPUS / "bad_secret_uri_password.yaml")},
        "cases[1].scenario.uri: a password in a URI (https://reader:****@)",
    ),
    "it__bad_cycle": (
        {"manifest": str(CORPUS / "bad_cycle.yaml")},
        "graphs.standard.phases: phases depend on each other in a cycle",
    ),
    "it__bad_conf": (
        {"manifest": "nosuchfs://bucket/2026-W49.yaml"},
        "params.manifest: 'nosuchfs://bucket/2026-W49.yaml' is no location avsim can read",
    ),
}


def test_bad_manifests_and_conf_fail_prepare_on_its_first_try_and_start_no_shard(stack: LocalStack) -> None:
    for run_id, (conf, _) in BAD_WEEKLY_RUNS.items():
        trigger(stack, "avsim_weekly", run_id, conf)
    for run_id, (_, says) in BAD_WEEKLY_RUNS.items():
        assert wait_for_run(stack, "avsim_weekly", run_id, timeout=300) == "failed", run_id
        prepare = query(
            stack,
            "SELECT state, try_number FROM task_instance WHERE dag_id = 'avsim_weekly' AND run_id = :r "
            "AND task_id = 'prepare'",
            r=run_id,
        )
        assert prepare == [("failed", 1)], (run_id, prepare)
        assert says in _task_log(stack, "avsim_weekly", run_id, "prepare"), run_id
        started = query(stack, "SELECT run_id FROM dag_run WHERE run_id LIKE :p", p=f"{run_id}__%")
        assert started == [], f"{run_id} started shard runs {started}"


def test_a_conf_the_parameters_refuse_starts_no_run(stack: LocalStack) -> None:
    done = stack.airflow(
        "dags",
        "trigger",
        "avsim_weekly",
        "--run-id",
        "it__not_a_string",
        "--conf",
        '{"manifest": 42}',
        check=False,
    )
    assert done.returncode != 0
    assert "manifest" in done.stdout + done.stderr
    assert query(stack, "SELECT run_id FROM dag_run WHERE run_id = 'it__not_a_string'") == []


def _inline_depth_bomb(depth: int) -> str:
    """The corpus's control as JSON text, one case's parameters holding lists nested ``depth`` deep
    (issue 28: 20,000 levels took the validator 2 GB; 100,000 took 22 GB and the kernel's OOM kill).
    Lists, not mappings: "[" needs no escape in the conf's JSON, and the text stays under the 128 KiB
    that one argument of ``airflow dags trigger`` may have."""
    import yaml

    doc = yaml.safe_load((CORPUS / "good_minimal.yaml").read_text())
    doc["run"]["deadline"] = "2026-12-06T18:00:00Z"
    doc["cases"][0]["parameters"] = "@P@"
    return json.dumps(doc).replace('"@P@"', '{"a":' + "[" * depth + "]" * depth + "}")


@pytest.mark.long  # 40 s of a worker parsing the bomb; the bounds themselves are unit-tested
def test_a_depth_bomb_in_the_conf_fails_prepare_as_bad_input_and_the_worker_serves_on(
    stack: LocalStack,
) -> None:
    """The manifest's text inline in the trigger's conf, nested 50,000 deep: prepare fails on its first
    try as bad input naming the location; the scheduler and its workers live on and run the next week."""
    scheduler = stack.procs["scheduler"]
    bomb, after = "it__depth_bomb", "it__after_the_bomb"
    trigger(stack, "avsim_weekly", bomb, {"manifest": _inline_depth_bomb(50_000)})
    doc = sample_manifest(1, time_scale=0.00002, scenario_fail_rate=0.0, canary={"enabled": False})
    trigger(stack, "avsim_weekly", after, {"manifest": json.dumps(doc)})  # inline too: a well-formed one
    assert wait_for_run(stack, "avsim_weekly", bomb, timeout=300) == "failed"
    prepare = query(
        stack,
        "SELECT state, try_number FROM task_instance WHERE dag_id = 'avsim_weekly' AND run_id = :r "
        "AND task_id = 'prepare'",
        r=bomb,
    )
    assert prepare == [("failed", 1)], prepare  # bad input: no retry
    log = _task_log(stack, "avsim_weekly", bomb, "prepare")
    location = "cases[0].parameters.a" + "[0]" * 196
    assert (
        f"{location}: JSON nesting is too deep: more than 200 levels here (a fixed limit); flatten it" in log
    )
    assert "params.manifest (inline)" in log and "MemoryError" not in log and "RecursionError" not in log
    assert "[0]" * 197 not in log, "the path is cut at the depth limit"
    assert query(stack, "SELECT run_id FROM dag_run WHERE run_id LIKE :p", p=f"{bomb}__%") == []
    # The worker that refused it serves on: the next week (queued behind it) prepares and succeeds.
    assert wait_for_run(stack, "avsim_weekly", after, timeout=600) == "success"
    assert scheduler.poll() is None and stack.procs["scheduler"] is scheduler, "the scheduler was restarted"


def test_a_good_week_still_succeeds_while_the_broken_file_is_there(stack: LocalStack) -> None:
    doc = sample_manifest(
        4, time_scale=0.00002, scenario_fail_rate=0.0, canary={"share": 0.25, "min_cases": 1}
    )
    for case in doc["cases"]:
        case["parameters"]["leak_scan"] = MARKER
    manifest = stack.home / "good.json"
    manifest.write_text(json.dumps(doc))
    trigger(stack, "avsim_weekly", GOOD_RUN, {"manifest": str(manifest)})
    assert wait_for_run(stack, "avsim_weekly", GOOD_RUN, timeout=900) == "success"
    # The DAG processor kept parsing the weekly DAG files after the broken one appeared.
    seen = stack.home.joinpath("import_error_seen").read_text()
    _until(
        "avsim_weekly parsed again after the import error",
        lambda: str(_parsed_at(stack, "avsim_weekly")) > seen,
        timeout=120,
    )
    assert [Path(f).name for (f,) in query(stack, "SELECT filename FROM import_error")] == ["avsim_broken.py"]


def test_a_shard_run_started_by_hand_with_a_bad_conf_fails_at_once(stack: LocalStack) -> None:
    run = run_descriptor(stack, GOOD_RUN)
    confs = {
        "it__shard_by_hand_empty": ({}, "conf.run: missing or incomplete"),
        "it__shard_by_hand_99": (
            {"run": run, "shard": 99},
            f"conf.shard: run {run['run_key']!r} has no shard 99",
        ),
    }
    for run_id, (conf, _) in confs.items():
        trigger(stack, "avsim_weekly_shard", run_id, conf)
    for run_id, (_, says) in confs.items():
        assert wait_for_run(stack, "avsim_weekly_shard", run_id, timeout=300) == "failed", run_id
        tis = dict(
            query(
                stack,
                "SELECT task_id, state || ':' || try_number FROM task_instance "
                "WHERE dag_id = 'avsim_weekly_shard' AND run_id = :r",
                r=run_id,
            )
        )
        # Both ends of the run failed on their first try; no phase ran.
        assert tis["load_shard"] == "failed:1" and tis["summarize"] == "failed:1", tis
        phases = {t: s for t, s in tis.items() if "." in t}
        assert phases and all(s.startswith("upstream_failed") for s in phases.values()), phases
        assert says in _task_log(stack, "avsim_weekly_shard", run_id, "load_shard")


# ---------------------------------------------------------------------------------- secret leaks


def _s3_objects(url: str) -> dict[str, bytes]:
    import boto3

    client = boto3.client(
        "s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b"
    )
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for obj in page.get("Contents", []):
            out[obj["Key"]] = client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
    return out


def _database_dump(stack: LocalStack) -> str:
    m = re.match(r".*@127\.0\.0\.1:(\d+)/(\w+)$", stack.conn)
    assert m, stack.conn
    done = subprocess.run(
        [_bin("pg_dump"), "-h", "127.0.0.1", "-p", m.group(1), "-U", "postgres", "--data-only", m.group(2)],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_no_secret_in_logs_the_metadata_database_or_the_artifact_store(stack: LocalStack, s3: str) -> None:
    logs = {str(p): p.read_bytes() for p in (stack.home / "logs").rglob("*") if p.is_file()}
    dump = _database_dump(stack).encode()
    objects = _s3_objects(s3)
    places: dict[str, dict[str, bytes]] = {
        "logs": logs,
        "database": {"pg_dump": dump},
        "artifact store": objects,
    }
    # The scan reads what it claims to: the good week is in all three, its case marker in two.
    assert any(k.endswith("report/report.json") and GOOD_RUN.encode() in v for k, v in objects.items())
    for where, found in places.items():
        assert any(GOOD_RUN.encode() in body for body in found.values()), f"{GOOD_RUN} not found in {where}"
    assert MARKER.encode() in dump, "the case marker is in the run's XCom"
    assert any(MARKER.encode() in body for body in objects.values()), "the marker is in the manifest snapshot"
    assert b"https://reader:****@" in b"".join(logs.values()), "the rejected manifest's problem was logged"
    assert len(logs) > 20 and len(objects) > 20, (len(logs), len(objects))
    leaks = [
        f"{secret[:6]}... in {where}: {name}"
        for secret in (S3_SECRET, VAR_SECRET, MANIFEST_PASSWORD)
        for where, found in places.items()
        for name, body in found.items()
        if secret.encode() in body
    ]
    assert leaks == []
