"""The lease block releases its own tenure only (issue 21, item 17; contract 5.6).

A holder named explicitly may hold the same name again: in this process's next
block, or in another process that uses the same holder. A late release of the
earlier tenure (its block gave up waiting for it, the statement ran later) must
leave the later tenure held, so that nobody else is granted the name meanwhile.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pylease import LeaseLost, alease, lease
from pylease._resources import data_dir
from pylease.postgres import PostgresBackend
from pylease.sqlite import SqliteBackend
from pylease.sqlite import connect as sqlite_connect
from tests.support.leases import claim, status, steal

Conn = psycopg.Connection[Any]
MINUTE = timedelta(minutes=1)


def test_a_late_release_of_block_one_leaves_block_two_of_the_same_holder_held(
    dsn: str, conn2: Conn
) -> None:
    with lease(dsn, "job", ttl=60, holder="H", heartbeat=False) as first:
        pass
    with lease(dsn, "job", ttl=60, holder="H", heartbeat=False) as second:
        assert second.fence > first.fence
        # Block 1's release, as its block sends it, arriving after block 2's claim.
        assert PostgresBackend(conn2).release("job", "H", None, first.fence) is False
        second.check()
        assert claim(conn2, "job", holder="other") is None
        row = status(conn2, "job")
        assert row is not None and (row["holder"], row["fence"], row["held"]) == (
            "H",
            second.fence,
            True,
        )


def test_leaving_a_block_never_releases_a_later_tenure_of_its_holder(
    conn: Conn, conn2: Conn
) -> None:
    with pytest.raises(LeaseLost), lease(conn, "job", ttl=60, holder="H", heartbeat=False) as held:
        # A later tenure of the same holder (another process using it), granted
        # before this block's release arrives.
        later = steal(conn2, "job", holder="H")
        assert later == held.fence + 1
    row = status(conn2, "job")
    assert row is not None and (row["holder"], row["fence"], row["held"]) == ("H", later, True)
    assert claim(conn2, "job", holder="other") is None


async def test_leaving_an_async_block_never_releases_a_later_tenure_of_its_holder(
    aconn: psycopg.AsyncConnection[Any], conn2: Conn
) -> None:
    with pytest.raises(LeaseLost):
        async with alease(aconn, "job", ttl=60, holder="H", heartbeat=False) as held:
            later = steal(conn2, "job", holder="H")
            assert later == held.fence + 1
    row = status(conn2, "job")
    assert row is not None and (row["holder"], row["fence"], row["held"]) == ("H", later, True)
    assert claim(conn2, "job", holder="other") is None


def test_on_sqlite_too(tmp_path: Any) -> None:
    path = tmp_path / "leases.sqlite3"
    url = f"sqlite:///{path}"
    other = SqliteBackend(sqlite_connect(path))
    try:
        with pytest.raises(LeaseLost), lease(url, "job", ttl=60, holder="H") as held:
            later = other.steal("job", MINUTE, "H")
            assert later == held.fence + 1
        rows = other.status("job")
        assert [(r.holder, r.fence, r.held) for r in rows] == [("H", later, True)]
        assert other.claim("job", MINUTE, "other") is None
    finally:
        other.conn.close()


def test_a_block_still_releases_on_a_schema_before_the_release_of_one_tenure(
    conn: Conn, conn2: Conn
) -> None:
    rollback = data_dir("migrations", "postgres") / "pylease-0006-tenures.rollback.sql"
    conn2.execute(rollback.read_text())  # type: ignore[call-overload]
    with lease(conn, "job", ttl=60, holder="H", heartbeat=False) as held:
        pass
    assert claim(conn2, "job", holder="other") == held.fence + 1
