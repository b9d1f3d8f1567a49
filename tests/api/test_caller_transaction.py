"""A lease block that ends inside the caller's open transaction (issue 21, items 3 and 8),
and leases dropped without leaving their block (item 15), on a real PostgreSQL and SQLite.

The lease must stay held, and renewed, until the caller's transaction has ended, so that
the next holder reads what the block wrote (permits and several names as well); a SQLite
connection inside a transaction and an in-memory SQLite database are refused. Django's
and SQLAlchemy's transactions are in tests/integrations/.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pylease import (
    FOREVER,
    InvalidArgument,
    LeaseBusy,
    LeaseLost,
    alease,
    apermit,
    arun_exclusive,
    lease,
    leases,
    permit,
    run_exclusive,
)
from pylease.sqlite import SqliteBackend
from pylease.sqlite import connect as sqlite_connect
from tests.support.leases import claim, status, steal, wait_until

Conn = psycopg.Connection[Any]
# Long enough that nothing here is freed by an expiry: a release did it.
TTL = 60
JOBS = 4


def counter(conn: Conn) -> int:
    conn.execute("CREATE TABLE IF NOT EXISTS counter (n int)")
    conn.execute("DELETE FROM counter")
    conn.execute("INSERT INTO counter VALUES (0)")
    return 0


def run_threads(job: Callable[[], None], n: int = JOBS) -> None:
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            job()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=guarded) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


# Item 3: psycopg connections ----------------------------------------------------------


@pytest.mark.parametrize("style", ["transaction-block", "autocommit-off"])
def test_read_modify_write_jobs_in_caller_transactions_count_every_job(
    dsn: str, conn: Conn, style: str
) -> None:
    """Four jobs, each in a transaction of its own connection: the block reads the counter
    and writes it plus one; the transaction commits a moment after the block ends."""
    counter(conn)

    def job() -> None:
        with psycopg.connect(dsn, autocommit=style == "transaction-block") as c:
            if style == "transaction-block":
                with c.transaction():
                    with lease(c, "counter", ttl=TTL, wait=FOREVER):
                        (n,) = c.execute("SELECT n FROM counter").fetchone() or (0,)
                        c.execute("UPDATE counter SET n = %s", (n + 1,))
                    time.sleep(0.2)  # more of the transaction's work, after the block
            else:
                with lease(c, "counter", ttl=TTL, wait=FOREVER):
                    (n,) = c.execute("SELECT n FROM counter").fetchone() or (0,)
                    c.execute("UPDATE counter SET n = %s", (n + 1,))
                time.sleep(0.2)
                c.commit()

    run_threads(job)
    assert conn.execute("SELECT n FROM counter").fetchone() == (JOBS,)


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_the_lease_is_held_until_the_callers_transaction_ends(
    dsn: str, conn: Conn, end: str
) -> None:
    with psycopg.connect(dsn) as c:
        c.execute("SELECT 1")  # a transaction open before the block
        with lease(c, "job", ttl=TTL) as held:
            c.execute("SELECT 2")
        row = status(conn, "job")
        assert row is not None and row["held"] and row["holder"] == held.holder
        assert claim(conn, "job") is None
        assert held.lost  # its block has ended: nothing to believe any more
        time.sleep(0.3)
        row = status(conn, "job")
        assert row is not None and row["held"] and row["holder"] == held.holder
        c.commit() if end == "commit" else c.rollback()
        assert wait_until(lambda: not (status(conn, "job") or {}).get("held"))


def test_a_lease_kept_for_a_transaction_is_renewed(dsn: str, conn: Conn) -> None:
    with psycopg.connect(dsn) as c:
        c.execute("SELECT 1")
        with lease(c, "job", ttl=2) as held:  # 2 s: as for permits and names below
            pass
        time.sleep(4.5)  # past two ttls: only renewals keep it
        row = status(conn, "job")
        assert row is not None and row["held"] and row["holder"] == held.holder
        c.commit()
        assert wait_until(lambda: not (status(conn, "job") or {}).get("held"))


def test_a_lease_lost_in_the_block_fails_it_before_the_caller_commits(dsn: str, conn: Conn) -> None:
    with psycopg.connect(dsn) as c:
        c.execute("SELECT 1")
        with pytest.raises(LeaseLost), lease(c, "job", ttl=TTL):
            steal(conn, "job")
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        c.rollback()


def test_a_lease_lost_before_the_caller_commits_is_loud(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    with psycopg.connect(dsn) as c:
        c.execute("SELECT 1")
        with lease(c, "job", ttl=TTL):
            pass
        steal(conn, "job")
        c.commit()
    assert wait_until(
        lambda: any(
            r.levelno >= logging.ERROR and "'job'" in r.getMessage() for r in caplog.records
        )
    )


def test_a_later_block_in_the_same_transaction_continues_the_tenure(dsn: str, conn: Conn) -> None:
    """It could never be granted before the transaction ends: it continues the tenure."""
    with psycopg.connect(dsn) as c:
        c.execute("SELECT 1")
        with lease(c, "job", ttl=TTL, wait=FOREVER) as first:
            pass
        with lease(c, "job", ttl=TTL, wait=FOREVER) as second:
            assert second.fence == first.fence and not second.lost
            assert first.lost
        assert run_exclusive(c, "job", TTL, lambda: "ran").result == "ran"
        c.commit()
        assert wait_until(lambda: not (status(conn, "job") or {}).get("held"))
    # After the commit, the same loop of blocks still works.
    with psycopg.connect(dsn) as c:
        for _ in range(3):
            c.execute("SELECT 1")
            assert run_exclusive(c, "job", TTL, lambda: "ran").ran
            c.commit()


@pytest.mark.parametrize("isolation", ["REPEATABLE_READ", "SERIALIZABLE"])
@pytest.mark.parametrize("wait", [0, 1.5])
def test_a_callers_older_snapshot_never_grants_the_lease_beside_a_reader(
    dsn: str, conn: Conn, isolation: str, wait: float
) -> None:
    """A caller's transaction whose snapshot predates a reader's grant cannot see the
    reader's share: the block's claim is not made there, and finds the name busy."""
    with psycopg.connect(dsn) as c:
        c.isolation_level = psycopg.IsolationLevel[isolation]
        c.execute("SELECT 1")  # the snapshot is taken now
        row = conn.execute("SELECT lease_claim_shared('job', '1 hour', 'reader')").fetchone()
        assert row is not None and row[0] is not None
        with pytest.raises(LeaseBusy), lease(c, "job", ttl=TTL, wait=wait):
            pytest.fail("granted beside a reader")
        # The caller's transaction is still its own, and goes on.
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert c.execute("SELECT 2").fetchone() == (2,)
        c.commit()
    row = conn.execute("SELECT holder FROM lease_holders('job')").fetchone()
    assert row == ("reader",)


# Permits and several names: the same deferral, by the tenure's kind ----------------------


def permit_holders(conn: Conn, name: str) -> list[str]:
    rows = conn.execute("SELECT holder FROM permit_status(%s) WHERE held", (name,)).fetchall()
    return sorted(r[0] for r in rows)


def name_holders(conn: Conn, *names: str) -> dict[str, str]:
    return {n: row["holder"] for n in names if (row := status(conn, n)) and row["held"]}


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_permits_and_several_names_are_held_until_the_callers_transaction_ends(
    dsn: str, conn: Conn, end: str
) -> None:
    with psycopg.connect(dsn) as c:
        c.execute("SELECT 1")  # a transaction open before the blocks
        # A 2 s ttl: the keeper's first renewal opens its connection, which on make test's
        # loaded cores took longer than a 1 s lease's margin.
        with permit(c, "exports", ttl=2, max_permits=1) as slot:
            c.execute("SELECT 2")
        with leases(c, ["acct-42", "acct-17"], ttl=2) as names:
            c.execute("SELECT 3")
        assert slot.lost and names.lost  # their blocks ended: nothing to believe any more
        time.sleep(4.5)  # past two ttls: only renewals keep them
        assert permit_holders(conn, "exports") == [slot.holder]
        assert name_holders(conn, "acct-42", "acct-17") == {
            "acct-42": names.holder,
            "acct-17": names.holder,
        }
        assert (
            conn.execute("SELECT * FROM permit_claim('exports', 1, '1 min', 'x')").fetchall() == []
        )
        assert claim(conn, "acct-17") is None
        c.commit() if end == "commit" else c.rollback()
        assert wait_until(lambda: permit_holders(conn, "exports") == [])
        assert wait_until(lambda: name_holders(conn, "acct-42", "acct-17") == {})


def test_a_holder_of_several_names_kept_for_a_transaction_may_claim_each_again(
    dsn: str, conn: Conn
) -> None:
    """Once the caller's transaction ends and the kept names are given back, the process
    no longer counts any of them as claimed by that holder."""

    def takes(name: str) -> bool:
        try:
            with lease(conn, name, TTL, holder="ledger"):
                return True
        except InvalidArgument:  # the holder still has a live lease of it here
            return False

    with psycopg.connect(dsn) as c:
        c.execute("SELECT 1")  # a transaction open before the block
        with leases(c, ["acct-42", "acct-17"], ttl=TTL, holder="ledger"):
            c.execute("SELECT 2")
        assert not takes("acct-17")
        c.commit()
        assert wait_until(lambda: takes("acct-42") and takes("acct-17"))


def test_a_permit_kept_for_a_transaction_and_lost_is_loud(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    with psycopg.connect(dsn) as c:
        c.execute("SELECT 1")
        with permit(c, "exports", ttl=TTL, max_permits=1) as held:
            pass
        assert conn.execute("SELECT permit_revoke('exports', %s)", (held.holder,)).fetchone() == (
            True,
        )
        c.commit()
    assert wait_until(
        lambda: any(
            r.levelno >= logging.ERROR and "'exports'" in r.getMessage() for r in caplog.records
        )
    )


async def test_async_permits_are_held_until_the_callers_transaction_ends(
    dsn: str, conn: Conn
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as c:
        await c.execute("SELECT 1")
        async with apermit(c, "exports", ttl=TTL, max_permits=2, permits=2) as held:
            pass
        await asyncio.sleep(0.3)
        assert permit_holders(conn, "exports") == [held.holder, held.holder]
        await c.commit()
        limit = time.monotonic() + 10
        while permit_holders(conn, "exports") and time.monotonic() < limit:
            await asyncio.sleep(0.02)
        assert permit_holders(conn, "exports") == []


async def test_async_jobs_in_caller_transactions_count_every_job(dsn: str, conn: Conn) -> None:
    counter(conn)

    async def job() -> None:
        c = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        async with c, c.transaction():
            async with alease(c, "counter", ttl=TTL, wait=FOREVER):
                cur = await c.execute("SELECT n FROM counter")
                (n,) = await cur.fetchone() or (0,)
                await c.execute("UPDATE counter SET n = %s", (n + 1,))
            await asyncio.sleep(0.2)

    await asyncio.gather(*(job() for _ in range(JOBS)))
    assert conn.execute("SELECT n FROM counter").fetchone() == (JOBS,)


async def test_an_async_lease_is_held_until_the_callers_transaction_ends(
    dsn: str, conn: Conn
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as c:
        await c.execute("SELECT 1")
        async with alease(c, "job", ttl=TTL) as held:
            pass
        await asyncio.sleep(0.3)
        row = status(conn, "job")
        assert row is not None and row["held"] and row["holder"] == held.holder
        await c.commit()
        limit = time.monotonic() + 10
        while (status(conn, "job") or {}).get("held") and time.monotonic() < limit:
            await asyncio.sleep(0.02)
        assert not (status(conn, "job") or {}).get("held")


# Items 3 and 8: SQLite -----------------------------------------------------------------


@pytest.fixture
def lease_file(tmp_path: Path) -> Path:
    path = tmp_path / "leases.sqlite3"
    sqlite_connect(path).close()
    return path


def sqlite_status(path: Path, name: str) -> tuple[str, int] | None:
    """(holder, fence) of the lease while it is held, read on a connection of its own."""
    c = sqlite_connect(path)
    try:
        rows = SqliteBackend(c).status(name)
    finally:
        c.close()
    return next(((r.holder, r.fence) for r in rows if r.held), None)


def test_a_sqlite_lease_is_held_until_the_callers_transaction_commits(lease_file: Path) -> None:
    c = sqlite3.connect(lease_file, check_same_thread=False)  # implicit transactions
    c.execute("CREATE TABLE work (n int)")
    c.commit()
    with lease(c, "job", ttl=TTL) as held:
        c.execute("INSERT INTO work VALUES (1)")  # opens the caller's transaction
    assert c.in_transaction
    assert sqlite_status(lease_file, "job") == (held.holder, held.fence)
    c.commit()
    assert wait_until(lambda: sqlite_status(lease_file, "job") is None)
    c.close()


@pytest.mark.parametrize(
    "open_memory",
    [
        lambda: sqlite3.connect(":memory:", check_same_thread=False),
        lambda: sqlite_connect(":memory:"),
        lambda: "sqlite:///:memory:",
    ],
    ids=["sqlite3", "pylease.sqlite", "url"],
)
def test_an_in_memory_sqlite_database_is_refused(open_memory: Callable[[], Any]) -> None:
    """Its only connection is shared with the caller's transactions: a ROLLBACK there
    undid a grant, and another thread was granted fence 1 again (item 8)."""
    target = open_memory()
    with pytest.raises(InvalidArgument, match="in-memory"), lease(target, "job", ttl=TTL):
        pass  # pragma: no cover

    async def in_loop() -> None:
        with pytest.raises(InvalidArgument, match="in-memory"):
            async with alease(target, "job", ttl=TTL):
                pass  # pragma: no cover

    asyncio.run(in_loop())


def test_a_sqlite_connection_inside_a_transaction_is_refused(lease_file: Path) -> None:
    c = sqlite3.connect(lease_file, check_same_thread=False)
    c.execute("CREATE TABLE work (n int)")
    c.execute("INSERT INTO work VALUES (1)")
    assert c.in_transaction
    with pytest.raises(InvalidArgument, match="inside a transaction"), lease(c, "job", ttl=TTL):
        pass  # pragma: no cover

    async def in_loop() -> None:
        with pytest.raises(InvalidArgument, match="inside a transaction"):
            async with alease(c, "job", ttl=TTL):
                pass  # pragma: no cover

    asyncio.run(in_loop())
    c.rollback()
    assert sqlite_status(lease_file, "job") is None
    with lease(c, "job", ttl=TTL):  # once it is idle again
        assert sqlite_status(lease_file, "job") is not None
    c.close()


# Item 15: leases dropped without leaving their block ---------------------------------------


def _targets(dsn: str, lease_file: Path) -> dict[str, Callable[[], Any]]:
    return {
        "postgres-url": lambda: dsn,
        "postgres-connection": lambda: psycopg.connect(dsn, autocommit=True),
        "postgres-pool": lambda: ConnectionPool(dsn, min_size=1, max_size=2, open=True),
        "sqlite-url": lambda: f"sqlite:///{lease_file}",
        "sqlite3-connection": lambda: sqlite3.connect(
            lease_file, check_same_thread=False, isolation_level=None
        ),
    }


KINDS = ["postgres-url", "postgres-connection", "postgres-pool", "sqlite-url", "sqlite3-connection"]


@pytest.mark.parametrize("heartbeat", [True, False], ids=["heartbeat", "no-heartbeat"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_collected_lease_is_free_when_the_collection_returns(
    dsn: str, lease_file: Path, kind: str, heartbeat: bool
) -> None:
    """As pals' and filelock's own tests do: ``del lock; gc.collect()``, then the name is
    free at once."""
    target = _targets(dsn, lease_file)[kind]()
    try:
        cm = lease(target, "dropped", ttl=TTL, heartbeat=heartbeat)
        cm.__enter__()
        del cm
        gc.collect()
        assert run_exclusive(target, "dropped", TTL, lambda: "ran").ran
    finally:
        if hasattr(target, "close"):
            target.close()


@pytest.mark.parametrize(
    "kind", ["postgres-url", "postgres-connection", "postgres-pool", "sqlite-url"]
)
def test_a_collected_async_lease_is_released_promptly(
    dsn: str, lease_file: Path, kind: str
) -> None:
    async def main() -> None:
        target: Any = {
            "postgres-url": dsn,
            "sqlite-url": f"sqlite:///{lease_file}",
        }.get(kind)
        if kind == "postgres-connection":
            target = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        elif kind == "postgres-pool":
            target = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
            await target.open()
        try:
            cm = alease(target, "dropped", ttl=TTL)
            await cm.__aenter__()
            del cm
            gc.collect()
            # Not at once on a loop (nothing may block it), but long before the expiry.
            assert (await arun_exclusive(target, "dropped", TTL, _ran, wait=10)).ran
        finally:
            if hasattr(target, "close"):
                await target.close()

    asyncio.run(main())


async def _ran() -> str:
    return "ran"


LEFT_ENTERED = """
import sys
import psycopg
import pylease

conn = psycopg.connect(sys.argv[1], autocommit=True)
for kind in ("sync", "async"):
    name = "left-" + kind
    if kind == "sync":
        held = pylease.lease(conn, name, ttl=60, holder="left").__enter__()
    else:
        import asyncio

        async def enter():
            aconn = await psycopg.AsyncConnection.connect(sys.argv[1], autocommit=True)
            return aconn, await pylease.alease(aconn, name, ttl=60, holder="left").__aenter__()

        loop = asyncio.new_event_loop()
        kept = loop.run_until_complete(enter())
print("entered", flush=True)
"""


def test_a_lease_still_entered_at_exit_is_left_to_expire(dsn: str, conn: Conn) -> None:
    """A block never left when the interpreter exits (its Held collected only as the
    modules are torn down) is not released then: a daemon thread may still be inside
    its block. The expiry frees the name."""
    done = subprocess.run(
        [sys.executable, "-c", LEFT_ENTERED, dsn], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "entered"
    for api in ("sync", "async"):
        row = status(conn, f"left-{api}")
        assert row is not None and row["held"] and row["holder"] == "left", (api, row)
