"""``import pylease`` and the command line load asyncio and the database driver only when
a command needs them (a shell loop of ``pylease run`` pays for what it uses)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


COMMAND = """
import sys
from pathlib import Path
from pylease.cli import main
sys.argv = ["pylease", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
print("loaded:", *(m for m in LOOKED_FOR if m in sys.modules))
"""
LOOKED_FOR = ("pydantic", "yoyo", "psycopg", "psycopg_pool", "asyncio")
# What a command on SQLite has no use for: the driver, its pool, the event loop's package.
POSTGRES_OR_ASYNC = {"psycopg", "psycopg_pool", "asyncio"}


def loaded_by(args: list[str]) -> list[str]:
    """The modules of LOOKED_FOR that ``pylease ARGS`` loaded, run in a fresh process."""
    code = COMMAND.replace("LOOKED_FOR", repr(LOOKED_FOR))
    result = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.rsplit("loaded:", 1)[1].split()


def test_commands_load_neither_pydantic_nor_yoyo_where_they_need_neither(tmp_path: Path) -> None:
    # typer coerces values through pydantic, whose import costs a command more than all
    # the rest of its start-up; an already migrated SQLite file needs no yoyo.
    url = f"sqlite:///{tmp_path / 'leases.sqlite3'}"
    run = ["run", "job", "--ttl", "1m", "--busy-exit", "0", "--dsn", url, "--", "true"]
    loaded = {}
    for args in (["--help"], run, run, ["status", "--dsn", url]):
        loaded[args[0]] = loaded_by(args)
    assert loaded["--help"] == []
    assert "pydantic" not in loaded["run"] and "yoyo" not in loaded["run"]
    assert "pydantic" not in loaded["status"]


def test_commands_on_sqlite_load_neither_the_driver_nor_asyncio(tmp_path: Path) -> None:
    # Only a PostgreSQL target can be a psycopg object, and the sync API runs no event
    # loop: a shell loop of `pylease run` on SQLite must not pay for either at start-up.
    url = f"sqlite:///{tmp_path / 'leases.sqlite3'}"
    commands = [
        ["run", "job", "--ttl", "1m", "--dsn", url, "--", "true"],
        ["run", "a", "b", "--ttl", "1m", "--dsn", url, "--", "true"],
        ["run", "sem", "--max-permits", "2", "--ttl", "1m", "--dsn", url, "--", "true"],
        ["claim", "job", "--ttl", "1m", "--dsn", url],
        ["status", "--dsn", url],
        ["leader", "boss", "--ttl", "30s", "--dsn", url, "--", "true"],
    ]
    for args in commands:
        assert POSTGRES_OR_ASYNC.isdisjoint(loaded_by(args)), args


LIBRARY = """
import sys
import pylease
with pylease.lease(sys.argv[1], "job", "1m") as held:
    assert held.owned()
print("loaded:", *(m for m in ("psycopg", "psycopg_pool", "asyncio") if m in sys.modules))
"""


def test_a_lease_on_sqlite_loads_neither_the_driver_nor_asyncio(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'leases.sqlite3'}"
    result = subprocess.run(
        [sys.executable, "-c", LIBRARY, url], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.rsplit("loaded:", 1)[1].split() == []


HELP = """
import sys
from pylease.cli import main
sys.argv = ["pylease", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
from pylease.cli._app import COMMANDS
modules = {f"pylease.cli.{module}" for module, _summary in COMMANDS.values()}
print("loaded:", *sorted(m for m in modules if m in sys.modules))
"""


@pytest.mark.parametrize(
    ("args", "loads"),
    [(["--help"], []), (["run", "--help"], ["pylease.cli._permits", "pylease.cli._run"])],
)
def test_a_command_imports_only_its_own_module(args: list[str], loads: list[str]) -> None:
    # --help lists every command without importing one; run loads no view's, group's...
    result = subprocess.run(
        [sys.executable, "-c", HELP, *args], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.rsplit("loaded:", 1)[1].split() == loads


def test_the_driver_free_copies_of_libpq_statuses_are_libpqs() -> None:
    """The links read a caller's connection with libpq's status numbers written out, so as
    not to load the driver: they must be the numbers the driver (and
    pylease.postgres._conninfo.is_idle) reads."""
    from psycopg.pq import ConnStatus, TransactionStatus

    from pylease import _links, _links_async
    from pylease.postgres import _conninfo

    libpq = (int(ConnStatus.OK), int(TransactionStatus.IDLE))
    for module in (_links, _links_async, _conninfo):
        assert libpq == (module._OK, module._IDLE), module.__name__
