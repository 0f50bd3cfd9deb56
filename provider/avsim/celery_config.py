"""``[celery] celery_config_options = avsim.celery_config.CELERY_CONFIG``: Airflow's Celery configuration.

It adds a warm-up of the Celery worker that imports it: the worker, and only the worker, imports what
a phase task imports and checks the graph catalog before it forks
(:func:`avsim.dagbuild.preload.warm_celery_worker`). docs/design.md, "A Celery worker's warm-up".
"""

from __future__ import annotations

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

from avsim.dagbuild.preload import warm_celery_worker

CELERY_CONFIG = DEFAULT_CELERY_CONFIG

warm_celery_worker()
