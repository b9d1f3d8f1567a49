"""A role's or database's settings never turn a lost race into an error (issue 21, item 12).

Each test sets a real ``ALTER ROLE ... SET`` (for a role it creates) or ``ALTER
DATABASE ... SET`` on the test's database, and connects as pylease would. A
serializable or repeatable-read default made lost races raise DatabaseUnavailable
(40001); a role's statement_timeout below the claim's 2 s lock_timeout did the same to
a takeover that waits for a holder's fenced transaction, which is busy. A read-only
default is an error that says so, whether the name is free or held.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pylease import ConfigurationError, LeaseBusy, alease, lease
from pylease import dsn as dsn_mod
from tests.support.cli import cli


@pytest.fixture
def role(dsn: str) -> Iterator[tuple[str, str]]:
    """A role of the test's own (dropped after it): its name, and the DSN to log in as it."""
    name = f"pylease_r_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    params = dsn_mod.parse(dsn)
    params["user"] = name
    yield name, psycopg.conninfo.make_conninfo(**params)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
        )
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def set_for(dsn: str, role: str | None, setting: str, value: str) -> None:
    """``ALTER ROLE role IN DATABASE db SET``, or ``ALTER DATABASE db SET`` without a role."""
    db = dsn_mod.parse(dsn)["dbname"]
    with psycopg.connect(dsn, autocommit=True) as admin:
        target = (
            sql.SQL("ROLE {} IN DATABASE {}").format(sql.Identifier(role), sql.Identifier(db))
            if role
            else sql.SQL("DATABASE {}").format(sql.Identifier(db))
        )
        admin.execute(
            sql.SQL("ALTER {} SET {} = {}").format(
                target, sql.Identifier(setting), sql.Literal(value)
            )
        )


ISOLATIONS = ["repeatable read", "serializable"]


def race(dsn: str, rounds: int = 6, racers: int = 6) -> tuple[int, list[BaseException]]:
    """Threads that each claim one name at once on a connection of their own."""
    errors: list[BaseException] = []
    wins = 0
    lock = threading.Lock()
    conns = [psycopg.connect(dsn, autocommit=bool(i % 2)) for i in range(racers)]
    try:
        for r in range(rounds):
            start = threading.Barrier(racers)

            def claim(
                conn: psycopg.Connection[Any],
                name: str = f"job-{r}",
                start: threading.Barrier = start,
            ) -> None:
                nonlocal wins
                start.wait()
                try:
                    with lease(conn, name, ttl=30, heartbeat=False), lock:
                        wins += 1
                except LeaseBusy:
                    pass
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=claim, args=(c,)) for c in conns]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        for conn in conns:
            # Nothing left set on the caller's connection, nothing left open.
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)
            conn.rollback()
    finally:
        for conn in conns:
            conn.close()
    return wins, errors


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_lost_races_are_busy_under_a_database_isolation_default(dsn: str, isolation: str) -> None:
    set_for(dsn, None, "default_transaction_isolation", isolation)
    wins, errors = race(dsn)
    assert errors == []
    assert wins >= 6


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_lost_races_are_busy_under_a_role_isolation_default(
    dsn: str, role: tuple[str, str], isolation: str
) -> None:
    name, role_dsn = role
    set_for(dsn, name, "default_transaction_isolation", isolation)
    wins, errors = race(role_dsn)
    assert errors == []
    assert wins >= 6


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_async_lost_races_are_busy_under_an_isolation_default(
    dsn: str, role: tuple[str, str], isolation: str
) -> None:
    name, role_dsn = role
    set_for(dsn, name, "default_transaction_isolation", isolation)
    conns = [await psycopg.AsyncConnection.connect(role_dsn, autocommit=True) for _ in range(6)]
    errors: list[BaseException] = []

    async def claim(conn: psycopg.AsyncConnection[Any], job: str) -> None:
        try:
            async with alease(conn, job, ttl=30, heartbeat=False):
                await asyncio.sleep(0)
        except LeaseBusy:
            pass
        except Exception as exc:
            errors.append(exc)

    try:
        for r in range(6):
            await asyncio.gather(*(claim(c, f"job-{r}") for c in conns))
            # URL targets too: the claims run on pylease's own connections.
            await asyncio.gather(*(claim_url(role_dsn, f"url-{r}", errors) for _ in range(4)))
    finally:
        for c in conns:
            await c.close()
    assert errors == []


