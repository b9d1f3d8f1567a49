"""@exclusive on coroutine functions: the twin of test_exclusive.py."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from pylease import InvalidArgument, LeaseBusy, SchemaMissing, exclusive
from tests.support.leases import claim, status

Conn = psycopg.Connection[Any]


def held_names(conn: Conn) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM lease_status() WHERE held ORDER BY name")]


async def test_the_name_is_formatted_from_the_calls_arguments(dsn: str, conn: Conn) -> None:
    seen: list[list[str]] = []

    @exclusive(dsn, "sync-{tenant}-{retries}", ttl=30)
    async def sync(tenant: str, retries: int = 3) -> str:
        seen.append(await asyncio.to_thread(held_names, conn))
        return tenant

    assert await sync("acme") == "acme"
    assert await sync(tenant="initech", retries=1) == "initech"
    assert seen == [["sync-acme-3"], ["sync-initech-1"]]


async def test_async_connection_target(aconn: psycopg.AsyncConnection[Any], conn: Conn) -> None:
    @exclusive(aconn, "on-aconn", ttl=30)
    async def work() -> list[str]:
        return await asyncio.to_thread(held_names, conn)

    assert await work() == ["on-aconn"]


async def test_busy_returns_none_and_busy_raise_raises(dsn: str, conn: Conn) -> None:
    calls: list[str] = []

    @exclusive(dsn, "sweep", ttl=30)
    async def sweep() -> str:
        calls.append("quiet")
        return "ran"

    @exclusive(dsn, "sweep", ttl=30, busy="raise")
    async def loud() -> str:
        calls.append("loud")
        return "ran"

    assert claim(conn, "sweep", holder="other") is not None
    assert await sweep() is None
    with pytest.raises(LeaseBusy) as info:
        await loud()
    assert info.value.holder == "other"
    assert calls == []
    conn.execute("SELECT lease_release('sweep', 'other')")
    assert await sweep() == "ran" and await loud() == "ran"


async def test_concurrent_calls_in_one_loop_run_once(dsn: str) -> None:
    started = asyncio.Event()
    finish = asyncio.Event()

    @exclusive(dsn, "once", ttl=30)
    async def once() -> str:
        started.set()
        await finish.wait()
        return "ran"

    first = asyncio.create_task(once())
    await started.wait()
    assert await asyncio.gather(once(), once()) == [None, None]
    finish.set()
    assert await first == "ran"


async def test_failures_raise(dsn: str, empty_dsn: str, conn: Conn) -> None:
    @exclusive(dsn, "fails", ttl=30)
    async def fails() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await fails()
    row = status(conn, "fails")
    assert row is not None and not row["held"]

    @exclusive(empty_dsn, "sweep", ttl=30)
    async def unmigrated() -> None: ...

    with pytest.raises(SchemaMissing):
        await unmigrated()

    @exclusive(dsn, "sync-{region}", ttl=30)
    async def sync(**options: str) -> None: ...

    with pytest.raises(InvalidArgument, match="region"):
        await sync(zone="a")


async def test_wraps_keeps_a_coroutine_function(dsn: str) -> None:
    async def job(n: int, *, label: str = "x") -> int:
        """The job."""
        return n

    wrapped = exclusive(dsn, "job-{n}", ttl=30, cancel_on_lost=False)(job)
    assert inspect.iscoroutinefunction(wrapped)
    assert wrapped.__name__ == "job" and wrapped.__doc__ == "The job."
    assert inspect.signature(wrapped) == inspect.signature(job)
    assert await wrapped(5) == 5


# Issue 21, item 4: the lease covers the call and its await; work that runs later
# (an async generator) is refused, an object with an async __call__ is awaited under it.


def test_an_async_generator_function_is_refused_at_decoration(dsn: str, conn: Conn) -> None:
    async def rows(n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i

    class Rows:
        async def __call__(self, n: int) -> AsyncIterator[int]:
            yield n

    for fn in (rows, Rows()):
        with pytest.raises(InvalidArgument, match="async generator function") as info:
            exclusive(dsn, "rows", ttl=30)(fn)
        assert info.value.parameter == "fn"
    assert status(conn, "rows") is None  # nothing was claimed


async def test_an_object_with_an_async_call_is_awaited_under_the_lease(
    dsn: str, conn: Conn
) -> None:
    seen: list[list[str]] = []
    started = asyncio.Event()
    finish = asyncio.Event()

    class Sync:
        async def __call__(self, tenant: str) -> str:
            seen.append(await asyncio.to_thread(held_names, conn))
            started.set()
            await finish.wait()
            return tenant

    sync = exclusive(dsn, "sync-{tenant}", ttl=30)(Sync())
    assert inspect.iscoroutinefunction(sync)
    first = asyncio.create_task(sync("acme"))
    await started.wait()
    # Held while the first body runs: the others are busy, their bodies never start.
    assert await asyncio.gather(sync("acme"), sync(tenant="acme")) == [None, None]
    finish.set()
    assert await first == "acme"
    assert seen == [["sync-acme"]]
    assert await asyncio.to_thread(held_names, conn) == []
