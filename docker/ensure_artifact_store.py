"""Create the artifact store's bucket if it is missing, then prove that a component can use it.

Run by the compose stack's init service (docker/airflow-init.sh) with the components' own
environment, so it goes through exactly what they will use: ``[avsim] artifact_root``
(``s3://<conn_id>@<bucket>/<prefix>``), the connection that names (``AIRFLOW_CONN_AVSIM_S3``), and,
when remote logging is on, ``[logging] remote_base_log_folder`` with ``remote_log_conn_id``.
Idempotent: an existing bucket is left as it is. Exit status 0 on success, 1 with the reason.
"""

from __future__ import annotations

import sys
import uuid
from urllib.parse import urlsplit


def s3_bucket(uri: str, default_conn_id: str) -> tuple[str, str] | None:
    """(connection id, bucket) of an ``s3://[conn_id@]bucket/...`` URI; None for other schemes."""
    parts = urlsplit(uri)
    if parts.scheme not in ("s3", "s3a", "s3n") or not parts.hostname:
        return None
    return (parts.username or default_conn_id, parts.hostname)


def ensure_bucket(conn_id: str, bucket: str) -> bool:
    """Create ``bucket`` through connection ``conn_id`` unless it exists; True if it was created."""
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    hook = S3Hook(aws_conn_id=conn_id)
    if hook.check_for_bucket(bucket):
        return False
    hook.create_bucket(bucket_name=bucket)
    return True


def probe(root: str) -> str:
    """Write, read back and delete one object under ``root``; return its URI."""
    from airflow.sdk import ObjectStoragePath

    path = ObjectStoragePath(root) / ".avsim-probe" / f"{uuid.uuid4().hex}.txt"
    token = uuid.uuid4().hex
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token)
    if path.read_text() != token:
        raise RuntimeError(f"{path} read back something else than was written")
    path.unlink()
    return str(path)


def main() -> int:
    from airflow.configuration import conf

    from avsim.settings import load_settings

    root = load_settings().resolved_artifact_root
    targets: list[tuple[str, str]] = []
    artifacts = s3_bucket(root, "aws_default")
    if artifacts:
        targets.append(artifacts)
    if conf.getboolean("logging", "remote_logging", fallback=False):
        logs = s3_bucket(
            conf.get("logging", "remote_base_log_folder", fallback=""),
            conf.get("logging", "remote_log_conn_id", fallback="") or "aws_default",
        )
        if logs:
            targets.append(logs)
    try:
        for conn_id, bucket in dict.fromkeys(targets):
            created = ensure_bucket(conn_id, bucket)
            print(f"bucket {bucket} (connection {conn_id}): {'created' if created else 'exists'}")
        print(f"artifact root {root}: wrote, read and deleted {probe(root)}")
    except Exception as exc:
        print(
            f"artifact store {root} is not usable: {type(exc).__name__}: {exc}\n"
            "Check the connection named in [avsim] artifact_root (AIRFLOW_CONN_AVSIM_S3 in "
            "docker-compose.yml: endpoint_url, login = access key, password = secret key) and that "
            "the S3 service is healthy.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
