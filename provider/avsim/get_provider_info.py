"""Provider metadata for Airflow's providers manager (entry point ``apache_airflow_provider``).

Kept import-light: Airflow calls this while it reads its own configuration.
"""

from __future__ import annotations

from typing import Any

from avsim.settings import OPTIONS

__version__ = "0.1.0"


#: What the providers manager reads besides the ``[avsim]`` options.
_PROVIDER = {
    "package-name": "airflow-provider-avsim",
    "name": "avsim",
    "description": "Runs a self-driving-car simulation platform's weekly regression run on Airflow.",
    "versions": [__version__],
    "operators": [
        {
            "integration-name": "avsim",
            "python-modules": [
                "avsim.operators.phase",
                "avsim.operators.kubernetes",
                "avsim.operators.shard",
                "avsim.operators.shard_start",
                "avsim.operators.triage",
            ],
        }
    ],
    "sensors": [
        {
            "integration-name": "avsim",
            "python-modules": ["avsim.deadline.sensor", "avsim.sensors.canary_gate"],
        }
    ],
    "hooks": [
        {
            "integration-name": "avsim",
            "python-modules": ["avsim.hooks.airflow_api", "avsim.hooks.kubernetes"],
        }
    ],
    "connection-types": [
        {
            "hook-class-name": "avsim.hooks.airflow_api.AirflowApiHook",
            "connection-type": "avsim_airflow_api",
        }
    ],
    "triggers": [
        {
            "integration-name": "avsim",
            "python-modules": [
                "avsim.deadline.trigger",
                "avsim.triggers.phase_pod",
                "avsim.triggers.pass_commit",
                "avsim.triggers.canary",
                "avsim.triggers.shard_run",
                "avsim.triggers.admission",
                "avsim.triggers.triage",
            ],
        }
    ],
    "extra-links": ["avsim.links.AvsimArtifactsLink"],
    "plugins": [{"name": "avsim", "plugin-class": "avsim.plugin.AvsimPlugin"}],
    "integrations": [
        {
            "integration-name": "avsim",
            "external-doc-url": "https://github.com/avsim/airflow-provider-avsim",
            "tags": ["software"],
        }
    ],
}


def _config() -> dict[str, Any]:
    """The ``[avsim]`` section: every option of :data:`avsim.settings.OPTIONS`."""
    options = {
        key: {"description": desc, "version_added": "0.1.0", "type": typ, "example": None, "default": default}
        for key, (default, typ, desc) in OPTIONS.items()
    }
    return {"avsim": {"description": "Settings of the avsim weekly simulation run.", "options": options}}


def get_provider_info() -> dict[str, Any]:
    return {**_PROVIDER, "config": _config()}
