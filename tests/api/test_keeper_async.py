# The source of tests/api/test_keeper.py: tools/async_to_sync.py writes it from this file.
"""The keeper: one statement per tick and database, whatever the ttls.

test_keeper.py is generated from test_keeper_async.py; the sync-only tests, about
the keeper's thread, are in test_keeper_threads.py.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from typing import Any

import psycopg
import pytest

from pylease import LeaseLost, alease
from pylease._acompat import asleep
from pylease._keeper_async import keeper
from tests.support.leases import (
    DETECT,
    aclaim,
    asleep_until,
    asteal,
    function_calls,
    track_functions,
    wait_until,
)

AConn = psycopg.AsyncConnection[Any]

# The keeper's renewal (0012), and what it falls back on before that (leases only).
HELD_ARGS = "(text[], text[], text[], interval[], bigint[], integer[])"
HELD = "pylease_renew_held" + HELD_ARGS
EACH_ARGS = "(text[], text[], interval[])"
EACH = "lease_renew_each" + EACH_ARGS


async def test_each_database_gets_its_own_statement_per_tick(
    fresh_db: Any, pg_template: str
) -> None:
    dsns = [fresh_db(pg_template), fresh_db(pg_template)]
    admins = [psycopg.connect(d, autocommit=True) for d in dsns]
    try:
        for admin in admins:
            track_functions(admin)
        async with AsyncExitStack() as stack:
            helds = [
                # A ttl that a loaded machine entering 100 leases cannot outrun.
                await stack.enter_async_context(alease(d, f"job-{i}", ttl=3.0))
                for d in dsns
                for i in range(50)
            ]
            assert await asleep_until(lambda: all(h._ticket.renewals >= 2 for h in helds))
        ticks = max(h._ticket.renewals for h in helds)
        for admin in admins:
            assert wait_until(lambda a=admin: function_calls(a, "pylease_renew_held") > 0)
            calls = function_calls(admin, "pylease_renew_held")
            assert 2 <= calls <= ticks + 1, (calls, ticks)
    finally:
        for admin in admins:
            admin.close()


async def test_each_lease_is_renewed_at_the_pace_of_its_own_ttl(aconn: AConn, dsn: str) -> None:
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other,
        alease(aconn, "short", ttl=1.5) as short,
        alease(aconn, "long", ttl=600) as long,
    ):
        assert await asleep_until(lambda: short._ticket.renewals >= 3)
        # The long lease is not renewed at the short one's pace: as the database sees it,
        # its row was never renewed while the short one's was, three times.
        cur = await other.execute(
            "SELECT name, renewed_at > acquired_at FROM lease_status() ORDER BY name"
        )
        assert await cur.fetchall() == [("long", False), ("short", True)]
        assert long._ticket.renewals == 0
        assert await aclaim(other, "short") is None and await aclaim(other, "long") is None


async def test_a_failing_on_lost_callback_does_not_stop_the_keeper(
    aconn: AConn, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def on_lost(_error: LeaseLost) -> None:
        raise RuntimeError("callback bug")

    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as thief,
        alease(aconn, "other", ttl=0.4) as other,
    ):
        lost: LeaseLost | None = None
        try:
            async with alease(aconn, "sweep", ttl=0.4, on_lost=on_lost) as held:
                await asteal(thief, "sweep")
                # On an event loop the loss cancels this wait; a thread sees it end.
                assert await asleep_until(lambda: held.lost)
        except LeaseLost as exc:
            lost = exc
        assert lost is not None
        renewals = other._ticket.renewals
        assert await asleep_until(lambda: other._ticket.renewals > renewals + 1)
        other.check()
    assert any("on_lost callback" in r.getMessage() for r in caplog.records)


async def test_a_renewal_failure_is_logged_and_retried(
    aconn: AConn, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "pylease")
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin,
        alease(aconn, "sweep", ttl=2) as held,
    ):
        assert await asleep_until(lambda: held._ticket.renewals >= 1)
        # Both ways to renew: the one that names the tenure, and that of a schema before
        # 0012, which the keeper falls back on.
        await admin.execute(f"ALTER FUNCTION {HELD} RENAME TO gone")
        await admin.execute(f"ALTER FUNCTION {EACH} RENAME TO gone_too")
        assert await asleep_until(
            lambda: any("renewing 1 lease" in r.getMessage() for r in caplog.records)
        )
        await admin.execute(f"ALTER FUNCTION gone{HELD_ARGS} RENAME TO pylease_renew_held")
        await admin.execute(f"ALTER FUNCTION gone_too{EACH_ARGS} RENAME TO lease_renew_each")
        renewals = held._ticket.renewals
        assert await asleep_until(lambda: held._ticket.renewals > renewals)
        await asleep(0.1)
        held.check()


async def test_on_a_schema_before_0010_the_keeper_renews_by_holder(
    aconn: AConn, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "pylease")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        # As 0012's rollback leaves it: no renewal that names its tenure.
        await admin.execute(f"DROP FUNCTION {HELD} CASCADE")
        async with alease(aconn, "sweep", ttl=1) as held:
            assert await asleep_until(lambda: held._ticket.renewals >= 3)
            held.check()
    said = [r.getMessage() for r in caplog.records if "renews by holder alone" in r.getMessage()]
    assert len(said) == 1, said


if True:  # ASYNC
    # The keeper's worker: a task here, a thread in test_keeper_threads.py.

    async def test_the_keeper_task_ends_with_the_last_lease(aconn: AConn) -> None:
        async with alease(aconn, "sweep", ttl=0.3) as held:
            assert await asleep_until(lambda: held._ticket.renewals >= 1)
            task = keeper()._task
            assert task is not None and not task.done()
        assert keeper().tickets() == []
        await asyncio.wait_for(task, 5)

    async def test_a_renewal_that_hangs_does_not_delay_the_loss(aconn: AConn, dsn: str) -> None:
        told = asyncio.Event()

        async def on_lost(_error: LeaseLost) -> None:
            told.set()

        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as locker:
            # Another session locks the row: the next renewal waits for it, unanswered.
            with pytest.raises(LeaseLost) as raised:
                async with (
                    alease(aconn, "sweep", ttl=1, on_lost=on_lost, cancel_on_lost=False) as held,
                    locker.transaction(),
                ):
                    await locker.execute(
                        "SELECT FROM pylease_leases WHERE name = 'sweep' FOR UPDATE"
                    )
                    await asyncio.wait_for(told.wait(), DETECT)
                    assert held.lost
        assert "no renewal succeeded" in raised.value.reason
