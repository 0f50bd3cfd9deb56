"""The domain exceptions of avsim.

One base type, :class:`AvsimError`; each subclass's message names where the
problem is and what to do about it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class AvsimError(Exception):
    """Base of every error avsim raises on purpose."""


@dataclass(frozen=True)
class Problem:
    """One problem in a document: where (a dotted path such as ``cases[412].graph``) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ManifestError(AvsimError):
    """A manifest (or DAG-run conf) was rejected. Carries every problem found, not just the first."""

    def __init__(self, problems: Iterable[Problem], source: str = "manifest") -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        self.source = source
        n = len(self.problems)
        lines = "\n".join(f"  {p}" for p in self.problems[:200])
        more = f"\n  ... and {n - 200} more" if n > 200 else ""
        super().__init__(f"{source} was rejected: {n} problem{'s' if n != 1 else ''}\n{lines}{more}")


class ConfigError(AvsimError):
    """The [avsim] configuration is wrong."""
