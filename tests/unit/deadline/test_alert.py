"""The weekly run's Deadline Alert: its reference, its serialized form, and what a miss records."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from pathlib import Path

import pytest
import yaml

from avsim.artifacts import RunLayout, run_key_for
from avsim.deadline.alert import ALERT_NAME, deadline_alert, missed_uri, on_deadline_missed
from avsim.deadline.reference import AvsimRunDeadline, run_deadline
from avsim.settings import AvsimSettings, DeadlineSettings
from avsim.storage import write_json

MONDAY = dt.datetime(2026, 11, 30, 6, 0, tzinfo=dt.UTC)


def test_conf_deadline_wins_over_the_default() -> None:
    got = run_deadline({"deadline": "2026-12-06T19:00:00+01:00"}, MONDAY, 3600)
    assert got == dt.datetime(2026, 12, 6, 18, 0, tzinfo=dt.UTC)
    assert run_deadline({"manifest": "s3://x"}, MONDAY, 156 * 3600) == dt.datetime(
        2026, 12, 6, 18, tzinfo=dt.UTC
    )
    assert run_deadline(None, MONDAY, 60) == MONDAY + dt.timedelta(minutes=1)


def test_a_bad_conf_deadline_falls_back_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="avsim.deadline.reference"):
        for bad in ("sunday", "2026-12-06T18:00:00", 1765044000):
            assert run_deadline({"deadline": bad}, MONDAY, 3600) == MONDAY + dt.timedelta(hours=1)
    assert caplog.text.count("is not an ISO 8601 date-time with a time zone") == 3


def test_the_alert_survives_airflows_serialization() -> None:
    """As the dag-processor writes it and the scheduler reads it back (through the plugin registry)."""
    from airflow.serialization.decoders import decode_deadline_alert
    from airflow.serialization.definitions.deadline import SerializedReferenceModels
    from airflow.serialization.encoders import encode_deadline_alert

    alert = deadline_alert(AvsimSettings(deadline=DeadlineSettings(default_hours=2.5)))
    encoded = encode_deadline_alert(alert)
    assert encoded["reference"] == {
        "reference_type": "AvsimRunDeadline",
        "default_after_seconds": 9000.0,
        "__class_path": "avsim.deadline.reference.AvsimRunDeadline",
    }
    assert encoded["name"] == ALERT_NAME
    decoded = decode_deadline_alert(json.loads(json.dumps(encoded)))
    assert isinstance(decoded.reference, SerializedReferenceModels.SerializedCustomReference)
    assert decoded.reference.inner_ref == AvsimRunDeadline(default_after_seconds=9000.0)
    assert decoded.interval == dt.timedelta(0)
    assert decoded.callback.path == "avsim.deadline.alert.on_deadline_missed"


def test_a_dag_with_the_alert_serializes() -> None:
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization

    with DAG("alerted", schedule=None, deadline=deadline_alert(AvsimSettings())) as dag:
        pass
    data = DagSerialization.to_dict(dag)
    assert "AvsimRunDeadline" in json.dumps(data)


def _context(deadline: dt.datetime) -> dict[str, object]:
    # What the scheduler's Deadline.handle_miss hands the callback.
    return {
        "dag_run": {"dag_id": "avsim_weekly", "dag_run_id": "manual__w49", "state": "running", "conf": {}},
        "deadline": {"id": "0193", "deadline_time": deadline},
    }


def test_a_miss_is_recorded_with_the_trackers_latest_estimate(tmp_path: Path) -> None:
    root = f"file://{tmp_path}"
    layout = RunLayout(root, run_key_for("avsim_weekly", "manual__w49"))
    deadline = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10)
    write_json(layout.deadline_latest, {"seconds_late": 5400.0, "gpus_needed": 31, "reason": "late by 1.5 h"})
    out = asyncio.run(on_deadline_missed(context=_context(deadline), artifact_root=root))
    doc = json.loads(Path(missed_uri(layout.deadline_dir).removeprefix("file://")).read_text())
    assert doc["run_id"] == "manual__w49" and doc["dag_id"] == "avsim_weekly"
    assert doc["deadline"] == deadline.isoformat()
    assert doc["seconds_late"] == 5400.0, "the tracker's estimate is later than now"
    assert doc["latest_estimate"]["gpus_needed"] == 31
    # One line of text: Airflow keeps it in the callback table's text column ``output``.
    assert out == (
        f"avsim_weekly__manual__w49 missed its deadline {deadline.isoformat()} by 5400 s; "
        f"recorded {missed_uri(layout.deadline_dir)}"
    )


def test_a_miss_without_an_estimate_counts_from_the_deadline(tmp_path: Path) -> None:
    root = f"file://{tmp_path}"
    deadline = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10)
    ctx = _context(deadline)
    ctx["deadline"] = {"id": "0193", "deadline_time": deadline.isoformat()}  # as JSON, also accepted
    asyncio.run(on_deadline_missed(context=ctx, artifact_root=root))
    layout = RunLayout(root, run_key_for("avsim_weekly", "manual__w49"))
    doc = json.loads(Path(missed_uri(layout.deadline_dir).removeprefix("file://")).read_text())
    assert 590 < doc["seconds_late"] < 700 and doc["latest_estimate"] is None


# -- the manifest's deadline, found when the run is created -------------------------------------
# The defect: a run triggered on Thursday 2026-12-03 15:35 with conf {"manifest": ...} got the
# Deadline "run_after + 156 h" = 2026-12-10 03:35 in Airflow's Deadline panel, while its manifest
# (and the avsim page) said 2026-12-06 18:00.
THURSDAY = dt.datetime(2026, 12, 3, 15, 35, tzinfo=dt.UTC)
SUNDAY = dt.datetime(2026, 12, 6, 18, 0, tzinfo=dt.UTC)


def test_the_manifests_deadline_is_read_from_json_and_yaml() -> None:
    import yaml

    from avsim.deadline.reference import manifest_run_deadline
    from avsim.manifest.sample import sample_manifest

    doc = sample_manifest(50)
    doc["run"]["deadline"] = "2026-12-06T19:00:00+01:00"
    assert manifest_run_deadline(json.dumps(doc)) == SUNDAY
    assert manifest_run_deadline(json.dumps(doc).encode()) == SUNDAY
    # YAML with the run first (read up to the deadline only), and with the run after the cases.
    assert manifest_run_deadline(yaml.safe_dump(doc, sort_keys=False)) == SUNDAY
    assert manifest_run_deadline(yaml.safe_dump(doc, sort_keys=True)) == SUNDAY
    # Deadlines elsewhere (a case's, the build's) are not the run's.
    decoys = (
        "cases:\n- run: {deadline: 2030-01-01T00:00:00Z}\n"
        "run:\n  build: {deadline: 2031-01-01T00:00:00Z}\n  tags: [a, {deadline: x}]\n"
        "  deadline: 2026-12-06T18:00:00Z\n"
    )
    assert manifest_run_deadline(decoys) == SUNDAY
    assert manifest_run_deadline("run: {deadline: 2026-12-06T18:00:00Z}") == SUNDAY


def test_a_manifest_without_a_valid_deadline_gives_none() -> None:
    from avsim.deadline.reference import manifest_run_deadline

    for text in (
        "run:\n  name: x\ndeadline: 2026-12-06T18:00:00Z\n",  # not under run
        "run: {deadline: 2026-12-06T18:00:00}",  # no time zone
        '{"run": {"deadline": "sunday"}}',
        "{not json: [",
        "",
        "- a list",
    ):
        assert manifest_run_deadline(text) is None, text


class _Session:
    """What ``_evaluate_with`` asks of the session: the run's (conf, run_after, logical_date)."""

    def __init__(self, row: tuple[object, ...] | None) -> None:
        self.row = row

    def execute(self, _statement: object) -> _Session:
        return self

    def one_or_none(self) -> tuple[object, ...] | None:
        return self.row


