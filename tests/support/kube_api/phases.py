"""The loopback API as the phase tests use it: pods that run avsim-fakesim, and an Airflow connection."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .server import FakeKubeAPI


@contextlib.contextmanager
def phase_kube_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, namespace: str, conn_id: str = "avsim_kube"
) -> Iterator[FakeKubeAPI]:
    """The API, its kubeconfig in the Airflow connection ``conn_id``; checks it saw no error."""
    # The pods run the phase's command, avsim-fakesim, from this interpreter's environment.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    with FakeKubeAPI(workdir=tmp_path / "kube", env=env) as api:
        config = api.write_kubeconfig(tmp_path / "kubeconfig")
        for key, value in api.airflow_conn_env(conn_id, config, namespace=namespace).items():
            monkeypatch.setenv(key, value)
        yield api
    assert api.errors == [], api.errors
