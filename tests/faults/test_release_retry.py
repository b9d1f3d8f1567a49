"""A release on a connection that broke while idle is retried (issue 21, item 13).

A server restart, a failover, ``pg_terminate_backend`` or a role's
``idle_session_timeout`` shorter than the time a lease's connection sits idle leave a
connection that is broken before the release is sent on it. The release failed and the
lease stayed held for the rest of its ttl, and its waiters waited that long. A statement
that fails at once on such a connection is sent again on a fresh one; the release names
its tenure (``lease_release(name, holder, min_hold, fence)``), so a second one frees
nothing else even when the first may have reached the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pylease import alease, lease
from pylease import dsn as dsn_mod
from tests.support.leases import status

KINDS = ["url", "connection", "pool"]
TTL = 60.0  # far longer than the test: a lease left held shows
BOUND = 30.0


def with_user(dsn: str, user: str) -> str:
    params = dsn_mod.parse(dsn)
    params["user"] = user
    return psycopg.conninfo.make_conninfo("", **params)


@pytest.fixture(params=["terminate", "idle_session_timeout"])
def breaker(request: pytest.FixtureRequest, dsn: str, conn: Any) -> Iterator[tuple[str, Any]]:
    """(the DSN the lease uses, what breaks its idle connections)."""
    if request.param == "terminate":

        def terminate() -> None:
            pids = [
                r[0]
                for r in conn.execute(
                    "SELECT pid FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ]
            assert pids, "the lease has no connection to break"
            for pid in pids:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            settled(conn, lambda n: n == 0)

        yield dsn, terminate
        return
    role = f"pylease_idle_{uuid.uuid4().hex[:10]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    conn.execute(
        sql.SQL("ALTER ROLE {} SET idle_session_timeout = '1s'").format(sql.Identifier(role))
    )

    def idle() -> None:
        # Every connection of the role sits idle past its idle_session_timeout.
        time.sleep(1.5)
        settled(conn, lambda n: n == 0, role)

    try:
        yield with_user(dsn, role), idle
    finally:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def settled(conn: Any, ok: Any, role: str | None = None) -> None:
    """Wait until the server counts the sessions gone (of the role, or but ours)."""
    limit = time.monotonic() + BOUND
    while True:
        (n,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND (%s::text IS NULL OR usename = %s)",
            (role, role),
        ).fetchone()
        if ok(n):
            time.sleep(0.2)  # and the client has read the server's goodbye
            return
        assert time.monotonic() < limit, "the sessions did not end"
        time.sleep(0.05)


@contextlib.contextmanager
def sync_target(kind: str, url: str) -> Iterator[Any]:
    if kind == "url":
        yield url
    elif kind == "pool":
        with ConnectionPool(url, min_size=2, max_size=2, open=True) as pool:
            pool.wait()
            yield pool
    else:
        with psycopg.connect(url, autocommit=True) as conn:
            yield conn


@contextlib.asynccontextmanager
async def async_target(kind: str, url: str) -> AsyncIterator[Any]:
    if kind == "url":
        yield url
    elif kind == "pool":
        async with AsyncConnectionPool(url, min_size=2, max_size=2, open=False) as pool:
            await pool.wait()
            yield pool
    else:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            yield conn


def assert_released(conn: Any, name: str) -> None:
    row = status(conn, name)
    assert row is not None and not row["held"], f"{name} stayed held: {row}"


@pytest.mark.parametrize("kind", KINDS)
def test_a_release_on_a_connection_broken_while_idle_is_retried(
    kind: str, breaker: tuple[str, Any], conn: Any
) -> None:
    url, break_idle = breaker
    name = f"retry-{kind}"
    with sync_target(kind, url) as target, lease(target, name, ttl=TTL):
        break_idle()
    assert_released(conn, name)


@pytest.mark.parametrize("kind", KINDS)
async def test_an_async_release_on_a_connection_broken_while_idle_is_retried(
    kind: str, breaker: tuple[str, Any], conn: Any
) -> None:
    url, break_idle = breaker
    name = f"retry-{kind}"
    async with async_target(kind, url) as target, alease(target, name, ttl=TTL):
        await asyncio.to_thread(break_idle)
    assert_released(conn, name)
