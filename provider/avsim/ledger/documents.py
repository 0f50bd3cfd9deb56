"""Small JSON documents in the artifact store, written with compare-and-swap.

:class:`DocumentStore` reads, creates only if absent, updates with a function of the current value
(retried until no other writer got in between) and lists, over ObjectStoragePath URIs: ``file://`` with
an ``flock`` next to the document, ``s3://`` with conditional writes (``If-None-Match``, ``If-Match``)
through the URI's connection or ``aws_default``; S3 reads bypass s3fs's listing cache.
docs/design.md, "Where state lives" and "Run ids and the artifact layout".
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import glob
import json
import logging
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from avsim.errors import AvsimError
from avsim.storage import read_local, write_local

log = logging.getLogger(__name__)

#: Updates retried this many times when other writers keep winning.
MAX_UPDATE_ATTEMPTS = 50


class ConcurrentUpdateError(AvsimError):
    """A document kept changing under an update; the caller may retry later."""


@dataclass(frozen=True)
class _S3Location:
    conn_id: str | None
    bucket: str
    key: str


def _encode(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, default=str).encode()


class DocumentStore:
    """Compare-and-swap JSON documents; one instance serves any number of URIs."""

    def __init__(self) -> None:
        self._clients: dict[str | None, Any] = {}

    # -- public ---------------------------------------------------------------------------------
    def read(self, uri: str) -> Any | None:
        doc, _ = self._read_versioned(uri)
        return doc

    def list(self, folder: str, pattern: str) -> list[str]:
        """URIs of the documents under ``folder`` whose path below it matches ``pattern`` (``*``
        within one path segment, as in a glob: ``*.json``, ``*/result.json``); sorted."""
        if not folder.startswith("s3://"):
            local = _local_path(folder)
            found = glob.glob(os.path.join(glob.escape(local), pattern))
            prefix = folder[: len(folder) - len(local)]  # file:// or nothing
            return sorted(prefix + f for f in found if not f.endswith((".tmp", ".lock")))
        loc = _s3_location(folder.rstrip("/") + "/")
        client = self._client(loc.conn_id)
        depth = pattern.count("/")
        uris = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=loc.bucket, Prefix=loc.key):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(loc.key) :]
                if rel.count("/") == depth and fnmatch.fnmatchcase(rel, pattern):
                    uris.append(folder.rstrip("/") + "/" + rel)
        return sorted(uris)

    def create(self, uri: str, doc: Any) -> bool:
        """Write ``doc`` only if ``uri`` does not exist. False when it existed."""
        if uri.startswith("s3://"):
            return self._s3_put(uri, _encode(doc), if_none_match=True)
        path = _local_path(uri)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(_encode(doc))
        try:
            os.link(tmp, path)  # atomic create-if-absent
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def put(self, uri: str, doc: Any) -> None:
        """Write ``doc`` whatever is there (one writer per document: an attempt's own record)."""
        if uri.startswith("s3://"):
            self._s3_put(uri, _encode(doc))
            return
        path = _local_path(uri)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_local(path, _encode(doc))

    def update(self, uri: str, fn: Callable[[Any | None], Any | None]) -> Any | None:
        """Replace the document by ``fn(current)`` (``current`` is None when absent).

        ``fn`` may be called several times (when another writer won a race) and must not have
        side effects; when it returns ``None`` nothing is written. Returns what was written
        (or the unchanged current value when ``fn`` returned None).
        """
        if uri.startswith("s3://"):
            return self._s3_update(uri, fn)
        path = _local_path(uri)
        with self._locked(path):
            current = read_local(path)
            new = fn(current)
            if new is None:
                return current
            write_local(path, _encode(new))
            return new

    # -- file:// ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self, path: str) -> Iterator[None]:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    # -- s3:// -----------------------------------------------------------------------------------
    def _client(self, conn_id: str | None) -> Any:
        if conn_id not in self._clients:
            from airflow.providers.amazon.aws.hooks.s3 import S3Hook

            self._clients[conn_id] = S3Hook(aws_conn_id=conn_id or "aws_default").get_conn()
        return self._clients[conn_id]

    def _read_versioned(self, uri: str) -> tuple[Any | None, str | None]:
        if not uri.startswith("s3://"):
            return read_local(_local_path(uri)), None
        loc = _s3_location(uri)
        client = self._client(loc.conn_id)
        try:
            obj = client.get_object(Bucket=loc.bucket, Key=loc.key)
        except client.exceptions.NoSuchKey:
            return None, None
        return json.loads(obj["Body"].read()), str(obj["ETag"])

    def _s3_put(
        self, uri: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> bool:
        from botocore.exceptions import ClientError

        loc = _s3_location(uri)
        kwargs: dict[str, Any] = {"Bucket": loc.bucket, "Key": loc.key, "Body": body}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        try:
            self._client(loc.conn_id).put_object(**kwargs)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            # 412: the precondition failed; 409: a concurrent conditional write is in flight.
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                return False
            raise
        return True

    def _s3_update(self, uri: str, fn: Callable[[Any | None], Any | None]) -> Any | None:
        for attempt in range(MAX_UPDATE_ATTEMPTS):
            current, etag = self._read_versioned(uri)
            new = fn(current)
            if new is None:
                return current
            body = _encode(new)
            won = (
                self._s3_put(uri, body, if_none_match=True)
                if etag is None
                else self._s3_put(uri, body, if_match=etag)
            )
            if won:
                return new
            time.sleep(min(1.0, 0.01 * 2**attempt) * random.random())
        raise ConcurrentUpdateError(f"{uri}: changed by other writers {MAX_UPDATE_ATTEMPTS} times in a row")


def _local_path(uri: str) -> str:
    if uri.startswith("file://"):
        return uri[len("file://") :]
    if "://" in uri:
        raise AvsimError(
            f"{uri}: the artifact store supports file:// and s3:// for the ledger's atomic writes; "
            "set [avsim] artifact_root to one of them"
        )
    return uri


def _s3_location(uri: str) -> _S3Location:
    rest = uri[len("s3://") :]
    conn_id = None
    bucket_part, _, key = rest.partition("/")
    if "@" in bucket_part:
        conn_id, bucket_part = bucket_part.split("@", 1)
    return _S3Location(conn_id or None, bucket_part, key)