async def claim_url(url: str, job: str, errors: list[BaseException]) -> None:
    try:
        async with alease(url, job, ttl=30, heartbeat=False):
            await asyncio.sleep(0)
    except LeaseBusy:
        pass
    except Exception as exc:
        errors.append(exc)


def hold_fenced(dsn: str, name: str) -> psycopg.Connection[Any]:
    """A holder whose fenced transaction stays open past its short ttl."""
    holder = psycopg.connect(dsn)
    fence = holder.execute("SELECT lease_claim(%s, '300 ms', 'fenced')", (name,)).fetchone()
    holder.commit()
    assert fence is not None
    assert holder.execute("SELECT lease_holds(%s, 'fenced', %s)", (name, fence[0])).fetchone()
    time.sleep(0.6)  # expired, its fenced transaction still open
    return holder


def test_a_takeover_that_waits_for_a_fenced_transaction_is_busy_under_a_role_timeout(
    dsn: str, role: tuple[str, str]
) -> None:
    name, role_dsn = role
    set_for(dsn, name, "statement_timeout", "500ms")
    holder = hold_fenced(dsn, "sweep")
    try:
        with pytest.raises(LeaseBusy), lease(role_dsn, "sweep", ttl=30):
            pytest.fail("granted while the holder's fenced transaction is open")
        with psycopg.connect(role_dsn, autocommit=True) as conn:
            with pytest.raises(LeaseBusy), lease(conn, "sweep", ttl=30):
                pytest.fail("granted while the holder's fenced transaction is open")
            assert conn.execute("SHOW statement_timeout").fetchone() == ("500ms",)
        result = cli("claim", "sweep", "--ttl", "30s", "--dsn", role_dsn)
        assert result.exit_code == 1, result.output
    finally:
        holder.close()


async def test_async_a_takeover_that_waits_for_a_fenced_transaction_is_busy_under_a_timeout(
    dsn: str, role: tuple[str, str]
) -> None:
    name, role_dsn = role
    set_for(dsn, name, "statement_timeout", "500ms")
    holder = hold_fenced(dsn, "sweep")
    try:
        with pytest.raises(LeaseBusy):
            async with alease(role_dsn, "sweep", ttl=30):
                pytest.fail("granted while the holder's fenced transaction is open")
    finally:
        holder.close()


@pytest.mark.parametrize("held", [False, True], ids=["free", "held"])
def test_a_read_only_default_is_an_error_that_says_so(
    dsn: str, role: tuple[str, str], held: bool
) -> None:
    name, role_dsn = role
    if held:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("SELECT lease_claim('sweep', '1 minute', 'someone')")
    set_for(dsn, name, "default_transaction_read_only", "on")
    refused = pytest.raises(ConfigurationError, match="default_transaction_read_only")
    with refused, lease(role_dsn, "sweep", ttl=30):
        pytest.fail("the body ran")
    result = cli("claim", "sweep", "--ttl", "30s", "--dsn", role_dsn)
    assert result.exit_code == 3, result.output
    assert "read-only" in result.output


async def test_async_a_read_only_default_is_an_error_that_says_so(
    dsn: str, role: tuple[str, str]
) -> None:
    name, role_dsn = role
    set_for(dsn, name, "default_transaction_read_only", "on")
    async with await psycopg.AsyncConnection.connect(role_dsn, autocommit=True) as conn:
        with pytest.raises(ConfigurationError, match="default_transaction_read_only"):
            async with alease(conn, "sweep", ttl=30, wait=1):
                pytest.fail("the body ran")
