"""What every route of the avsim app shares: the bounds of the values a request names, the
metadata-database session, the artifact root and the path the API server is served under."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi import Path as PathParam
from sqlalchemy.orm import Session

from avsim import airflow_internals, urls
from avsim.ui import files

# Bounds of every value a request names: a bad one is a 422 naming the parameter, never a database
# error or a traceback (a NUL character or an integer past int32 would reach PostgreSQL).
_PRINTABLE = r"^[^\x00-\x1f\x7f]+$"
#: Airflow's ids (dag_id, run_id, task_id) are at most 250 characters (ID_LEN).
AirflowId = Annotated[str, PathParam(min_length=1, max_length=250, pattern=_PRINTABLE)]
#: A run key (``<dag_id>__<run_id>``, made path-safe) and a case id; files.check_* refine them.
RunKey = Annotated[str, PathParam(min_length=1, max_length=512, pattern=_PRINTABLE)]
CaseId = Annotated[str, PathParam(min_length=1, max_length=250, pattern=_PRINTABLE)]
#: A file's path inside a run's artifacts (files.resolve refuses what leaves the run).
FilePath = Annotated[str, PathParam(max_length=4096, pattern=r"^[^\x00-\x1f\x7f]*$")]
INT32_MAX = 2**31 - 1
MapIndex = Annotated[int, PathParam(ge=-1, le=INT32_MAX)]


def db_session() -> Iterator[Session]:
    """A metadata-database session for one request (the API server's own engine)."""

    with airflow_internals.create_session(scoped=False) as session:
        yield session


DbSession = Annotated[Session, Depends(db_session)]


def settings() -> Any:
    from avsim.settings import load_settings

    return load_settings()


def artifact_root() -> str:
    return str(settings().resolved_artifact_root)


def base(request: Request) -> str:
    """The path the API server is served under (``[api] base_url``'s path, usually empty)."""
    root = str(request.scope.get("root_path") or "")
    return root[: -len(urls.MOUNT)] if root.endswith(urls.MOUNT) else root


def refused(exc: files.RefusedPath) -> HTTPException:
    return HTTPException(400, str(exc))


@dataclass(frozen=True)
class Caches:
    """What one app keeps between requests (``app.state.avsim``): the finished shard runs' digests
    (:class:`avsim.ui.progress.DigestCache`), the ledger's timelines (:class:`avsim.ui.timeline.TimelineCache`)
    and the run keys' weekly runs (:class:`avsim.ui.routes_files.RunOwners`)."""

    digests: Any
    timelines: Any
    owners: Any


def caches(request: Request) -> Caches:
    found: Caches = request.app.state.avsim
    return found
