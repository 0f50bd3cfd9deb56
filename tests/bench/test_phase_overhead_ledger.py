"""bench/phase_overhead.py's in-process ledger section: every phase of one case passes under the contract."""

from __future__ import annotations

from pathlib import Path

from bench.phase_overhead import ledger_requests


def test_ledger_section_passes_every_phase_and_counts_its_requests(tmp_path: Path) -> None:
    per_phase = ledger_requests(tmp_path / "ledger")
    # A passed phase reads its result.json (the declared-output check) and writes its ledger records.
    assert per_phase["GET"] >= 1
    assert per_phase["PUT"] >= 1
    assert per_phase["xcom_pull"] > 0
