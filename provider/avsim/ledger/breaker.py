"""The circuit breaker of a simulator build: stop spending compute on a build that crashes.

One compare-and-swap document per build, keyed by image digest (:func:`avsim.artifacts.breaker_uri`)
and shared by every run and worker: a window over finished first attempts (preemptions left out), where
an attempt that counts against the build (:attr:`~avsim.phases.contract.Outcome.counts_against_build`)
is a failure. Past ``max_failure_ratio`` with ``min_finished`` attempts it opens, until
``avsim breaker reset DIGEST``. docs/design.md, "A bad build".
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from avsim.artifacts import breaker_uri
from avsim.ledger.documents import DocumentStore

log = logging.getLogger(__name__)

CLOSED = "closed"
OPEN = "open"


def image_digest(image: str) -> str:
    """The digest a breaker is keyed by: the part of a pinned image reference after ``@``."""
    return image.rsplit("@", 1)[-1]


@dataclass(frozen=True)
class BreakerConfig:
    enabled: bool = True
    window: int = 50
    min_finished: int = 20
    max_failure_ratio: float = 0.5

    @classmethod
    def from_head(cls, head: dict[str, Any]) -> BreakerConfig:
        """From a manifest snapshot head (``run.breaker``); defaults when absent."""
        spec = (head.get("run") or {}).get("breaker") or {}
        return cls(
            enabled=bool(spec.get("enabled", True)),
            window=int(spec.get("window", 50)),
            min_finished=int(spec.get("min_finished", 20)),
            max_failure_ratio=float(spec.get("max_failure_ratio", 0.5)),
        )


@dataclass(frozen=True)
class BreakerState:
    state: str
    failures: int
    finished: int
    reason: str = ""

    @property
    def is_open(self) -> bool:
        return self.state == OPEN


class Breaker:
    """The breaker of one build (``digest``), under the artifact root ``root``."""

    def __init__(
        self,
        root: str,
        digest: str,
        build_id: str = "",
        config: BreakerConfig | None = None,
        documents: DocumentStore | None = None,
    ) -> None:
        self.uri = breaker_uri(root, digest)
        self.digest = digest
        self.build_id = build_id
        self.config = config or BreakerConfig()
        self.documents = documents or DocumentStore()

    def document(self) -> dict[str, Any] | None:
        doc = self.documents.read(self.uri)
        return doc if isinstance(doc, dict) else None

    def state(self) -> BreakerState:
        doc = self.document() or {}
        return BreakerState(
            state=str(doc.get("state", CLOSED)),
            failures=int(doc.get("failures", 0)),
            finished=int(doc.get("finished", 0)),
            reason=str(doc.get("reason", "")),
        )

    def record(self, failed: bool, where: str) -> bool:
        """Add one finished first attempt to the window. True when this call opened the breaker."""
        if not self.config.enabled:
            return False
        tripped: list[bool] = []
        cfg = self.config

        def add(doc: Any | None) -> dict[str, Any]:
            tripped.clear()
            doc = dict(doc) if isinstance(doc, dict) else self._empty()
            window = [int(x) for x in doc.get("window", [])] + [1 if failed else 0]
            window = window[-cfg.window :]
            failures = sum(window)
            doc.update(
                window=window,
                failures=failures,
                finished=len(window),
                threshold=cfg.max_failure_ratio,
                window_size=cfg.window,
                min_finished=cfg.min_finished,
                updated_at=_now(),
            )
            if (
                doc.get("state", CLOSED) == CLOSED
                and len(window) >= cfg.min_finished
                and failures / len(window) > cfg.max_failure_ratio
            ):
                doc.update(
                    state=OPEN,
                    opened_at=_now(),
                    trips=int(doc.get("trips", 0)) + 1,
                    reason=(
                        f"{failures} of the last {len(window)} finished first attempts of build "
                        f"{self.build_id or self.digest} failed (threshold {cfg.max_failure_ratio:.0%}); "
                        f"last: {where}"
                    ),
                )
                tripped.append(True)
            return doc

        self.documents.update(self.uri, add)
        if tripped:
            log.error("circuit breaker OPEN for build %s (%s)", self.build_id or self.digest, self.digest)
        return bool(tripped)

    def trip(self, reason: str) -> bool:
        """Open the breaker now (the canary gate decided the build is bad). True when this call opened it.

        Attempts of this build that have not started then fail fast as ``bad_build``/``breaker_open``;
        ``avsim breaker reset`` closes it. Works whether or not the run's sliding window is enabled.
        """
        tripped: list[bool] = []

        def open_(doc: Any | None) -> dict[str, Any]:
            tripped.clear()
            doc = dict(doc) if isinstance(doc, dict) else self._empty()
            if doc.get("state", CLOSED) != OPEN:
                doc.update(state=OPEN, opened_at=_now(), trips=int(doc.get("trips", 0)) + 1, reason=reason)
                tripped.append(True)
            doc["updated_at"] = _now()
            return doc

        self.documents.update(self.uri, open_)
        if tripped:
            log.error(
                "circuit breaker OPEN for build %s (%s): %s",
                self.build_id or self.digest,
                self.digest,
                reason,
            )
        return bool(tripped)

    def reset(self, by: str = "") -> dict[str, Any]:
        """Close the breaker and empty its window (``avsim breaker reset``)."""

        def close(doc: Any | None) -> dict[str, Any]:
            doc = dict(doc) if isinstance(doc, dict) else self._empty()
            history = list(doc.get("resets", []))[-20:]
            history.append(
                {"at": _now(), "by": by, "was": doc.get("state", CLOSED), "reason": doc.get("reason", "")}
            )
            doc.update(
                state=CLOSED, window=[], failures=0, finished=0, reason="", resets=history, updated_at=_now()
            )
            return doc

        result = self.documents.update(self.uri, close)
        return dict(result or {})

    def _empty(self) -> dict[str, Any]:
        return {"digest": self.digest, "build_id": self.build_id, "state": CLOSED, "window": [], "trips": 0}


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()
