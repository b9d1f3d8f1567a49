"""Leaving a lease block is bounded for every target kind (issue 21, item 11).

The contract's bound (CONTRACT section 2): with a database that stops answering while
TCP stays up, the block exits at most 10 seconds after the body ends, by abandoning
connections, never by a query cancel. A URL target kept it; a pool, a ``Connection``
(its release runs on the caller's connection when idle), a dedicated
``heartbeat_target`` and their async twins were still blocked in the release after
15 s. Every kind goes through a proxy that blackholes once the lease is held.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pylease import LeaseLost, alease, lease
from tests.support.faultkit import BLACKHOLE, DROP, Proxy, proxy

KINDS = ["url", "connection", "pool", "connection+dedicated", "connection+pool"]
# The contract's 10 s, with room for a loaded machine: a defect here is a hang.
EXIT_BOUND = 15.0
BOUND = 30.0


@pytest.fixture
def p(dsn: str) -> Iterator[Proxy]:
    with proxy(dsn) as made:
        yield made


@contextlib.contextmanager
def sync_target(kind: str, url: str) -> Iterator[tuple[Any, dict[str, Any]]]:
    opened: list[Any] = []
    try:
        if kind == "url":
            yield url, {}
            return
        if kind == "pool":
            pool = ConnectionPool(url, min_size=1, max_size=2, open=True)
            opened.append(pool)
            yield pool, {}
            return
        conn = psycopg.connect(url, autocommit=True)
        opened.append(conn)
        options: dict[str, Any] = {}
        if kind == "connection+dedicated":
            options["heartbeat_target"] = psycopg.connect(url)
            opened.append(options["heartbeat_target"])
        elif kind == "connection+pool":
            options["heartbeat_target"] = ConnectionPool(url, min_size=1, max_size=2, open=True)
            opened.append(options["heartbeat_target"])
        yield conn, options
    finally:
        for thing in opened:
            with contextlib.suppress(Exception):
                thing.close(timeout=1) if hasattr(thing, "putconn") else thing.close()


@contextlib.asynccontextmanager
async def async_target(kind: str, url: str) -> AsyncIterator[tuple[Any, dict[str, Any]]]:
    opened: list[Any] = []
    try:
        if kind == "url":
            yield url, {}
            return
        if kind == "pool":
            pool = AsyncConnectionPool(url, min_size=1, max_size=2, open=False)
            await pool.open()
            opened.append(pool)
            yield pool, {}
            return
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        opened.append(conn)
        options: dict[str, Any] = {}
        if kind == "connection+dedicated":
            options["heartbeat_target"] = await psycopg.AsyncConnection.connect(url)
            opened.append(options["heartbeat_target"])
        elif kind == "connection+pool":
            hb = AsyncConnectionPool(url, min_size=1, max_size=2, open=False)
            await hb.open()
            options["heartbeat_target"] = hb
            opened.append(hb)
        yield conn, options
    finally:
        for thing in opened:
            with contextlib.suppress(Exception):
                if hasattr(thing, "putconn"):
                    await thing.close(timeout=1)
                else:
                    await thing.close()


def wait_lost(held: Any) -> None:
    limit = time.monotonic() + BOUND
    while not held.lost:
        assert time.monotonic() < limit, "the lease was never reported lost"
        time.sleep(0.02)


@pytest.mark.parametrize("kind", KINDS)
def test_leaving_the_block_is_bounded_for_every_target(p: Proxy, kind: str) -> None:
    with sync_target(kind, p.dsn) as (target, options):
        cm = lease(target, f"bounded-{kind}", ttl=2, **options)
        held = cm.__enter__()
        p.set(BLACKHOLE)
        wait_lost(held)  # the body ends once it knows
        ended: list[BaseException | None] = []

        def leave() -> None:
            try:
                cm.__exit__(None, None, None)
            except BaseException as exc:
                ended.append(exc)
            else:
                ended.append(None)

        started = time.monotonic()
        thread = threading.Thread(target=leave, daemon=True)
        thread.start()
        thread.join(EXIT_BOUND)
        took = time.monotonic() - started
        p.set(DROP)  # whatever still hangs breaks now
        thread.join(BOUND)
        cancels = p.cancels
    print(f"{kind}: the block was left {took:.2f} s after its body ended")
    assert took < EXIT_BOUND, f"{kind}: leaving the block hung ({took:.1f} s)"
    assert len(ended) == 1 and isinstance(ended[0], LeaseLost), ended
    assert cancels == 0, "a query cancel was sent"


@pytest.mark.parametrize("kind", KINDS)
async def test_leaving_an_async_block_is_bounded_for_every_target(p: Proxy, kind: str) -> None:
    async with async_target(kind, p.dsn) as (target, options):
        cm = alease(target, f"bounded-{kind}", ttl=2, cancel_on_lost=False, **options)
        held = await cm.__aenter__()
        p.set(BLACKHOLE)
        limit = time.monotonic() + BOUND
        while not held.lost:
            assert time.monotonic() < limit, "the lease was never reported lost"
            await asyncio.sleep(0.02)

        async def leave() -> BaseException | None:
            try:
                await cm.__aexit__(None, None, None)
            except BaseException as exc:
                return exc
            return None

        started = time.monotonic()
        exiting = asyncio.ensure_future(leave())
        await asyncio.wait([exiting], timeout=EXIT_BOUND)
        took = time.monotonic() - started
        p.set(DROP)
        await asyncio.wait([exiting], timeout=BOUND)
        cancels = p.cancels
    print(f"{kind}: the block was left {took:.2f} s after its body ended")
    assert took < EXIT_BOUND, f"{kind}: leaving the block hung ({took:.1f} s)"
    assert exiting.done() and isinstance(exiting.result(), LeaseLost), exiting
    assert cancels == 0, "a query cancel was sent"
