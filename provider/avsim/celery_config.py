"""``[celery] celery_config_options = avsim.celery_config.CELERY_CONFIG``: Airflow's own Celery
configuration, unchanged, and a warm-up of the Celery worker that imports it.

``airflow celery worker`` forks its pool processes from itself, and each of them forks one task
process per task instance, so whatever the worker imported before forking is every phase task's for
free. Airflow calls no listener when a Celery worker starts, but every Celery component imports this
configuration when it builds its Celery app; the worker (and only the worker) then imports what a
phase task imports and checks the graph catalog (:func:`avsim.dagbuild.preload.warm_celery_worker`).
The scheduler's CeleryExecutor and ``celery inspect`` import it too and do nothing more.
"""

from __future__ import annotations

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

from avsim.dagbuild.preload import warm_celery_worker

CELERY_CONFIG = DEFAULT_CELERY_CONFIG

warm_celery_worker()
