"""The immutable manifest snapshot of a run, in the artifact store.

Three objects under ``<run>/manifest/``: ``manifest.json`` (the validated manifest's canonical JSON),
``head.json`` (the same without ``cases``, plus ``case_count``) and ``sha256``, written last as the
commit point. A committed snapshot with the same digest is kept (a task retry); one with another digest
is never replaced (:class:`~avsim.errors.AvsimError`); :func:`read_snapshot` checks the digest.
docs/design.md, "Artifacts and reproducibility".
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from avsim.artifacts import RunLayout
from avsim.errors import AvsimError
from avsim.manifest.loader import LoadedManifest, parse_manifest_text

_HEX64 = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class SnapshotInfo:
    uri: str
    head_uri: str
    sha256: str
    case_count: int


def head_document(loaded: LoadedManifest) -> dict[str, Any]:
    """The manifest without its cases (run, graphs, run_phases, apiVersion) plus ``case_count``."""
    doc = loaded.manifest.model_dump(mode="json", by_alias=True, exclude={"cases"})
    doc["case_count"] = len(loaded.manifest.cases)
    return doc


def write_snapshot(loaded: LoadedManifest, layout: RunLayout) -> SnapshotInfo:
    """Write the run's manifest snapshot once; a retry with the same manifest is a no-op."""
    info = SnapshotInfo(
        uri=layout.manifest_uri,
        head_uri=layout.head_uri,
        sha256=loaded.sha256,
        case_count=len(loaded.manifest.cases),
    )
    digest_path = _path(layout.digest_uri)
    manifest_path = _path(layout.manifest_uri)
    head_path = _path(layout.head_uri)
    if digest_path.exists():
        existing = _read_digest(digest_path, layout)
        if existing != loaded.sha256:
            raise AvsimError(
                f"run {layout.run_key!r} already has a manifest snapshot at {layout.manifest_uri} with sha256 "
                f"{existing}, this manifest has sha256 {loaded.sha256}: a run's manifest snapshot is "
                "immutable; start a new run for the changed manifest"
            )
        # Committed with the same content: fill in a part only if it has gone missing.
        if not manifest_path.exists():
            manifest_path.write_bytes(loaded.canonical_json)
        if not head_path.exists():
            head_path.write_bytes(_canonical(head_document(loaded)))
        return info
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    manifest_path.write_bytes(loaded.canonical_json)
    head_path.write_bytes(_canonical(head_document(loaded)))
    digest_path.write_text(loaded.sha256 + "\n")
    return info


def read_snapshot(layout: RunLayout) -> LoadedManifest:
    """The run's manifest as snapshotted; the content is checked against the committed digest."""
    digest_path = _path(layout.digest_uri)
    if not digest_path.exists():
        raise AvsimError(
            f"run {layout.run_key!r} has no manifest snapshot at {layout.manifest_dir} (no sha256); "
            "the run's prepare task writes it: run or clear that task first"
        )
    expected = _read_digest(digest_path, layout)
    try:
        body: bytes = _path(layout.manifest_uri).read_bytes()
    except FileNotFoundError:
        raise AvsimError(
            f"run {layout.run_key!r}: the manifest snapshot {layout.manifest_uri} is missing although its "
            "sha256 is committed; clear the run's prepare task to rewrite it"
        ) from None
    actual = hashlib.sha256(body).hexdigest()
    if actual != expected:
        raise AvsimError(
            f"run {layout.run_key!r}: the manifest snapshot {layout.manifest_uri} has sha256 {actual} but "
            f"{expected} was committed; the snapshot was changed or damaged after it was written"
        )
    loaded = parse_manifest_text(body, source=layout.manifest_uri, fmt="json")
    # The run's identity is the committed snapshot, even if this provider version would
    # canonicalise the manifest differently (new defaults, say).
    return LoadedManifest(
        manifest=loaded.manifest,
        raw=loaded.raw,
        source=layout.manifest_uri,
        sha256=expected,
        canonical_json=body,
    )


def read_head(layout: RunLayout) -> dict[str, Any]:
    """The snapshot's head: run, graphs, run_phases, apiVersion and case_count, without the cases."""
    try:
        head: dict[str, Any] = json.loads(_path(layout.head_uri).read_text())
    except FileNotFoundError:
        raise AvsimError(
            f"run {layout.run_key!r} has no manifest snapshot head at {layout.head_uri}; "
            "the run's prepare task writes it: run or clear that task first"
        ) from None
    return head


def _read_digest(path: Any, layout: RunLayout) -> str:
    text = str(path.read_text()).strip()
    if len(text) != 64 or not set(text) <= _HEX64:
        raise AvsimError(
            f"run {layout.run_key!r}: {layout.digest_uri} does not hold a sha256 hex digest ({text[:80]!r}); "
            "the snapshot is damaged; start a new run"
        )
    return text


def _canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _path(uri: str) -> Any:
    from airflow.sdk import ObjectStoragePath

    return ObjectStoragePath(uri)
