"""What the ``avsim`` command's modules share: limits, the option checks and the domain-error line.

A domain error (an :class:`~avsim.errors.AvsimError`, or a file, connection or credential the
command could not use) ends any command with one line on stderr and exit status 1, no traceback;
a document with several problems lists them, one a line. Help texts are printed as written
(no Rich markup), so ``[avsim] artifact_root`` keeps its brackets.
"""

from __future__ import annotations

import math
from typing import Any

import typer
from typer.core import TyperGroup

from avsim.errors import AvsimError

#: The most slots (GPUs, CPUs, shard runs, tasks) a command takes: more is a typo, and the planner's
#: simulation would allocate for each.
MAX_SLOTS = 100_000
#: Cases of a demo week and of one shard: [avsim] max_manifest_cases's default (avsim.manifest.policy).
MAX_CASES = 100_000
#: Errors of the environment a user fixes, named by module and class so that none is imported here.
_ENVIRONMENT_ERRORS = {
    ("airflow.exceptions", "AirflowNotFoundException"),
    ("airflow.exceptions", "AirflowConfigException"),
    ("botocore.exceptions", "NoCredentialsError"),
    ("botocore.exceptions", "ClientError"),
    ("botocore.exceptions", "EndpointConnectionError"),
    ("sqlalchemy.exc", "OperationalError"),
}


def new_typer(help_text: str) -> typer.Typer:
    """A command group whose help prints its text as written."""
    return typer.Typer(help=help_text, no_args_is_help=True, rich_markup_mode=None)


def finite(value: float | None) -> float | None:
    """Refuse nan and inf, which click's FloatRange lets through (nan compares false with any bound)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number; give a number such as 0.5")
    return value


def is_domain_error(exc: BaseException) -> bool:
    if isinstance(exc, AvsimError | OSError):
        return True
    return any((cls.__module__, cls.__name__) in _ENVIRONMENT_ERRORS for cls in type(exc).__mro__)


def error_text(exc: BaseException) -> str:
    """The message of a domain error: one line, or a summary line and one line per problem."""
    problems = getattr(exc, "problems", None)
    if type(exc).__module__ == "sqlalchemy.exc":
        cause = " ".join(str(getattr(exc, "orig", None) or exc).split())
        return f"the Airflow metadata database: {cause}; check [database] sql_alchemy_conn, then airflow db migrate"
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        return f"{exc.filename}: {exc.strerror}"
    text = str(exc).strip() or type(exc).__name__
    head, _, _rest = text.partition("\n")
    if isinstance(problems, tuple) and len(problems) == 1 and head.endswith(": 1 problem"):
        return head.removesuffix("1 problem") + str(problems[0])
    if isinstance(problems, tuple) and len(problems) > 1:
        return text
    return " ".join(text.split())


class AvsimGroup(TyperGroup):
    """The root group: a domain error raised by any command becomes its one-line message."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            if not is_domain_error(exc):
                raise
            typer.secho(error_text(exc), fg=typer.colors.RED, err=True)
            raise typer.Exit(code=1) from None
