"""The model's decision table, replayed against the real SQL on PostgreSQL and SQLite.

``model/decisions.tsv`` is what the model's SQL inlines (``model/sql.pml``) decide for
every row state x operation x argument class; ``make model-check`` proves the table is
the model's. Here each line is set up as a lease row (the states' rows are read from
``model/decisions.pml``), the operation runs through the backend, and its result and the
row after it must be the table's. A tick is TICK of real time; the table runs at tick 10,
the database's now.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pylease._backend import Backend
from pylease.errors import FenceExhausted
from pylease.postgres import PostgresBackend
from pylease.sqlite import SqliteBackend, connect

MODEL = Path(__file__).resolve().parents[2] / "model"
TICK = timedelta(seconds=10)
NOW = 10  # the table's moment, in ticks (decisions.pml's NOW)
# How far a time may be from the table's: the statements run within milliseconds of the
# setup; a tick is ten seconds.
SLACK = timedelta(seconds=2)
FENCE_MAX = 2**63 - 1
HOLDERS = {"ME": "me", "OTHER": "other"}


def xfail_reason(backend: str, state: str, operation: str) -> str | None:
    """Why a line fails on the code as it is (None: it must pass). Items 5 and 17 of
    issue 21, which the table has fixed, are fixed in the code too (migration 0006)."""
    return None


@dataclass(frozen=True)
class Setup:
    """A row state as decisions.pml's put_row writes it (times in ticks)."""

    holder: str
    fence: int
    released: bool
    acquired: int
    expires: int


def _fence(text: str) -> int:
    return FENCE_MAX if text == "FENCE_MAX" else int(text)


def setups() -> dict[str, Setup | None]:
    """The row states of decisions.pml: ``printf("name"); put_row(H, F, R, A, E)``."""
    text = (MODEL / "decisions.pml").read_text(encoding="utf-8")
    found: dict[str, Setup | None] = {}
    pattern = r's == \d+ -> printf\("(\w+)"\)(?:;\s*put_row\((\w+), (\w+), (\d), (\d+), (\d+)\))?'
    for m in re.finditer(pattern, text):
        name, holder, fence, released, acquired, expires = m.groups()
        found[name] = (
            None
            if holder is None
            else Setup(HOLDERS[holder], _fence(fence), released == "1", int(acquired), int(expires))
        )
    return found


SETUPS = setups()


def table() -> list[list[str]]:
    lines = (MODEL / "decisions.tsv").read_text(encoding="utf-8").splitlines()
    return [line.split("\t") for line in lines[1:]]


def cases() -> list[Any]:
    out = []
    for backend in ("postgres", "sqlite"):
        for number, row in enumerate(table()):
            reason = xfail_reason(backend, row[0], row[1])
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(
                pytest.param(backend, number, row, id=f"{backend}-{row[0]}-{row[1]}", marks=marks)
            )
    return out


@pytest.fixture(scope="module")
def sqlite_conn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    conn = connect(tmp_path_factory.mktemp("model") / "decisions.sqlite3")
    yield conn
    conn.close()


def db_now(backend: Backend) -> datetime | float:
    if isinstance(backend, PostgresBackend):
        row = backend.conn.execute("SELECT clock_timestamp()").fetchone()
    else:
        assert isinstance(backend, SqliteBackend)
        row = backend.conn.execute(
            "SELECT round((julianday('now') - 2440587.5) * 86400.0, 3)"
        ).fetchone()
    assert row is not None
    value: datetime | float = row[0]
    return value


def put_row(backend: Backend, name: str, setup: Setup, now: datetime | float) -> None:
    """Write the row state behind the API's back, its times relative to ``now``."""

    def at(ticks: int) -> Any:
        offset = (ticks - NOW) * TICK
        return now + offset if isinstance(now, datetime) else now + offset.total_seconds()

    ttl = 6 * TICK
    values = (
        name,
        setup.holder,
        setup.fence,
        ttl if isinstance(backend, PostgresBackend) else ttl.total_seconds(),
        at(setup.acquired),
        at(setup.acquired),
        at(setup.expires),
        setup.released,
    )
    columns = "name, holder, fence, ttl, acquired_at, renewed_at, expires_at, released"
    if isinstance(backend, PostgresBackend):
        backend.conn.execute(
            f"INSERT INTO pylease_leases ({columns}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            values,
        )
    else:
        assert isinstance(backend, SqliteBackend)
        backend.conn.execute(
            f"INSERT INTO pylease_leases ({columns}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", values
        )


