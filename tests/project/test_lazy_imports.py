"""``import pylease`` and the command line load asyncio and the database driver only when
a command needs them (a shell loop of ``pylease run`` pays for what it uses)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("asyncio", "psycopg", "pylease.leasing", "pylease._links")


@pytest.mark.parametrize("module", ["pylease", "pylease.cli"])
def test_importing_loads_neither_asyncio_nor_the_driver(module: str) -> None:
    code = f"import sys, {module}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == []


def test_the_public_names_are_there_when_asked_for() -> None:
    code = (
        "import pylease, inspect; "
        "assert inspect.isfunction(pylease.lease) and inspect.isfunction(pylease.aleader); "
        "assert pylease.Held.__name__ == 'Held'; "
        "assert sorted(dir(pylease)) == sorted(pylease.__all__); print('ok')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip() == "ok", result.stderr
