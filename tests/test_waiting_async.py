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
