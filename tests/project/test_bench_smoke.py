"""`make bench` still runs: every section of benchmarks/ in smoke mode, in seconds.

No timing is asserted here (numbers from tiny samples on a shared machine mean
nothing); only that each section ran, reported a verdict per target, wrote its
results, and that the contention witness saw no overlapping tenures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.run import SECTIONS, main


@pytest.mark.timeout(300)
def test_benchmarks_run_in_smoke_mode(dsn: str, tmp_path: Path) -> None:
    assert main(["--smoke", "--dsn", dsn, "--out", str(tmp_path)]) == 0

    results = json.loads((tmp_path / "latest.json").read_text(encoding="utf-8"))
    assert results["smoke"] is True
    assert set(results["sections"]) == set(SECTIONS)
    assert {t["verdict"] for t in results["targets"]} <= {"PASS", "MISS", "N/A"}
    witness = results["sections"]["contention"]["data"]["witness"]
    assert witness["violations"] == 0
    assert witness["tenures_witnessed"] == witness["tenures_reported"] > 0
    assert "## Targets" in (tmp_path / "latest.md").read_text(encoding="utf-8")