def _write_manifest(tmp_path: Path, deadline: str) -> Path:
    from avsim.manifest.sample import sample_manifest

    doc = sample_manifest(20)
    doc["run"]["deadline"] = deadline
    target = tmp_path / "week.json"
    target.write_text(json.dumps(doc))
    return target


def test_a_run_triggered_with_a_manifest_gets_the_manifests_deadline(tmp_path: Path) -> None:
    """Through Airflow's own wrapper, as ``SerializedDAG._process_dagrun_deadline_alerts`` calls it."""
    from airflow.serialization.definitions.deadline import SerializedReferenceModels

    manifest = _write_manifest(tmp_path, "2026-12-06T18:00:00Z")
    ref = SerializedReferenceModels.SerializedCustomReference(AvsimRunDeadline())
    session = _Session(({"manifest": str(manifest)}, THURSDAY, None))
    got = ref.evaluate_with(
        session=session, interval=dt.timedelta(0), dag_id="avsim_weekly", run_id="manual__thu"
    )
    assert got == SUNDAY, "not run_after + 156 h (2026-12-10 03:35)"
    graced = ref.evaluate_with(
        session=session, interval=dt.timedelta(hours=1), dag_id="avsim_weekly", run_id="manual__thu"
    )
    assert graced == SUNDAY + dt.timedelta(hours=1)


