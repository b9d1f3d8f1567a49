"""The operations of contract revision 2 through the async backends, on both databases:
renew_each, counters, history and prune_history, and the new status columns; and a
backend's statements from several threads at once.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import threading
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pylease._backend_async import AsyncBackend
from pylease.errors import FenceExhausted, InvalidArgument
from pylease.postgres._backend import PostgresBackend
from pylease.postgres._backend_async import AsyncPostgresBackend
from pylease.sqlite import AsyncSqliteBackend, connect

HOUR = timedelta(hours=1)


@pytest.fixture(params=["postgres", "sqlite"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AsyncBackend]:
    if request.param == "postgres":
        dsn: str = request.getfixturevalue("dsn")
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            await aconn.execute("SET pylease.history = 'all'")
            yield AsyncPostgresBackend(aconn)
        return
    conn: sqlite3.Connection = connect(tmp_path / "a.sqlite3")
    conn.execute("INSERT INTO pylease_settings VALUES ('history', 'all')")
    try:
        yield AsyncSqliteBackend(conn)
    finally:
        conn.close()


async def test_renew_each_counters_history_and_prune(backend: AsyncBackend) -> None:
    assert await backend.claim("a", timedelta(minutes=1), "me") == 1
    assert await backend.claim("b", HOUR, "me") == 1
    before = (await backend.status("b"))[0].expires_at
    renewals = await backend.renew_each(
        ["a", "b", "c"], ["me", "me", "me"], [HOUR, timedelta(minutes=1), None]
    )
    assert [(r.name, r.renewed) for r in renewals] == [("a", True), ("b", True), ("c", False)]
    a, b, c = renewals
    assert a.expires_at is not None and a.server_time is not None
    assert abs((a.expires_at - a.server_time) - HOUR) < timedelta(milliseconds=2)
    assert b.expires_at == before
    assert (c.expires_at, c.server_time) == (None, None)

    [row] = await backend.status("a")
    assert (row.state, row.ttl) == ("held", HOUR)
    assert (await backend.status("b"))[0].ttl == timedelta(minutes=1)
    assert await backend.release("a", "me") is True
    assert await backend.steal("b", HOUR, "you") == 2
    counters = await backend.counters()
    assert [(x.name, x.grants, x.takeovers, x.steals, x.releases) for x in counters] == [
        ("a", 1, 0, 0, 1),
        ("b", 2, 0, 1, 0),
    ]
    events = await backend.history()
    assert [(e.name, e.event, e.holder, e.fence, e.previous_holder) for e in events] == [
        ("b", "stolen", "you", 2, "me"),
        ("a", "released", "me", 1, None),
        ("b", "claimed", "me", 1, None),
        ("a", "claimed", "me", 1, None),
    ]
    assert [e.event for e in await backend.history("b", max_rows=1)] == ["stolen"]
    assert len(await backend.history(since=timedelta(hours=1))) == 4
    assert await backend.history(since=datetime.now(UTC) + HOUR) == []
    with pytest.raises(InvalidArgument) as caught:
        await backend.history(max_rows=10_001)
    assert caught.value.parameter == "max_rows"
    with pytest.raises(InvalidArgument) as caught:
        await backend.history(since=datetime(2026, 1, 1))
    assert caught.value.parameter == "since"
    assert await backend.prune_history(HOUR) == 0
    assert await backend.prune_history(timedelta(0)) == 4
    assert await backend.history() == []
    assert await backend.prune(HOUR) == 0
    assert await backend.prune(timedelta(0)) == 1  # "a": "b" is held
    assert [r.name for r in await backend.status()] == ["b"]


async def test_fence_exhaustion_raises_fence_exhausted(backend: AsyncBackend) -> None:
    assert await backend.claim("worn", timedelta(milliseconds=1), "old") == 1
    conn: Any = backend.conn  # type: ignore[attr-defined]
    update = "UPDATE pylease_leases SET fence = 9223372036854775807, expires_at = expires_at - 60"
    if isinstance(backend, AsyncSqliteBackend):
        conn.execute(update)
    else:
        await conn.execute(update.replace("- 60", "- interval '1 minute'"))
    with pytest.raises(FenceExhausted) as caught:
        await backend.claim("worn", HOUR, "new")
    assert caught.value.name == "worn"


async def test_a_cancelled_sqlite_call_returns_only_once_its_thread_let_go(tmp_path: Path) -> None:
    # The caller may close the connection as soon as its cancelled call returns, and
    # closing a sqlite3 connection under another thread's statement crashes Python.
    path = tmp_path / "c.sqlite3"
    conn, other = connect(path, busy_timeout=1.0), connect(path)
    try:
        other.execute("BEGIN IMMEDIATE")  # the claim's statement waits for this write lock
        backend = AsyncSqliteBackend(conn)
        task = asyncio.create_task(backend.claim("n", HOUR, "me"))
        lock = backend.sync._lock

        def taken() -> bool:  # by another thread (an RLock: ours would be granted again)
            if lock.acquire(blocking=False):
                lock.release()
                return False
            return True

        deadline = time.monotonic() + 30
        while not taken():
            assert time.monotonic() < deadline, "the claim's thread never took the connection"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not taken()
    finally:
        other.rollback()
        other.close()
        conn.close()


def test_statements_of_two_threads_on_one_backend_read_their_own_rows(dsn: str) -> None:
    """A backend keeps the cursor its last statement left for the next one (a lease
    block's claim and release share one); statements of several threads at once on one
    backend (the sync twin's, whose connections threads share) must still never read
    each other's rows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        backend = PostgresBackend(conn)
        names = [f"own-rows-{i}" for i in range(8)]
        for i, name in enumerate(names):
            assert backend.claim(name, HOUR, f"holder-{i}") == 1
        wrong: list[object] = []

        def read(i: int) -> None:
            for _ in range(200):
                try:
                    rows = backend.status(names[i])
                except Exception as exc:  # another thread's statement on this cursor
                    wrong.append(exc)
                    return
                if [(r.name, r.holder) for r in rows] != [(names[i], f"holder-{i}")]:
                    wrong.append(rows)

        threads = [threading.Thread(target=read, args=(i,)) for i in range(len(names))]
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # threads switch between any two steps
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(interval)
        assert not wrong, wrong[:3]
