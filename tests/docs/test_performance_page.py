"""docs/performance.md is what scripts/performance_page.py makes of the latest results."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "performance_page", ROOT / "scripts" / "performance_page.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_is_generated_from_the_latest_results() -> None:
    assert _script().main(["--check"]) == 0, "run: python scripts/performance_page.py"


def test_the_prose_quotes_the_run_it_is_generated_from() -> None:
    page = _script()
    results = json.loads((ROOT / "benchmarks" / "results" / "latest.json").read_text())
    other = copy.deepcopy(results)
    other["sections"]["cycle"]["data"]["wal_flush_seconds"] = 0.000777
    other["sections"]["heartbeat"]["data"]["tick_seconds"]["100"]["median"] = 0.0042
    text = page.render(other)
    assert "a flush cost 777 µs" in text
    assert "4.20 ms for 100" in text
    assert "a flush cost 777 µs" not in page.render(results)
