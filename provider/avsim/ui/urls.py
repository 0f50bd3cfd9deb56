"""Moved to :mod:`avsim.urls` (the phases' extra link builds its URL there without importing
``avsim.ui``). Kept for the pages' ``from avsim.ui import urls`` until they import ``avsim.urls``."""

from avsim.urls import (  # noqa: F401
    MOUNT,
    airflow_run,
    airflow_task_instance,
    app_base,
    case_page,
    phase_artifacts,
    progress_api,
    progress_page,
    report_page,
    run_file,
)