def fenced_release(backend: Backend, name: str, fence: int) -> bool:
    """``lease_release(name, holder, min_hold, fence)`` (contract 5.6), on either backend."""
    return backend.release(name, "me", None, fence)


def run(backend: Backend, name: str, operation: str) -> Any:
    """Run ``claim(me,ttl=6)``-style operations of the table; FenceExhausted as 54000."""
    m = re.fullmatch(r"(\w+)\(me(?:,(\w+)=(\d+))?\)", operation)
    assert m is not None, operation
    verb, key, number = m.groups()
    ticks = None if number is None else int(number) * TICK
    try:
        if verb == "claim":
            assert ticks is not None
            return backend.claim(name, ticks, "me")
        if verb == "steal":
            assert ticks is not None
            return backend.steal(name, ticks, "me")
        if verb == "renew" and key == "fence":
            # The keeper's renewal names its tenure (migration 0012).
            assert number is not None
            [renewal] = backend.renew_held(["lease"], [name], ["me"], [None], [int(number)])
            return renewal.renewed
        if verb == "renew":
            return backend.renew(name, "me", ticks)
        if verb == "release" and key == "fence":
            assert number is not None
            return fenced_release(backend, name, int(number))
        if verb == "release":
            return backend.release(name, "me", ticks)
        if verb == "holds":
            assert number is not None
            return backend.holds(name, "me", int(number))
        if verb == "request_release":
            # An operator's step-down request (migration 0016), made by "me".
            return backend.request_release(name, "me")
    except FenceExhausted:
        return "54000"
    raise AssertionError(f"no such operation in the table: {operation}")


def expected_result(text: str) -> Any:
    return {"NULL": None, "t": True, "f": False, "54000": "54000", "MAX": FENCE_MAX}.get(
        text, int(text) if text.isdigit() else text
    )


@pytest.mark.parametrize(("kind", "number", "line"), cases())
def test_decision(kind: str, number: int, line: list[str], request: pytest.FixtureRequest) -> None:
    state, operation, result, holder, fence, state_after, expires_after = line
    backend: Backend
    if kind == "postgres":
        backend = PostgresBackend(request.getfixturevalue("module_conn"))
    else:
        backend = SqliteBackend(request.getfixturevalue("sqlite_conn"))
    name = f"decision-{number}"
    now = db_now(backend)
    setup = SETUPS[state]
    if setup is not None:
        put_row(backend, name, setup, now)

    got = run(backend, name, operation)
    assert got == expected_result(result), (state, operation)

    rows = backend.status(name)
    if holder == "-":
        assert rows == [], (state, operation)
        return
    assert len(rows) == 1
    after = rows[0]
    assert (after.holder, after.fence, after.state) == (
        holder,
        expected_result(fence),
        state_after,
    ), (state, operation)
    start = (
        now
        if isinstance(now, datetime)
        else datetime.fromtimestamp(now, tz=after.expires_at.tzinfo)
    )
    ahead = after.expires_at - start
    ticks = int(expires_after)
    if ticks > 0:
        assert abs(ahead - ticks * TICK) <= SLACK, (state, operation, ahead)
    else:
        assert ahead <= SLACK, (state, operation, ahead)


def test_table_covers_every_state_and_operation() -> None:
    """The table is the full product, so a state or operation the model drops shows here."""
    lines = table()
    states = {line[0] for line in lines}
    operations = {line[1] for line in lines}
    assert states == set(SETUPS)
    assert len(lines) == len(states) * len(operations)
    assert {"free", "held_by_caller", "held_by_other", "expired_caller", "released"} <= states
    assert {"resting", "stolen", "exhausted"} <= states
