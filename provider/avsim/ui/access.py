"""Who may see what on the avsim pages: the runs of the DAGs Airflow's auth manager lets them read.

Every route asks through a :class:`Reader` before it reads anything of a run, so a user without
read access to a DAG's runs gets 403 and no data, and lists hold only the runs they may read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fastapi import HTTPException

#: The body of every refusal: it says nothing of the run asked for.
FORBIDDEN = "Forbidden"


class Reader:
    """The requesting user's read access to DAG runs, asked once per DAG and request.

    ``may_read(dag_id)`` is the auth manager's answer (:func:`avsim.airflow_internals.may_read_dag_runs`
    for the request's user).
    """

    def __init__(self, may_read: Callable[[str], bool]) -> None:
        self._may_read = may_read
        self._answers: dict[str, bool] = {}

    def may_read(self, dag_id: str) -> bool:
        if dag_id not in self._answers:
            self._answers[dag_id] = bool(self._may_read(dag_id))
        return self._answers[dag_id]

    def readable(self, dag_ids: Iterable[str]) -> set[str]:
        return {d for d in set(dag_ids) if self.may_read(d)}

    def require(self, *dag_ids: str) -> None:
        """403 unless the user may read the runs of every one of ``dag_ids``."""
        if not all(self.may_read(d) for d in dict.fromkeys(dag_ids)):
            raise HTTPException(403, FORBIDDEN)


def reader_dependency() -> Callable[..., Reader]:
    """The FastAPI dependency that authenticates the request (Airflow's token or session cookie,
    refusing a missing, forged or expired one) and gives its :class:`Reader`."""
    from fastapi import Depends

    from avsim import airflow_internals

    user_dependency = airflow_internals.request_user()

    def reader(user: Any = Depends(user_dependency)) -> Reader:  # noqa: B008 - FastAPI's idiom
        return Reader(lambda dag_id: airflow_internals.may_read_dag_runs(user, dag_id))

    return reader
