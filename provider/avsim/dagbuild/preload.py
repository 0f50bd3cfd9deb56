"""Import once, in the long-lived component, what every process it forks would import again.

A scheduler whose executor forks its task processes, a dag-processor, and a Celery worker (through
:mod:`avsim.celery_config`) import the DAG builder, the phase lifecycle, the ledger and the Kubernetes
clients once, check the graph catalog (:func:`check_catalog`) and register the object-storage
filesystems (:func:`warm_filesystems`); every other process is left as it is. A module that fails to
import is logged and skipped (docs/design.md, "Importing once, before forking").
"""

from __future__ import annotations

import importlib
import logging
import sys
import time
from typing import Any

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)

#: What a phase task imports beyond Airflow's task runner: the shard DAG's builder (its parse), the
#: phase lifecycle and what it imports when it runs.
PHASE_TASK_MODULES = (
    "avsim.dagbuild.factory",
    "avsim.dagbuild.shard_dag",
    "avsim.operators.phase",
    "avsim.ledger.store",
    "avsim.ledger.cache",
    "avsim.ledger.breaker",
    "avsim.metrics",
    "avsim.storage",
)
#: What parsing avsim's DAG files imports.
DAG_FILE_MODULES = ("avsim.dagbuild.factory", "avsim.dagbuild.shard_dag", "avsim.dagbuild.weekly")
#: The Kubernetes backend's phase operator (the stock operator and both Kubernetes clients).
KUBERNETES_MODULES = ("avsim.operators.kubernetes",)
#: Executors whose task processes are forked from the scheduler's own workers.
FORKING_EXECUTORS = ("LocalExecutor",)
#: A Celery worker (``airflow celery worker``), warmed through avsim's Celery configuration.
CELERY_WORKER = "celery worker"


def modules_for(command: str, backend: str, executor: str) -> tuple[str, ...]:
    """The modules worth importing in the component started by ``airflow <command>``."""
    kube = KUBERNETES_MODULES if backend == "kubernetes" else ()
    if command == "scheduler" and any(name in executor for name in FORKING_EXECUTORS):
        return PHASE_TASK_MODULES + kube
    if command == CELERY_WORKER:
        return PHASE_TASK_MODULES + kube
    if command == "dag-processor":
        return DAG_FILE_MODULES + kube
    return ()


def preload(modules: tuple[str, ...]) -> list[str]:
    """Import ``modules``; the ones that imported. Never raises."""
    done = []
    started = time.process_time()
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # a warm-up only: the task that needs the module reports the error
            log.warning("avsim preload: could not import %s", name, exc_info=True)
            continue
        done.append(name)
    if done:
        log.info("avsim preload: %d modules in %.2f CPU-s", len(done), time.process_time() - started)
    return done


def check_catalog(path: str) -> bool:
    """Read and check the graph catalog at ``path`` once, so that the processes forked from this one
    reuse it when their DAG file's parse reads the same text (:func:`avsim.plan.catalog.load_catalog`).
    Never raises: a missing or bad catalog is reported by the parse that needs it."""
    try:
        from avsim.plan.catalog import load_catalog

        load_catalog(path)
    except Exception as exc:
        log.info("avsim preload: graph catalog %s not checked ahead: %s", path, exc)
        return False
    return True


def warm_filesystems() -> bool:
    """Register the object-storage filesystems of the installed providers (``s3://`` imports s3fs and
    its AWS clients: about 0.1 CPU-second), as a task's first ``ObjectStoragePath`` would; the tasks
    forked from this process then find them registered. Never raises."""
    try:
        from airflow.sdk import ObjectStoragePath

        ObjectStoragePath("file:///").fs  # noqa: B018  (resolving a filesystem registers them all)
    except Exception as exc:  # a warm-up only
        log.info("avsim preload: object-storage filesystems not registered ahead: %s", exc)
        return False
    return True


def warm(command: str) -> list[str]:
    """Import what the processes ``command``'s component forks would import, and check the catalog;
    where phase tasks are forked, register the artifact store's filesystems too."""
    from avsim.settings import airflow_config, load_settings

    backend = airflow_config("avsim", "backend", "local")
    done = preload(modules_for(command, backend, airflow_config("core", "executor", "LocalExecutor")))
    if done:
        check_catalog(
            load_settings().resolved_graph_catalog(airflow_config("core", "dags_folder", "") or None)
        )
    if set(PHASE_TASK_MODULES) <= set(done):
        warm_filesystems()
    return done


@hookimpl
def on_starting(component: Any) -> None:
    """Airflow's listener hook: a job (scheduler, dag-processor, triggerer) or a task runner starts."""
    if type(component).__name__ != "Job":  # a task process, an API server: nothing to do
        return
    warm(sys.argv[1] if len(sys.argv) > 1 else "")


def warm_celery_worker(argv: list[str] | None = None) -> list[str]:
    """For ``airflow celery worker`` (:mod:`avsim.celery_config`): its pool processes are forked from it
    and fork one task process per task instance, so what it imports here every phase task has."""
    argv = sys.argv if argv is None else argv
    return warm(CELERY_WORKER) if argv[1:3] == ["celery", "worker"] else []
