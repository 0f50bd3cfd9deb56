"""Who may see what on the avsim pages: the runs of the DAGs Airflow's auth manager lets them read.

Every route takes a :class:`Reader` (:data:`ReaderDep`) and asks it before it reads anything of a
run, so a user without read access to a DAG's runs gets 403 and no data, and lists hold only the
runs they may read. Imported by the app only, in the API server (it imports the server's security).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated, Any

from fastapi import Depends, HTTPException

from avsim import airflow_internals

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


def request_reader(user: Any = Depends(airflow_internals.request_user())) -> Reader:  # noqa: B008
    """The FastAPI dependency of every route: it authenticates the request as Airflow's API does (a
    token or the UI's session cookie; a missing, forged or expired one refused) and gives its Reader."""
    return Reader(lambda dag_id: airflow_internals.may_read_dag_runs(user, dag_id))


ReaderDep = Annotated[Reader, Depends(request_reader)]
