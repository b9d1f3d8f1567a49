"""Helpers for the tests of the Python API: a second party's view of the lease table."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import psycopg

DEAD_URL = "postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=2"

# Generous bounds: the tests check behaviour, never durations.
DETECT = 5.0

Conn = psycopg.Connection[Any]


def claim(conn: psycopg.Connection[Any], name: str, holder: str = "other", ttl: str = "10s") -> Any:
    row = conn.execute("SELECT lease_claim(%s, %s::interval, %s)", (name, ttl, holder)).fetchone()
    assert row is not None
    return row[0]


def steal(conn: psycopg.Connection[Any], name: str, holder: str = "thief") -> Any:
    row = conn.execute("SELECT lease_steal(%s, '1 min', %s)", (name, holder)).fetchone()
    assert row is not None
    return row[0]


def status(conn: psycopg.Connection[Any], name: str) -> dict[str, Any] | None:
    cur = conn.execute(
        "SELECT name, holder, fence, acquired_at, renewed_at, expires_at, held"
        " FROM lease_status(%s)",
        (name,),
    )
    row = cur.fetchone()
    if row is None:
        return None
    return dict(zip([c.name for c in cur.description or []], row, strict=True))


def backends(conn: psycopg.Connection[Any], application_name: str) -> list[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
        " AND datname = current_database()",
        (application_name,),
    ).fetchall()
    return [r[0] for r in rows]


def terminate(conn: psycopg.Connection[Any], pids: list[int]) -> None:
    for pid in pids:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


def wait_until(predicate: Callable[[], object], timeout: float = DETECT) -> bool:
    limit = time.monotonic() + timeout
    while time.monotonic() < limit:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


async def await_until(predicate: Callable[[], Awaitable[object]], timeout: float = DETECT) -> bool:
    limit = time.monotonic() + timeout
    while time.monotonic() < limit:
        if await predicate():
            return True
        await asyncio.sleep(0.02)
    return bool(await predicate())


# The body every lease claim runs (lease_claim and lease_claim_new are SQL functions
# inlined into the caller's statement, migration 0012): what counts the claims.
CLAIM_BODY = "pylease_claim"


def function_calls(conn: psycopg.Connection[Any], function: str) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE funcname = %s",
        (function,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def track_functions(conn: psycopg.Connection[Any]) -> None:
    """Count function calls in this database, for connections opened from now on."""
    dbname = conn.info.dbname
    conn.execute(
        psycopg.sql.SQL("ALTER DATABASE {} SET track_functions = 'all'").format(
            psycopg.sql.Identifier(dbname)
        )
    )


# The same views through an async connection, for tests whose keeper shares the loop.

AConn = psycopg.AsyncConnection[Any]


async def aclaim(conn: AConn, name: str, holder: str = "other", ttl: str = "10s") -> Any:
    cur = await conn.execute("SELECT lease_claim(%s, %s::interval, %s)", (name, ttl, holder))
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def asteal(conn: AConn, name: str, holder: str = "thief") -> Any:
    cur = await conn.execute("SELECT lease_steal(%s, '1 min', %s)", (name, holder))
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def astatus(conn: AConn, name: str) -> dict[str, Any] | None:
    cur = await conn.execute(
        "SELECT name, holder, fence, acquired_at, renewed_at, expires_at, held"
        " FROM lease_status(%s)",
        (name,),
    )
    row = await cur.fetchone()
    if row is None:
        return None
    return dict(zip([c.name for c in cur.description or []], row, strict=True))


async def abackends(conn: AConn, application_name: str) -> list[int]:
    cur = await conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
        " AND datname = current_database()",
        (application_name,),
    )
    return [r[0] for r in await cur.fetchall()]


async def aterminate(conn: AConn, pids: list[int]) -> None:
    for pid in pids:
        await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def afunction_calls(conn: AConn, function: str) -> int:
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    cur = await conn.execute(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE funcname = %s",
        (function,),
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def atrack_functions(conn: AConn) -> None:
    """Count function calls in this database, for connections opened from now on."""
    dbname = conn.info.dbname
    await conn.execute(
        psycopg.sql.SQL("ALTER DATABASE {} SET track_functions = 'all'").format(
            psycopg.sql.Identifier(dbname)
        )
    )


async def asleep_until(predicate: Callable[[], object], timeout: float = DETECT) -> bool:
    """Like wait_until, yielding to the event loop (where the keeper runs)."""
    limit = time.monotonic() + timeout
    while time.monotonic() < limit:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return bool(predicate())


# Workers for the tests written once for both APIs (tools/async_to_sync.py renames
# astart_worker, ajoin_workers and afinished_within to their names without the a):
# a task on the event loop, a thread on the sync side.

BOUND = 60.0


class Worker(threading.Thread):
    """A thread that keeps what its function raised, for join_workers to raise."""

    def __init__(self, fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        super().__init__(daemon=True)
        self.fn, self.args_ = fn, args
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.fn(*self.args_)
        except BaseException as exc:
            self.error = exc


def start_worker(fn: Callable[..., object], *args: Any) -> Worker:
    worker = Worker(fn, args)
    worker.start()
    return worker


def join_workers(workers: Iterable[Worker], timeout: float = BOUND) -> None:
    """Wait for every worker (a liveness bound); raise the first error one raised."""
    workers = list(workers)
    limit = time.monotonic() + timeout
    for worker in workers:
        worker.join(max(0.0, limit - time.monotonic()))
    assert not [w for w in workers if w.is_alive()], f"a worker still runs after {timeout} s"
    for worker in workers:
        if worker.error is not None:
            raise worker.error


def finished_within(worker: Worker, timeout: float) -> bool:
    """Whether the worker ended within ``timeout`` seconds (it runs on if not)."""
    worker.join(timeout)
    return not worker.is_alive()


def astart_worker(fn: Callable[..., Awaitable[object]], *args: Any) -> asyncio.Future[Any]:
    return asyncio.ensure_future(fn(*args))


async def ajoin_workers(tasks: Iterable[asyncio.Future[Any]], timeout: float = BOUND) -> None:
    await asyncio.wait_for(asyncio.gather(*tasks), timeout)


async def afinished_within(task: asyncio.Future[Any], timeout: float) -> bool:
    """Whether the task ended within ``timeout`` seconds (it runs on if not)."""
    done, _ = await asyncio.wait([task], timeout=timeout)
    return bool(done)


# What the tests of permits, several names and readers share (tests/api/test_permits_async.py,
# tests/api/test_readers_async.py): the other party's steps in a thread, a block entered
# once, calls at once (tasks or threads: tools/async_to_sync.py renames aenter_once and
# atogether), and the poll that only a notification beats.


def no_poll(db: Any) -> float | None:
    """A poll interval no test outlasts: on PostgreSQL only a notification (or a turn
    passed on) wakes a waiter in time. SQLite has no NOTIFY: its waiters poll."""
    return 600.0 if db.kind == "postgres" else None


def later(steps: Callable[[], None]) -> threading.Thread:
    """Run the other party's ``steps`` in a thread of their own, now."""
    thread = threading.Thread(target=steps, daemon=True)
    thread.start()
    return thread


def enter_once(cm: Any) -> None:
    """Enter and leave a block that should raise on entry."""
    with cm:
        pass


async def aenter_once(cm: Any) -> None:
    async with cm:
        pass


def together(*calls: Callable[[], Any], timeout: float = BOUND) -> list[Any]:
    """Run the calls at once, each in a thread; their results, or the first error."""
    results: list[Any] = [None] * len(calls)
    workers = [
        start_worker(lambda i=i: results.__setitem__(i, calls[i]())) for i in range(len(calls))
    ]
    join_workers(workers, timeout)
    return results


async def atogether(*calls: Callable[[], Awaitable[Any]], timeout: float = BOUND) -> list[Any]:
    return list(await asyncio.wait_for(asyncio.gather(*(call() for call in calls)), timeout))
