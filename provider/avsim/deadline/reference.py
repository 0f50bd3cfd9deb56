"""The weekly run's deadline as an Airflow deadline reference (evaluated when the run is created).

In order: the run's conf ``deadline``; the ``run.deadline`` of the manifest the run will prepare (only
its ``run`` section read, nothing validated); else ``run_after`` plus ``[avsim] deadline_default_hours``,
with a warning. Registered by the avsim plugin (``deadline_references``). Why it reads the manifest
itself: docs/design.md, "The deadline" (*The reference*).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.sdk.definitions.deadline import BaseDeadlineReference

from avsim import airflow_internals

if TYPE_CHECKING:
    from avsim.manifest.source import ManifestSource

log = logging.getLogger(__name__)

#: The key of a run's conf that sets its deadline.
CONF_KEY = "deadline"


def parse_conf_deadline(value: object) -> dt.datetime | None:
    """A conf ``deadline``: an ISO 8601 date-time with a time zone; anything else is None."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def manifest_run_deadline(text: str | bytes) -> dt.datetime | None:
    """``run.deadline`` of a manifest's text (JSON or YAML), without reading or validating the rest.

    None when the text has no ``run.deadline`` that is an ISO 8601 date-time with a time zone.
    """
    import json

    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    text = text.removeprefix("\ufeff")
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except RecursionError:
            return None  # nested past the parser's limit: prepare refuses it, naming the limit
        except ValueError:
            doc = None  # flow-style YAML also starts with "{"
        if isinstance(doc, dict):
            run = doc.get("run")
            return _as_deadline(run.get("deadline") if isinstance(run, dict) else None)
    return _as_deadline(_yaml_run_deadline(text))


def _as_deadline(value: object) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo is not None else None
    return parse_conf_deadline(value)


def _yaml_run_deadline(text: str) -> object:
    """The scalar at ``run.deadline`` of a YAML document, reading its events only up to it."""
    import yaml

    from avsim.manifest.prescan import MAX_DEPTH

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    # One frame per open mapping or sequence: [is a mapping, its current key, next node is a key].
    stack: list[list[Any]] = []

    def value_done() -> None:
        if stack and stack[-1][0]:
            stack[-1][2] = True

    try:
        for event in yaml.parse(text, Loader=loader):
            if isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
                stack.pop()
                if len(stack) == 1 and stack[0][0] and stack[0][1] == "run":
                    return None  # the run section ended without a deadline
                value_done()
                continue
            if not isinstance(event, yaml.NodeEvent):
                continue
            top: list[Any] = stack[-1] if stack else [False, None, False]
            is_key = bool(top[0] and top[2])
            if is_key and isinstance(event, yaml.ScalarEvent):
                top[1], top[2] = event.value, False
                continue
            # Only ``run.deadline`` is wanted: the path is compared at depth 2 only (O(1) per event).
            if (
                not is_key
                and isinstance(event, yaml.ScalarEvent)
                and len(stack) == 2
                and all(f[0] for f in stack)
                and [f[1] for f in stack] == ["run", "deadline"]
            ):
                return event.value
            if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
                if is_key:  # a complex key: never "run"
                    top[1], top[2] = None, False
                stack.append([isinstance(event, yaml.MappingStartEvent), None, True])
                if len(stack) > MAX_DEPTH:
                    return None  # deeper than a manifest may nest: prepare refuses it, naming the limit
            elif not is_key:
                value_done()
    except yaml.YAMLError:
        return None
    return None


def manifest_deadline(source: str | ManifestSource, max_bytes: int) -> dt.datetime | None:
    """``run.deadline`` of the manifest ``source`` (its text, or a path or ObjectStoragePath URI), or None."""
    from avsim.manifest.source import ManifestSource as Source

    given = Source.of(source)
    try:
        return manifest_run_deadline(given.read(max_bytes))
    except Exception as exc:  # any failure to read: the run still gets a deadline
        log.warning(
            "could not read the deadline of manifest %s (%s); using the fallback", given.name, str(exc)[:200]
        )
        return None


def run_deadline(
    conf: dict[str, Any] | None,
    run_after: dt.datetime,
    default_after_seconds: float,
    manifest: dt.datetime | None = None,
) -> dt.datetime:
    """The deadline of a run: its conf ``deadline`` when valid, else the manifest's (``manifest``),
    else ``run_after`` plus the default."""
    raw = (conf or {}).get(CONF_KEY)
    parsed = parse_conf_deadline(raw)
    if raw is not None and parsed is None:
        log.warning(
            "dag run conf %s=%r is not an ISO 8601 date-time with a time zone (e.g. '2026-12-06T18:00:00Z'); "
            "using the manifest's deadline or run_after + %.0f s instead",
            CONF_KEY,
            raw,
            default_after_seconds,
        )
    if parsed is not None:
        return parsed.astimezone(dt.UTC)
    if manifest is not None:
        return manifest.astimezone(dt.UTC)
    return run_after + dt.timedelta(seconds=default_after_seconds)


@dataclass(frozen=True)
class AvsimRunDeadline(BaseDeadlineReference):
    """The run's conf ``deadline``, else its manifest's ``run.deadline``, else its ``run_after`` plus
    ``default_after_seconds``."""

    default_after_seconds: float = 156 * 3600.0  # Monday 06:00 -> Sunday 18:00

    #: What Airflow passes to ``_evaluate_with`` (it filters its keyword arguments by this set).
    required_kwargs = frozenset({"dag_id", "run_id"})

    def serialize_reference(self) -> dict[str, Any]:
        return {**super().serialize_reference(), "default_after_seconds": self.default_after_seconds}

    @classmethod
    def deserialize_reference(cls, reference_data: dict[str, Any]) -> AvsimRunDeadline:
        return cls(default_after_seconds=float(reference_data.get("default_after_seconds", 156 * 3600.0)))

    def _evaluate_with(self, *, session: Any, **kwargs: Any) -> dt.datetime | None:
        DagRun = airflow_internals.models()["DagRun"]
        from sqlalchemy import select

        row = session.execute(
            select(DagRun.conf, DagRun.run_after, DagRun.logical_date).where(
                DagRun.dag_id == kwargs["dag_id"], DagRun.run_id == kwargs["run_id"]
            )
        ).one_or_none()
        if row is None:
            log.warning("no dag run %s/%s to take a deadline from", kwargs["dag_id"], kwargs["run_id"])
            return None
        conf, run_after, logical_date = row
        conf = conf if isinstance(conf, dict) else None
        manifest = None
        if parse_conf_deadline((conf or {}).get(CONF_KEY)) is None:
            manifest = self._manifest_deadline(conf, logical_date or run_after)
        return run_deadline(conf, run_after, self.default_after_seconds, manifest)

    @staticmethod
    def _manifest_deadline(conf: dict[str, Any] | None, when: dt.datetime | None) -> dt.datetime | None:
        """The deadline of the manifest ``prepare`` will read for this run, or None."""
        from avsim.manifest.source import manifest_source
        from avsim.settings import load_settings

        settings = load_settings()
        try:
            source = manifest_source(dict(conf or {}), settings, when)
        except Exception as exc:  # no manifest given, or a refused location: prepare says why
            log.warning("no manifest to take the run's deadline from (%s); using the fallback", exc)
            return None
        return manifest_deadline(source, settings.max_manifest_bytes)
