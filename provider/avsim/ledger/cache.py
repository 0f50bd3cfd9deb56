"""Reusing committed phase outputs: cheap reruns that do not recompute what is already known.

:func:`cache_key` hashes what a phase ran, what it read and its upstream phases' keys. A committed
result (passed or scenario_failed) is recorded at ``cache/<key>.json``, and a later attempt with the
same key commits that output instead of launching. Outputs are attempt-scoped and never overwritten, so
an entry holds while its run is kept. Bump :data:`CACHE_VERSION` when a change makes earlier results
unusable. docs/design.md, "Artifacts and reproducibility".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from avsim.artifacts import cache_uri
from avsim.contracts.case import CacheEntry, CaseEntry
from avsim.ledger.documents import DocumentStore
from avsim.ledger.records import OutcomeRecord

CACHE_VERSION = 1
#: The parts of a phase spec that decide its result (resources, timeouts and retries do not).
RESULT_FIELDS = ("command", "args", "checkpoint")


def cache_key(
    *,
    image: str,
    phase: str,
    spec: Mapping[str, Any],
    case: CaseEntry,
    upstream_keys: Mapping[str, str],
) -> str:
    """The cache key of one phase of one case (hex sha256)."""
    doc = {
        "v": CACHE_VERSION,
        "image_digest": image.rsplit("@", 1)[-1],
        "phase": phase,
        "spec": {k: spec.get(k) for k in RESULT_FIELDS},
        "seed": case.seed,
        "scenario": [case.scenario_uri, case.scenario_version],
        "parameters": case.parameters,
        "upstream": dict(sorted(upstream_keys.items())),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


class PhaseCache:
    """Cache entries under one artifact root."""

    def __init__(self, root: str, documents: DocumentStore | None = None) -> None:
        self.root = root
        self.documents = documents or DocumentStore()

    def lookup(self, key: str) -> CacheEntry | None:
        """The entry stored under ``key``; None when there is none (or it names no output)."""
        if not key:
            return None
        doc = self.documents.read(cache_uri(self.root, key))
        return CacheEntry.model_validate(doc) if isinstance(doc, dict) and doc.get("output_uri") else None

    def store(self, key: str, rec: OutcomeRecord) -> bool:
        """Record a committed result under its key; the first result stored for a key stays."""
        if not key or not rec.outcome.produced_output:
            return False
        entry = CacheEntry(
            key=key,
            outcome=rec.outcome,
            output_uri=rec.output_uri,
            result=dict(rec.result),
            run_key=rec.run_key,
            case_id=rec.case_id,
            phase=rec.phase,
            attempt=rec.attempt,
            committed_at=rec.committed_at,
        )
        return self.documents.create(cache_uri(self.root, key), entry.to_json())
