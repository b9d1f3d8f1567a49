"""Many waiting tasks on one event loop: one shared listener per loop, arrival order.

The async twins of test_waiting_fleet.py (written by hand: the sync ones run
threads, these run tasks on the loop whose listener they share).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pylease import _hub_async, alease
from tests.support.leases import AConn, abackends, aclaim, aterminate

BOUND = 60.0


async def until(predicate: Any, timeout: float = BOUND) -> bool:
    limit = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < limit:
        if await predicate():
            return True
        await asyncio.sleep(0.02)
    return bool(await predicate())


async def pylease_connections(conn: AConn) -> int:
    cur = await conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE 'pylease%'"
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def release(conn: AConn, name: str, holder: str = "other") -> None:
    cur = await conn.execute("SELECT lease_release(%s, %s)", (name, holder))
    row = await cur.fetchone()
    assert row is not None and row[0] is True


async def queued(name: str, count: int) -> bool:
    return _hub_async.waiters(name) == count


async def test_two_hundred_waiting_tasks_use_two_connections(dsn: str, aconn: AConn) -> None:
    await aclaim(aconn, "job", ttl="60s")
    results: list[Any] = []

    async def worker() -> None:
        try:
            async with alease(dsn, "job", ttl=60, wait=BOUND) as held:
                results.append(held.fence)
        except BaseException as exc:
            results.append(exc)

    peak = 0
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, await pylease_connections(aconn))
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    tasks = [asyncio.create_task(worker()) for _ in range(200)]
    assert await until(lambda: queued("job", 200))
    assert len(await abackends(aconn, "pylease-listen")) == 1
    await release(aconn, "job")
    await asyncio.wait_for(asyncio.gather(*tasks), BOUND)
    done.set()
    await sampler
    assert [r for r in results if not isinstance(r, int)] == []
    assert len(set(results)) == 200
    assert 1 <= peak <= 2, peak


async def test_waiting_tasks_are_granted_in_arrival_order(dsn: str, aconn: AConn) -> None:
    await aclaim(aconn, "job", ttl="60s")
    order: list[int] = []

    async def worker(index: int) -> None:
        async with alease(dsn, "job", ttl=60, wait=BOUND):
            order.append(index)

    tasks = []
    for index in range(12):
        tasks.append(asyncio.create_task(worker(index)))
        assert await until(lambda: queued("job", len(tasks)))
    await release(aconn, "job")
    await asyncio.wait_for(asyncio.gather(*tasks), BOUND)
    assert order == list(range(12))


async def test_waiting_tasks_get_the_lease_when_their_listener_is_lost(
    dsn: str, aconn: AConn
) -> None:
    await aclaim(aconn, "job", ttl="60s")
    fences: list[int] = []

    async def worker() -> None:
        async with alease(dsn, "job", ttl=60, wait=BOUND) as held:
            fences.append(held.fence)

    tasks = [asyncio.create_task(worker()) for _ in range(20)]
    assert await until(lambda: queued("job", 20))
    first = await abackends(aconn, "pylease-listen")
    assert first
    await aterminate(aconn, first)

    async def relistened() -> bool:
        return bool(set(await abackends(aconn, "pylease-listen")) - set(first))

    assert await until(relistened)
    await aterminate(aconn, await abackends(aconn, "pylease-listen"))
    await release(aconn, "job")
    await asyncio.wait_for(asyncio.gather(*tasks), BOUND)
    assert len(set(fences)) == 20