def test_the_conf_deadline_still_wins_over_the_manifests(tmp_path: Path) -> None:
    manifest = _write_manifest(tmp_path, "2026-12-06T18:00:00Z")
    conf = {"manifest": str(manifest), "deadline": "2026-12-05T12:00:00Z"}
    got = AvsimRunDeadline()._evaluate_with(session=_Session((conf, THURSDAY, None)), dag_id="d", run_id="r")
    assert got == dt.datetime(2026, 12, 5, 12, tzinfo=dt.UTC)


def test_the_scheduled_run_reads_the_default_manifest_of_its_week(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    week = tmp_path / "2026-W49.json"
    week.write_text(_write_manifest(tmp_path, "2026-12-06T18:00:00Z").read_text())
    monkeypatch.setenv("AIRFLOW__AVSIM__DEFAULT_MANIFEST", str(tmp_path / "{iso_week}.json"))
    got = AvsimRunDeadline()._evaluate_with(session=_Session(({}, MONDAY, MONDAY)), dag_id="d", run_id="r")
    assert got == SUNDAY


def test_without_a_readable_manifest_the_default_applies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AIRFLOW__AVSIM__DEFAULT_MANIFEST", raising=False)
    ref = AvsimRunDeadline(default_after_seconds=3600)
    with caplog.at_level(logging.WARNING, logger="avsim.deadline.reference"):
        missing = {"manifest": str(tmp_path / "nowhere.json")}
        assert ref._evaluate_with(session=_Session((missing, THURSDAY, None)), dag_id="d", run_id="r") == (
            THURSDAY + dt.timedelta(hours=1)
        )
        none_given = ref._evaluate_with(session=_Session(({}, THURSDAY, None)), dag_id="d", run_id="r")
        assert none_given == THURSDAY + dt.timedelta(hours=1)
    assert "could not read the deadline of manifest" in caplog.text
    assert "no manifest to take the run's deadline from" in caplog.text


def test_an_inline_manifest_gives_its_deadline_and_a_bomb_only_the_fallback(tmp_path: Path) -> None:
    """A manifest pasted into the trigger form (conf ``manifest`` holds its text) has a deadline too;
    one the scheduler cannot parse (nested past Python's recursion limit) costs it only the fallback."""
    text = _write_manifest(tmp_path, "2026-12-06T18:00:00Z").read_text()
    ref = AvsimRunDeadline(default_after_seconds=3600)
    for inline in (text, yaml.safe_dump(json.loads(text))):
        got = ref._evaluate_with(
            session=_Session(({"manifest": inline}, THURSDAY, None)), dag_id="d", run_id="r"
        )
        assert got == SUNDAY
    bomb = '{"run": {"deadline": "2026-12-06T18:00:00Z"}, "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    yaml_bomb = "x: " + "[" * 100_000 + "]" * 100_000 + "\nrun: {deadline: 2026-12-06T18:00:00Z}\n"
    # (Before, the YAML walk compared the whole path at every event: ~10^10 steps here, in the scheduler.)
    for text in (bomb, yaml_bomb):
        got = ref._evaluate_with(
            session=_Session(({"manifest": text}, THURSDAY, None)), dag_id="d", run_id="r"
        )
        assert got == THURSDAY + dt.timedelta(hours=1)
