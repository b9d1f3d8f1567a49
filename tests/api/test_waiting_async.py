"""The async twins of test_waiting.py."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from pylease import alease

AConn = psycopg.AsyncConnection[Any]


async def test_waiters_take_turns_through_notify(dsn: str, aconn: AConn) -> None:
    fences: list[int] = []

    async def worker() -> None:
        async with alease(dsn, "sweep", ttl=120, wait=60, poll_interval=60) as held:
            fences.append(held.fence)
            await asyncio.sleep(0.05)

    async with alease(aconn, "sweep", ttl=120):
        tasks = [asyncio.create_task(worker()) for _ in range(5)]
        await asyncio.sleep(0.3)
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert sorted(fences) == fences and len(set(fences)) == 5


async def test_a_queued_waiter_claims_in_one_statement_with_its_status_or_its_exit(
    dsn: str, aconn: AConn
) -> None:
    # The twin of test_waiting.py's, on an event loop: busy, the head's claim reads
    # the status with it (then leaves it out for a second); granted, its process
    # leaves pylease_waiters in the claim's transaction.
    statements: list[tuple[str, Any]] = []

    class Recording(psycopg.AsyncCursor[Any]):
        async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            statements.append((str(query), params))
            return await super().execute(query, params, **kwargs)

    async def queued() -> int:
        cur = await monitor.execute("SELECT count(*) FROM pylease_waiters WHERE name = 'job'")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    def claims() -> list[bool]:
        return [bool(p[-1]) for q, p in statements if "lease_claim" in q and "lease_status" in q]

    async def until(predicate: Any) -> None:
        for _ in range(1500):
            if await predicate():
                return
            await asyncio.sleep(0.02)
        raise AssertionError("timed out")

    await aconn.execute("SELECT lease_claim('job', '60s', 'other')")
    monitor = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    inside: list[Any] = []
    wconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, cursor_factory=Recording)

    async def waiter() -> None:
        async with alease(wconn, "job", ttl=60, wait=60, poll_interval=60, heartbeat=False):
            inside.append((list(statements), await queued()))

    task = asyncio.create_task(waiter())
    try:

        async def first() -> bool:
            return await queued() == 1 and len(claims()) >= 1

        await until(first)
        assert claims()[0] is True  # the first claim read what stood in the way
        seen = len(claims())
        await aconn.execute("NOTIFY pylease, 'job'")

        async def again() -> bool:
            return len(claims()) > seen

        await until(again)
        assert await queued() == 1
        before = len(statements)
        cur = await aconn.execute("SELECT lease_release('job', 'other')")
        assert (await cur.fetchone()) == (True,)
        await asyncio.wait_for(task, 30)
    finally:
        await wconn.close()
        await monitor.close()
    ran, rows = inside[0]
    # Since: claims only (one may have read the status on its own before the release),
    # the last of them granted and leaving the queue.
    assert len(ran) > before and all("lease_claim" in q for q, _ in ran[before:])
    assert "lease_unwait" in ran[-1][0]
    assert rows == 0
    separate = ("SELECT lease_unwait", "SELECT name")
    assert not [q for q, _ in statements if q.startswith(separate)]
