"""What keeps a phase cheap for the orchestrator: the scheduler's preload, a light plugin, the artifact
store's local fast path and the ledger's committed results read once (issue 14; the figures are in
bench/phase_overhead.py, not here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from avsim import storage
from avsim.artifacts import RunLayout
from avsim.dagbuild import preload
from avsim.ledger.records import OutcomeRecord
from avsim.ledger.store import Ledger
from avsim.phases.contract import Outcome


def test_the_scheduler_preloads_phase_modules_only_for_an_executor_that_forks_them() -> None:
    assert preload.modules_for("scheduler", "local", "LocalExecutor") == preload.PHASE_TASK_MODULES
    k8s = preload.modules_for("scheduler", "kubernetes", "airflow.executors.local_executor.LocalExecutor")
    assert k8s == preload.PHASE_TASK_MODULES + preload.KUBERNETES_MODULES
    assert preload.modules_for("scheduler", "local", "CeleryExecutor") == ()
    assert preload.modules_for("dag-processor", "local", "CeleryExecutor") == preload.DAG_FILE_MODULES
    for command in ("api-server", "triggerer", "tasks", ""):
        assert preload.modules_for(command, "kubernetes", "LocalExecutor") == ()


def test_preload_skips_what_does_not_import() -> None:
    assert preload.preload(("json", "avsim.no_such_module")) == ["json"]


def test_a_task_runner_starting_preloads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    called = []
    monkeypatch.setattr(preload, "preload", lambda modules: called.append(modules) or [])
    preload.on_starting(component=object())
    assert called == []


def test_loading_the_plugin_does_not_build_the_ui_app() -> None:
    """Every Airflow process loads plugins; the FastAPI app costs about a CPU-second to import."""
    code = (
        "import sys; import avsim.plugin as p; "
        "print('RESULT', 'avsim.ui.app' in sys.modules, 'fastapi' in sys.modules); "
        "apps = p.AvsimPlugin.fastapi_apps; "
        "print('RESULT', apps[0]['url_prefix'], type(apps[0]['app']).__name__, p.AvsimPlugin().fastapi_apps is apps)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    results = [line.split()[1:] for line in out.splitlines() if line.startswith("RESULT ")]
    assert results == [["False", "False"], ["/avsim", "FastAPI", "True"]]


def test_local_documents_are_read_and_written_without_object_storage(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/a/b/doc.json"
    assert not storage.exists(uri)
    storage.write_json(uri, {"b": 1, "a": [1, 2]})
    assert storage.exists(uri)
    assert storage.read_json(uri) == {"a": [1, 2], "b": 1}
    assert (tmp_path / "a" / "b" / "doc.json").read_text() == json.dumps({"a": [1, 2], "b": 1})
    assert list((tmp_path / "a" / "b").iterdir()) == [tmp_path / "a" / "b" / "doc.json"]  # no temporary left
    assert storage.local_path("s3://conn@bucket/key") is None
    assert storage.local_path("/plain/path") == "/plain/path"


def _outcome(attempt: int, outcome: Outcome) -> OutcomeRecord:
    return OutcomeRecord(
        run_key="rk",
        case_id="c1",
        phase="simulate",
        attempt=attempt,
        outcome=outcome,
        output_uri=f"file:///out/{attempt}" if outcome.produced_output else "",
        committed_at="2026-12-07T10:00:00+00:00",
    )


def test_a_committed_result_is_read_once_and_a_committed_failure_every_time(tmp_path: Path) -> None:
    layout = RunLayout(f"file://{tmp_path}", "rk")
    ledger = Ledger(layout)
    reads: list[str] = []
    real = ledger.documents.read
    outcome_uri = layout.outcome_record("c1", "simulate")
    ledger.documents.read = lambda uri: (uri == outcome_uri and reads.append(uri)) or real(uri)  # type: ignore[method-assign]

    assert ledger.commit(_outcome(1, Outcome.INFRA_FAILED))
    assert ledger.outcome("c1", "simulate").outcome is Outcome.INFRA_FAILED  # type: ignore[union-attr]
    assert ledger.outcome("c1", "simulate").outcome is Outcome.INFRA_FAILED  # type: ignore[union-attr]
    assert len(reads) == 2  # a failure may be replaced by a later attempt: read it each time

    reads.clear()
    assert ledger.commit(_outcome(2, Outcome.PASSED))
    assert ledger.outcome("c1", "simulate").attempt == 2  # type: ignore[union-attr]
    assert reads == []  # the result this ledger committed is final

    other = Ledger(layout)  # another worker's ledger reads it once, then keeps it
    assert other.outcome("c1", "simulate").attempt == 2  # type: ignore[union-attr]
    assert not other.commit(_outcome(3, Outcome.PASSED))  # the first committed result wins
    assert other.outcome("c1", "simulate").attempt == 2  # type: ignore[union-attr]


def test_a_catalog_is_checked_once_per_text_and_again_when_the_file_changes(tmp_path: Path) -> None:
    from avsim.errors import ManifestError
    from avsim.plan import catalog as catalog_module

    shipped = (Path(__file__).parents[2] / "dags" / "avsim_graphs.yaml").read_text()
    path = tmp_path / "avsim_graphs.yaml"
    path.write_text(shipped)
    checks: list[str] = []
    real = catalog_module._check_catalog_text

    def counted(text: str, p: Path) -> catalog_module.GraphCatalog:
        checks.append(str(p))
        return real(text, p)

    catalog_module._CHECKED.clear()
    try:
        catalog_module._check_catalog_text = counted  # type: ignore[assignment]
        assert preload.check_catalog(str(path))  # the scheduler's preload checks it ahead
        first = catalog_module.load_catalog(path)  # the phase task's parse: the same text, not checked again
        assert catalog_module.load_catalog(path) is first
        assert checks == [str(path)]

        path.write_text(shipped.replace("graphs:", "graphs:  # edited", 1))  # a changed file is checked again
        assert catalog_module.load_catalog(path) == first
        assert len(checks) == 2

        path.write_text(shipped + "\nunknown_key: 1\n")  # and a bad one fails every time, never cached
        for _ in range(2):
            with pytest.raises(ManifestError, match="unknown_key"):
                catalog_module.load_catalog(path)
        assert len(checks) == 4
        assert not preload.check_catalog(str(path)) and not preload.check_catalog(
            str(tmp_path / "missing.yaml")
        )
    finally:
        catalog_module._check_catalog_text = real  # type: ignore[assignment]
        catalog_module._CHECKED.clear()


def test_a_celery_worker_warms_up_through_avsims_celery_configuration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only ``airflow celery worker`` imports the phase modules; the CeleryExecutor and ``celery inspect``
    import the same configuration and get Airflow's own, unchanged."""
    from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

    assert preload.modules_for(preload.CELERY_WORKER, "local", "CeleryExecutor") == preload.PHASE_TASK_MODULES
    k8s = preload.modules_for(preload.CELERY_WORKER, "kubernetes", "CeleryExecutor")
    assert k8s == preload.PHASE_TASK_MODULES + preload.KUBERNETES_MODULES
    warmed: list[str] = []
    monkeypatch.setattr(preload, "warm", lambda command: warmed.append(command) or ["m"])
    assert preload.warm_celery_worker(["airflow", "scheduler"]) == []
    assert preload.warm_celery_worker(["celery", "--app", "x", "inspect", "ping"]) == []
    assert preload.warm_celery_worker(["/venv/bin/airflow", "celery", "worker", "--queues", "q"]) == ["m"]
    assert warmed == [preload.CELERY_WORKER]

    code = (
        "import sys; sys.argv = ['airflow', 'celery', 'worker']; "
        "import avsim.celery_config as c; "
        "print('RESULT', 'avsim.operators.phase' in sys.modules, 'avsim.operators.kubernetes' in sys.modules, "
        "'airflow.providers.amazon.aws.fs.s3' in sys.modules)"
    )
    env = {**os.environ, "AIRFLOW__AVSIM__BACKEND": "kubernetes"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout
    # ... and the object-storage filesystems its phase tasks read s3:// through are registered.
    assert [line.split()[1:] for line in out.splitlines() if line.startswith("RESULT ")] == [
        ["True", "True", "True"]
    ]
    import avsim.celery_config

    assert avsim.celery_config.CELERY_CONFIG == DEFAULT_CELERY_CONFIG


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("through_setpriv", [True, False])
def test_a_phase_process_dies_with_the_process_that_started_it(
    through_setpriv: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A phase process is killed with its task process, through ``setpriv --pdeathsig`` (so Python can
    ``vfork``) or, without setpriv, a ``preexec_fn``; a command that does not exist still fails to start."""
    from avsim.operators import phase

    sleep = phase.resolve_command(["sleep", "60"])
    _, preexec = phase.die_with_parent(sleep)
    if through_setpriv and preexec is not None:
        pytest.skip("setpriv is not installed")
    env = dict(os.environ)
    if not through_setpriv:
        env["PATH"] = str(tmp_path)  # no setpriv on PATH: the preexec_fn way
    # A stand-in for the task process: it starts the phase as LocalPhaseOperator does and waits.
    starter = (
        "import subprocess, sys; from avsim.operators import phase; "
        f"argv, pre = phase.die_with_parent({sleep!r}); "
        "p = subprocess.Popen(argv, start_new_session=True, preexec_fn=pre); "
        "print(p.pid, pre is None, flush=True); p.wait()"
    )
    task = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True, env=env)
    assert task.stdout is not None
    pid_text, vforked = task.stdout.readline().split()
    assert vforked == str(through_setpriv)
    pid = int(pid_text)
    os.kill(task.pid, 9)
    task.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        if Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z"):
            break  # dead, waiting for init to reap it
        time.sleep(0.05)
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().split(") ")[1].startswith("Z"), "the phase outlived its task"

    missing, pre = phase.die_with_parent(["no-such-simulator-binary", "--x"])
    assert missing == ["no-such-simulator-binary", "--x"] and pre is not None
    with pytest.raises(OSError):
        subprocess.Popen(missing, preexec_fn=pre)


def test_shard_phases_render_their_run_from_the_shard_conf_without_an_xcom_read() -> None:
    """A shard DAG's phases take the run descriptor from the shard run's conf (which load_shard checked
    first), rendered in the task process as Airflow renders any template: no execution-API call."""
    from types import SimpleNamespace

    from airflow.sdk import DAG

    from avsim.contracts import RUN_FROM_SHARD_CONF, RunDescriptor
    from avsim.dagbuild.factory import load_weekly_dags
    from avsim.errors import AvsimError
    from avsim.links import AvsimArtifactsLink
    from avsim.operators.phase import LocalPhaseOperator
    from avsim.phases.policy import Role

    root = Path(__file__).resolve().parents[2]
    shard = load_weekly_dags(catalog=root / "dags" / "avsim_graphs.yaml", dag_id="cost_probe", part="shard")
    dag = next(iter(shard.values()))
    phases = [t for t in dag.tasks if isinstance(t, LocalPhaseOperator) and t.role is not Role.ON_DEMAND]
    assert len(phases) > 5 and all(t.run == RUN_FROM_SHARD_CONF for t in phases)
    assert all("load_shard" not in t.upstream_task_ids for t in phases)

    run = {"run_key": "avsim_weekly__w49", "artifact_root": "file:///tmp/avsim <&> 'x'", "build_id": "b7"}
    with DAG(dag_id="render_probe", schedule=None):
        op = LocalPhaseOperator(
            task_id="simulate", phase="simulate", case={"case_id": "c1"}, run=RUN_FROM_SHARD_CONF
        )
    op.render_template_fields({"dag_run": SimpleNamespace(conf={"run": run, "shard": 1})})
    assert op.lifecycle.service.books.descriptor == RunDescriptor.model_validate(run)
    assert (
        AvsimArtifactsLink().get_link(op, ti_key=None)
        == "/avsim/runs/avsim_weekly__w49/files/cases/c1/simulate/"
    )

    with DAG(dag_id="render_probe_bad", schedule=None):
        bad = LocalPhaseOperator(
            task_id="simulate", phase="simulate", case={"case_id": "c1"}, run=RUN_FROM_SHARD_CONF
        )
    bad.render_template_fields({"dag_run": SimpleNamespace(conf=None)})
    with pytest.raises(AvsimError, match=r"no run descriptor.*started by the weekly run"):
        _ = bad.lifecycle.service.books.descriptor


def test_a_local_location_is_checked_without_registering_object_storage() -> None:
    """load_shard, cases_* and summarize check the run's artifact root: a file:// one needs no
    filesystem registry (it imported s3fs into each of them); any other scheme is still resolved."""
    code = (
        "import sys; from avsim.manifest.source import check_location; "
        "check_location('file:///tmp/avsim-artifacts', 'conf.run.artifact_root'); "
        "print('RESULT', 'airflow.providers.amazon.aws.fs.s3' in sys.modules); "
        "check_location('s3://aws_default@bucket/avsim', 'conf.run.artifact_root'); "
        "print('RESULT', 'airflow.providers.amazon.aws.fs.s3' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert [line.split()[1:] for line in out.splitlines() if line.startswith("RESULT ")] == [
        ["False"],
        ["True"],
    ]


def test_the_kubernetes_shard_dag_reads_the_settings_once_per_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each task process parses the shard DAG file: its Kubernetes phases take the cluster settings the
    DAG was built with, instead of reading ``[avsim]`` again for each of the file's phase tasks."""
    from avsim import settings as avsim_settings
    from avsim.dagbuild import factory
    from avsim.dagbuild.factory import load_weekly_dags
    from avsim.operators.kubernetes import KubernetesPhaseOperator

    monkeypatch.setenv("AIRFLOW__AVSIM__BACKEND", "kubernetes")
    monkeypatch.setenv("AIRFLOW__AVSIM__KUBERNETES_NAMESPACE", "sims-probe")
    read = avsim_settings.load_settings
    calls: list[int] = []
    counted = lambda: calls.append(1) or read()  # noqa: E731
    monkeypatch.setattr(avsim_settings, "load_settings", counted)
    monkeypatch.setattr(factory, "load_settings", counted)
    root = Path(__file__).resolve().parents[2]
    shard = load_weekly_dags(catalog=root / "dags" / "avsim_graphs.yaml", dag_id="kube_probe", part="shard")
    phases = [t for t in next(iter(shard.values())).tasks if isinstance(t, KubernetesPhaseOperator)]
    assert len(phases) > 5 and {t.namespace for t in phases} == {"sims-probe"}
    assert calls == [1]


def test_a_kubernetes_phase_renders_and_stores_only_what_its_pod_is_built_from() -> None:
    """Airflow renders, serializes and stores every template field in each task process (the phase's
    start and its resume): the stock operator's 22 (image, cmds, volumes, ...) never reach avsim's pod."""
    from airflow.sdk.execution_time.task_runner import _serialize_rendered_fields

    from avsim.operators.kubernetes import KubernetesPhaseOperator
    from avsim.settings import KubernetesSettings

    op = KubernetesPhaseOperator(
        task_id="simulate",
        phase="simulate",
        case={"case_id": "c1"},
        run={"run_key": "r"},
        kube=KubernetesSettings(namespace="sims"),
    )
    stored = _serialize_rendered_fields(op)
    assert set(stored) == {"namespace", "kubernetes_conn_id", "case", "run", "inputs"}
    assert (stored["namespace"], stored["case"]) == ("sims", {"case_id": "c1"})
