"""Test-wide setup: a throwaway AIRFLOW_HOME so no test reads or writes a user's Airflow."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_home = Path(tempfile.mkdtemp(prefix="avsim-test-airflow-"))
os.environ.setdefault("AIRFLOW_HOME", str(_home))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(ROOT / "dags"))
os.environ.setdefault("AIRFLOW__CORE__PLUGINS_FOLDER", str(ROOT / "plugins"))
os.environ.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{_home / 'airflow.db'}")
sys.path.insert(0, str(ROOT))


@pytest.fixture
def s3_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A real S3 API (moto's server) on loopback with bucket ``avsim``; yields its endpoint URL.

    The AWS environment points at it, and the Airflow connection ``avsim_s3`` too, so both
    plain ``s3://avsim/...`` (fsspec) and ``s3://avsim_s3@avsim/...`` (ObjectStoragePath) work.
    """
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        for k, v in {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": url,
            "AIRFLOW_CONN_AVSIM_S3": json.dumps({"conn_type": "aws", "extra": {"endpoint_url": url}}),
        }.items():
            monkeypatch.setenv(k, v)
        boto3.client("s3", endpoint_url=url).create_bucket(Bucket="avsim")
        yield url
    finally:
        server.stop()
