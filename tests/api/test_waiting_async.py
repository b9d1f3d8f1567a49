# The source of tests/api/test_waiting.py: tools/async_to_sync.py writes it from this file.
"""Waiting on a direct server connection, where LISTEN works: handovers through NOTIFY.

Kept out of test_lease_async.py, whose tests also run through PgBouncer in
transaction mode (tests/faults/test_pgbouncer.py), where LISTEN cannot work.
test_waiting.py is generated from test_waiting_async.py (its waiters in threads, the
source's in tasks).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg

from pylease import _operations, alease
from pylease._acompat import asleep
from tests.support.leases import (
    AConn,
    aclaim,
    ajoin_workers,
    asleep_until,
    astart_worker,
    await_until,
)


async def test_waiters_take_turns_through_notify(dsn: str, aconn: AConn) -> None:
    # Five waiters, one lease: each release wakes the others, one wins; with a poll
    # interval of a minute, only the notifications can get them all through in time.
    fences: list[int] = []

    async def waiter() -> None:
        async with alease(dsn, "sweep", ttl=120, wait=60, poll_interval=60) as held:
            fences.append(held.fence)
            await asleep(0.05)

    async with alease(aconn, "sweep", ttl=120):
        workers = [astart_worker(waiter) for _ in range(5)]
        await asleep(0.3)
    await ajoin_workers(workers, 30)
    assert sorted(fences) == fences and len(set(fences)) == 5


async def test_a_queued_waiter_claims_in_one_statement_with_its_status_or_its_exit(
    dsn: str, aconn: AConn, aconn2: AConn, status_always_due: None
) -> None:
    # A waiter's claim after its first is one statement: busy, it reads the status
    # row that stood in the way (at most every STATUS_FRESH seconds, here at every
    # claim, but never when a notification called it) and writes nothing (its
    # process stays queued); granted, its process leaves pylease_waiters in the
    # claim's own transaction, one round trip after the release's notification.
    statements: list[tuple[str, Any]] = []

    class Recording(psycopg.AsyncCursor[Any]):
        async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            statements.append((str(query), params))
            return await super().execute(query, params, **kwargs)

    async def queued() -> int:
        cur = await aconn2.execute("SELECT count(*) FROM pylease_waiters WHERE name = 'job'")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    def claims() -> list[bool]:
        """Each claim of the queued process so far: whether it read the status."""
        return ["lease_status" in q for q, _ in statements if "lease_unwait" in q]

    async def first_claim() -> bool:
        return await queued() == 1 and len(claims()) >= 1

    await aclaim(aconn, "job", ttl="60s")
    inside: list[Any] = []
    wconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, cursor_factory=Recording)

    async def waiter() -> None:
        async with alease(wconn, "job", ttl=60, wait=60, poll_interval=60, heartbeat=False):
            inside.append((list(statements), await queued()))

    worker = astart_worker(waiter)
    try:
        # Queued (lease_wait), then one claim that found the name busy, with the status.
        assert await await_until(first_claim, 30)
        assert claims()[0] is True
        # A notification without a release: the head claims again at once, in vain,
        # without the status (called by a notification, it expected the lease).
        seen = len(claims())
        await aconn.execute("NOTIFY pylease, 'job'")
        assert await asleep_until(lambda: len(claims()) > seen, 30)
        assert claims()[seen] is False
        assert await queued() == 1  # the busy claim wrote nothing
        # A claim that left the status out is followed, on its own, by one that reads
        # it again.
        assert await asleep_until(lambda: claims()[-1] is True, 30)
        before = len(statements)
        cur = await aconn.execute("SELECT lease_release('job', 'other')")
        assert await cur.fetchone() == (True,)
        await ajoin_workers([worker], 30)
    finally:
        await wconn.close()
    ran, rows = inside[0]
    # Since the release: claims only, the last of them granted and leaving the queue
    # (the granted one may have been sent just before the release, a claim that read
    # the status on its own, and met the release in the database).
    assert len(ran) >= before and all("lease_claim" in q for q, _ in ran[before:])
    assert "lease_unwait" in ran[-1][0]
    assert rows == 0
    separate = ("SELECT lease_unwait", "SELECT name")
    assert not [q for q, _ in statements if q.startswith(separate)]


async def test_a_waiters_busy_claim_commits_without_a_wal_flush_even_after_meeting_the_winner(
    dsn: str, aconn: AConn, aconn2: AConn
) -> None:
    # A waiter's claim that meets the winner's claim on the row waits for it, then
    # locks the row's new version to recheck it: its transaction gets an xid, and
    # the winner's fenced writes wait for its commit. Busy, that commit need not be
    # durable (synchronous_commit off); a granted claim's stays durable.
    await aclaim(aconn, "job", ttl="60s")
    cur = await aconn.execute("SELECT lease_release('job', 'other')")
    assert await cur.fetchone() == (True,)
    params = ("job", timedelta(seconds=60), "waiter", None)
    await aconn2.set_autocommit(False)
    await aconn2.execute("SELECT lease_claim('job', '60s', 'winner')")  # granted, not committed
    seen: list[Any] = []

    async def waiter() -> None:
        # Not autocommit: look inside its transaction.
        async with await psycopg.AsyncConnection.connect(dsn) as tx:
            cur = await tx.execute(_operations.CLAIM_WAITING.postgres, params)
            got = await cur.fetchone()
            assert got is not None
            cur = await tx.execute("SELECT pg_current_xact_id_if_assigned()")
            xid = await cur.fetchone()
            cur = await tx.execute("SHOW synchronous_commit")
            sync = await cur.fetchone()
            seen.append((got[0], xid and xid[0], sync and sync[0]))
            await tx.rollback()

    async def blocked() -> bool:
        cur = await aconn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database()"
        )
        return await cur.fetchone() == (1,)

    worker = astart_worker(waiter)
    assert await await_until(blocked, 30)
    await aconn2.commit()
    await ajoin_workers([worker], 30)
    fence, xid, sync = seen[0]
    assert fence is None and xid is not None and sync == "off"

    # Granted, the claim commits durably as every grant does.
    cur = await aconn.execute("SELECT lease_release('job', 'winner')")
    assert await cur.fetchone() == (True,)
    async with await psycopg.AsyncConnection.connect(dsn) as tx:
        cur = await tx.execute(_operations.CLAIM_WAITING.postgres, params)
        got = await cur.fetchone()
        assert got is not None and got[0] is not None
        cur = await tx.execute("SHOW synchronous_commit")
        assert await cur.fetchone() == ("on",)
        await tx.rollback()
