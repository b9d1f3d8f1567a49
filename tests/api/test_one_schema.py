"""Two installs on one search_path: every statement of a lease names one schema (issue 21,
item 9).

pylease is installed in ``public`` and in ``app``; the caller's connection says
``SET search_path = app``. Claims ran on that connection when it was idle and on
pylease's own connection (which knows nothing of the SET) when a transaction was open,
so two holders could both hold fence 1, one per schema; renewals ran in ``public``.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from pylease import alease, lease
from pylease.migrate import migrate


@pytest.fixture
def two_installs(dsn: str) -> str:
    """The test's database with pylease in ``public`` (the template's) and in ``app``."""
    migrate(dsn, "app", say=lambda _line: None)
    return dsn


def rows_in(dsn: str, schema: str, name: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(
            f"SELECT holder, fence, renewed_at > acquired_at FROM {schema}.lease_status(%s)",
            (name,),
        ).fetchall()


def test_a_connection_claims_in_its_schema_with_or_without_a_transaction(
    two_installs: str,
) -> None:
    dsn = two_installs
    idle = psycopg.connect(dsn, autocommit=True)
    busy = psycopg.connect(dsn)  # a transaction is open when the lease is taken
    try:
        for c in (idle, busy):
            c.execute("SET search_path = app")
        busy.commit()
        busy.execute("SELECT 1")  # the caller's transaction, left open
        with lease(busy, "in-tx", ttl=30) as a, lease(idle, "idle", ttl=30) as b:
            assert rows_in(dsn, "app", "in-tx")[0][:2] == (a.holder, a.fence)
            assert rows_in(dsn, "app", "idle")[0][:2] == (b.holder, b.fence)
            assert rows_in(dsn, "public", "in-tx") == rows_in(dsn, "public", "idle") == []
        busy.rollback()
    finally:
        idle.close()
        busy.close()


def test_renewals_run_in_the_schema_of_the_claim(two_installs: str) -> None:
    dsn = two_installs
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = app")
        with lease(conn, "kept", ttl=1.5) as held:
            time.sleep(2.5)  # past the ttl: only renewals in app keep it
            held.check()
            assert rows_in(dsn, "app", "kept") == [(held.holder, held.fence, True)]
        assert rows_in(dsn, "public", "kept") == []


async def test_async_a_connection_claims_in_its_schema_with_or_without_a_transaction(
    two_installs: str,
) -> None:
    dsn = two_installs
    idle = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    busy = await psycopg.AsyncConnection.connect(dsn)
    try:
        for c in (idle, busy):
            await c.execute("SET search_path = app")
        await busy.commit()
        await busy.execute("SELECT 1")
        async with alease(busy, "in-tx", ttl=30) as a, alease(idle, "idle", ttl=30) as b:
            assert rows_in(dsn, "app", "in-tx")[0][:2] == (a.holder, a.fence)
            assert rows_in(dsn, "app", "idle")[0][:2] == (b.holder, b.fence)
            assert rows_in(dsn, "public", "in-tx") == rows_in(dsn, "public", "idle") == []
        await busy.rollback()
    finally:
        await idle.close()
        await busy.close()


async def test_async_renewals_run_in_the_schema_of_the_claim(two_installs: str) -> None:
    import asyncio

    dsn = two_installs
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("SET search_path = app")
        async with alease(conn, "kept", ttl=1.5) as held:
            await asyncio.sleep(2.5)
            held.check()
            assert rows_in(dsn, "app", "kept") == [(held.holder, held.fence, True)]
        assert rows_in(dsn, "public", "kept") == []
