# The source of tests/api/test_lease.py: tools/async_to_sync.py writes it from this file.
"""alease(), arun_exclusive() and akeep_fresh() on a real PostgreSQL.

test_lease.py, for lease(), run_exclusive() and keep_fresh(), is generated from
test_lease_async.py; the tests that differ (tasks on one side, threads on the other)
are the two halves of ``if True:  # ASYNC`` blocks there.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import threading
import time
from contextlib import AsyncExitStack
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pylease import (
    DatabaseUnavailable,
    InvalidArgument,
    LeaseBusy,
    LeaseLost,
    Outcome,
    SchemaMissing,
    akeep_fresh,
    alease,
    arun_exclusive,
    keep_fresh,
    lease,
)
from pylease._acompat import asleep
from pylease._keeper_async import keeper
from tests.support.leases import (
    DEAD_URL,
    DETECT,
    abackends,
    aclaim,
    asleep_until,
    astatus,
    asteal,
    aterminate,
    backends,
    claim,
    function_calls,
    status,
    steal,
    terminate,
    track_functions,
    wait_until,
)

AConn = psycopg.AsyncConnection[Any]
if True:  # ASYNC
    Conn = psycopg.Connection[Any]  # for the sync halves of the ASYNC blocks


async def test_heartbeat_holds_a_1s_lease_for_3s(aconn: AConn, aconn2: AConn) -> None:
    async with alease(aconn, "sweep", ttl=1) as held:
        assert held.name == "sweep" and isinstance(held.fence, int)
        limit = time.monotonic() + 3
        while time.monotonic() < limit:
            assert await aclaim(aconn2, "sweep") is None
            await asleep(0.2)
        held.check()
        assert not held.lost
        row = await astatus(aconn2, "sweep")
        assert row is not None and row["held"] and row["holder"] == held.holder
        assert row["renewed_at"] > row["acquired_at"]
    assert await aclaim(aconn2, "sweep") is not None


if True:  # ASYNC

    async def test_a_steal_is_detected_and_cancels_the_body(aconn: AConn, aconn2: AConn) -> None:
        seen: list[LeaseLost] = []

        async def on_lost(error: LeaseLost) -> None:
            seen.append(error)

        reached_the_end = False
        with pytest.raises(LeaseLost) as raised:
            async with alease(aconn, "sweep", ttl=0.6, on_lost=on_lost):
                await asteal(aconn2, "sweep")
                await asleep(DETECT)
                reached_the_end = True
        assert not reached_the_end
        assert raised.value.name == "sweep"
        assert isinstance(raised.value.__cause__, asyncio.CancelledError)
        assert seen and seen[0].name == "sweep"
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        row = await astatus(aconn2, "sweep")
        assert row is not None and row["holder"] == "thief" and row["held"]


if True:  # ASYNC

    async def test_a_steal_is_detected_without_cancelling(aconn: AConn, aconn2: AConn) -> None:
        told = asyncio.Event()

        async def on_lost(_error: LeaseLost) -> None:
            told.set()  # on the loop: a plain function would run on a worker thread

        with pytest.raises(LeaseLost):
            async with alease(
                aconn, "sweep", ttl=0.6, on_lost=on_lost, cancel_on_lost=False
            ) as held:
                await asteal(aconn2, "sweep")
                await asyncio.wait_for(told.wait(), DETECT)
                assert held.lost
                with pytest.raises(LeaseLost):
                    held.check()

else:

    def test_a_steal_is_detected(conn: Conn, conn2: Conn) -> None:
        told = threading.Event()
        seen: list[LeaseLost] = []

        def on_lost(error: LeaseLost) -> None:
            seen.append(error)
            told.set()

        with (
            pytest.raises(LeaseLost) as raised,
            lease(conn, "sweep", ttl=0.6, on_lost=on_lost) as held,
        ):
            steal(conn2, "sweep")
            assert told.wait(DETECT), "the heartbeat did not notice the steal"
            assert held.lost
            with pytest.raises(LeaseLost):
                held.check()
        assert raised.value.name == "sweep"
        assert seen[0].name == "sweep"
        row = status(conn2, "sweep")
        assert row is not None and row["holder"] == "thief" and row["held"]


if True:  # ASYNC

    async def test_an_outside_cancellation_stays_a_cancellation(
        aconn: AConn, aconn2: AConn
    ) -> None:
        async def body() -> None:
            async with alease(aconn, "sweep", ttl=0.6):
                await asleep(DETECT)

        task = asyncio.create_task(body())
        await asleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert keeper().tickets() == []
        assert await aclaim(aconn2, "sweep") is not None  # released on the way out


if True:  # ASYNC

    async def test_an_outside_cancellation_stands_beside_a_loss(
        aconn: AConn, aconn2: AConn
    ) -> None:
        async def cancel(_error: LeaseLost) -> None:
            task.cancel()

        async def body() -> None:
            async with alease(aconn, "sweep", ttl=0.6, on_lost=cancel):
                await asteal(aconn2, "sweep")
                await asleep(DETECT)

        # on_lost cancels the task too, as an outside party would, right before the lease does.
        task = asyncio.create_task(body())
        with pytest.raises(asyncio.CancelledError):
            await task
        assert keeper().tickets() == []


async def test_the_callers_rollback_keeps_the_renewals(aconn: AConn, aconn2: AConn) -> None:
    await aconn.execute("CREATE TABLE work (n int)")
    async with alease(aconn, "sweep", ttl=0.6) as held:
        first = await astatus(aconn2, "sweep")
        assert first is not None
        async with aconn.transaction():
            await aconn.execute("INSERT INTO work VALUES (1)")
            assert await asleep_until(lambda: held._ticket.renewals >= 2)
            # The heartbeat never commits the caller's half-done work.
            cur = await aconn2.execute("SELECT count(*) FROM work")
            assert await cur.fetchone() == (0,)
            raise psycopg.Rollback
        after = await astatus(aconn2, "sweep")
        assert after is not None and after["renewed_at"] > first["renewed_at"] and after["held"]
        held.check()
    cur = await aconn2.execute("SELECT count(*) FROM work")
    assert await cur.fetchone() == (0,)


async def test_the_heartbeat_reconnects_after_its_backend_is_terminated(
    aconn: AConn, aconn2: AConn
) -> None:
    async with alease(aconn, "sweep", ttl=1) as held:
        pids: list[int] = []
        for _ in range(100):
            pids = await abackends(aconn2, "pylease-heartbeat")
            if pids:
                break
            await asleep(0.05)
        assert pids
        await aterminate(aconn2, pids)
        renewals = held._ticket.renewals
        assert await asleep_until(lambda: held._ticket.renewals > renewals + 1)
        assert set(await abackends(aconn2, "pylease-heartbeat")) - set(pids)
        held.check()
        assert await aclaim(aconn2, "sweep") is None


# Both releases: the block falls back to the holder's release on a schema without the
# release of one tenure (before pylease-0006).
DROP_RELEASES = (
    "ALTER FUNCTION lease_release(text, text, interval, bigint) RENAME TO gone;"
    " ALTER FUNCTION lease_release(text, text, interval) RENAME TO gone"
)


async def test_body_exception_survives_a_failing_release(aconn: AConn, aconn2: AConn) -> None:
    with pytest.raises(KeyError) as raised:
        async with alease(aconn, "sweep", ttl=5):
            await aconn2.execute(DROP_RELEASES)
            raise KeyError("body")
    assert raised.value.args == ("body",)
    notes = getattr(raised.value, "__notes__", [])
    assert any("releasing lease 'sweep' failed" in n for n in notes), notes


async def test_a_failing_release_raises_when_the_body_returned(aconn: AConn, aconn2: AConn) -> None:
    with pytest.raises(SchemaMissing):
        async with alease(aconn, "sweep", ttl=5):
            await aconn2.execute(DROP_RELEASES)


async def test_an_unreachable_database_at_release_only_warns(
    dsn: str, aconn2: AConn, pg_admin_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as mine,
        alease(mine, "sweep", ttl=5),
    ):
        # Unreachable, not merely a broken connection (whose release is sent again on a
        # fresh one): no new session, and every other one ended.
        async with await psycopg.AsyncConnection.connect(pg_admin_dsn, autocommit=True) as admin:
            await admin.execute(
                sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(
                    sql.Identifier(aconn2.info.dbname)
                )
            )
        cur = await aconn2.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        await aterminate(aconn2, [pid for (pid,) in await cur.fetchall()])
    assert any(
        r.levelno == logging.WARNING and "could not release" in r.getMessage()
        for r in caplog.records
    )
    row = await astatus(aconn2, "sweep")
    assert row is not None and row["held"]


async def test_body_exception_notes_a_lost_lease(aconn: AConn, aconn2: AConn) -> None:
    with pytest.raises(KeyError) as raised:
        async with alease(aconn, "sweep", ttl=5):
            await asteal(aconn2, "sweep")
            raise KeyError("body")
    assert any("was lost" in n for n in getattr(raised.value, "__notes__", []))


async def test_a_lost_release_raises_lease_lost(aconn: AConn, aconn2: AConn) -> None:
    with pytest.raises(LeaseLost):
        async with alease(aconn, "sweep", ttl=5, heartbeat=False):
            await asteal(aconn2, "sweep")
    row = await astatus(aconn2, "sweep")
    assert row is not None and row["holder"] == "thief" and row["held"]


async def test_without_heartbeat_check_raises_once_the_ttl_ran_out(aconn: AConn) -> None:
    with pytest.raises(LeaseLost):
        async with alease(aconn, "sweep", ttl=0.2, heartbeat=False) as held:
            held.check()
            await asleep(0.3)
            assert held.lost
            with pytest.raises(LeaseLost):
                held.check()


async def test_on_lost_is_told_of_a_loss_that_the_body_saw_first(aconn: AConn) -> None:
    """No keeper tells it (heartbeat off): the block's end does, once, before it ends."""
    told: list[LeaseLost] = []
    tell = told.append
    with pytest.raises(LeaseLost):  # noqa: SIM117, RUF100
        async with alease(aconn, "x", ttl=0.2, heartbeat=False, on_lost=tell) as held:
            await asleep(0.3)
            assert held.lost
    assert [(e.name, e.reason) for e in told] == [("x", "its ttl ran out without a renewal")]


async def test_on_lost_is_told_of_a_loss_that_only_the_release_found(
    aconn: AConn, aconn2: AConn
) -> None:
    told: list[LeaseLost] = []
    tell = told.append
    with pytest.raises(LeaseLost):  # noqa: SIM117, RUF100
        async with alease(aconn, "x", ttl=5, heartbeat=False, on_lost=tell):
            await asteal(aconn2, "x")
    assert [e.name for e in told] == ["x"]
    assert "no longer ours" in told[0].reason


async def test_busy_at_once_with_wait_0(aconn: AConn, aconn2: AConn) -> None:
    await aclaim(aconn2, "sweep", holder="them")
    with pytest.raises(LeaseBusy) as raised:
        async with alease(aconn, "sweep", ttl=5):
            pytest.fail("the body ran")
    assert (raised.value.name, raised.value.holder, raised.value.waited) == ("sweep", "them", 0.0)


async def test_busy_after_wait(aconn: AConn, aconn2: AConn) -> None:
    await aclaim(aconn2, "sweep", holder="them")
    with pytest.raises(LeaseBusy) as raised:
        async with alease(aconn, "sweep", ttl=5, wait=0.4):
            pytest.fail("the body ran")
    assert (raised.value.name, raised.value.holder) == ("sweep", "them")
    assert raised.value.waited >= 0.4


async def test_a_waiter_gets_an_expired_lease(aconn: AConn, aconn2: AConn) -> None:
    await aclaim(aconn2, "sweep", holder="them", ttl="300ms")
    async with alease(aconn, "sweep", ttl=5, wait=DETECT, poll_interval=60) as held:
        row = await astatus(aconn2, "sweep")
        assert row is not None and row["holder"] == held.holder


if True:  # ASYNC

    async def _waiter(target: object, name: str, result: dict[str, Any], **options: Any) -> None:
        try:
            async with alease(target, name, ttl=5, **options) as held:
                result["fence"] = held.fence
                result["at"] = time.monotonic()
        except Exception as exc:
            result["error"] = exc

else:

    def _wait_in_thread(target: object, name: str, **options: Any) -> tuple[threading.Thread, dict]:
        result: dict[str, Any] = {}
        started = threading.Event()

        def run() -> None:
            started.set()
            t0 = time.monotonic()
            try:
                with lease(target, name, ttl=5, **options) as held:
                    result["waited"] = time.monotonic() - t0
                    result["fence"] = held.fence
            except Exception as exc:
                result["error"] = exc

        thread = threading.Thread(target=run)
        thread.start()
        started.wait()
        return thread, result


if True:  # ASYNC

    async def test_a_handover_through_notify(dsn: str, aconn: AConn, aconn2: AConn) -> None:
        # The holder's ttl and the poll interval are far longer than the bound, so only
        # the release's NOTIFY can wake the waiter in time.
        result: dict[str, Any] = {}
        async with alease(aconn, "sweep", ttl=120):
            task = asyncio.create_task(_waiter(dsn, "sweep", result, wait=60, poll_interval=60))
            for _ in range(100):
                if await abackends(aconn2, "pylease-listen"):
                    break
                await asleep(0.05)
            await asleep(0.2)
            released_at = time.monotonic()
        await asyncio.wait_for(task, DETECT)
        assert "fence" in result, result
        assert result["at"] - released_at < 2.0

else:

    def test_a_handover_through_notify(dsn: str, conn: Conn, conn2: Conn) -> None:
        # The holder's ttl and the poll interval are far longer than the bound, so only
        # the release's NOTIFY can wake the waiter in time.
        with lease(conn, "sweep", ttl=120):
            thread, result = _wait_in_thread(dsn, "sweep", wait=60, poll_interval=60)
            assert wait_until(lambda: backends(conn2, "pylease-listen"))
            time.sleep(0.2)
            released_at = time.monotonic()
        thread.join(DETECT)
        assert "fence" in result, result
        assert time.monotonic() - released_at < 2.0


if True:  # ASYNC

    async def test_waiting_degrades_to_polling_when_listen_breaks(
        dsn: str, aconn: AConn, aconn2: AConn
    ) -> None:
        result: dict[str, Any] = {}
        async with alease(aconn, "sweep", ttl=120):
            task = asyncio.create_task(_waiter(dsn, "sweep", result, wait=30, poll_interval=0.2))
            pids: list[int] = []
            for _ in range(100):
                pids = await abackends(aconn2, "pylease-listen")
                if pids:
                    break
                await asleep(0.05)
            await aterminate(aconn2, pids)
            await asleep(0.3)
        await asyncio.wait_for(task, DETECT)
        assert "fence" in result, result

else:

    def test_waiting_degrades_to_polling_when_listen_breaks(
        dsn: str, conn: Conn, conn2: Conn
    ) -> None:
        with lease(conn, "sweep", ttl=120):
            thread, result = _wait_in_thread(dsn, "sweep", wait=30, poll_interval=0.2)
            assert wait_until(lambda: backends(conn2, "pylease-listen"))
            terminate(conn2, backends(conn2, "pylease-listen"))
            time.sleep(0.3)
        thread.join(DETECT)
        assert "fence" in result, result


async def test_a_thousand_leases_are_renewed_by_one_statement_per_tick(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    track_functions(conn)
    async with AsyncExitStack() as stack:
        helds = [
            # A ttl that a loaded machine entering 1,000 leases cannot outrun.
            await stack.enter_async_context(alease(dsn, f"job-{i}", ttl=6.0))
            for i in range(1000)
        ]
        assert await asleep_until(lambda: all(h._ticket.renewals >= 2 for h in helds), 30)
    # Statistics reach the server when a backend reports them (the keeper's own
    # connection, at its end), not at once.
    assert wait_until(lambda: function_calls(conn, "lease_release") == 1000)
    assert wait_until(lambda: function_calls(conn, "pylease_renew_held") > 0)
    calls = function_calls(conn, "pylease_renew_held")
    # Every tick renews all the leases still held; the first one taken is released last.
    ticks = max(h._ticket.renewals for h in helds)
    assert 2 <= calls <= ticks + 1, (calls, ticks)
    assert function_calls(conn, "lease_renew") == 0


async def test_a_held_reads_as_lost_once_its_block_is_left(aconn: AConn, aconn2: AConn) -> None:
    # Once released, the lease may be another's: what its Held says must follow.
    async with alease(aconn, "sweep", ttl=30) as held:
        assert not held.lost
        held.check()
    assert await aclaim(aconn2, "sweep") is not None
    assert held.lost
    with pytest.raises(LeaseLost, match="block has ended"):
        held.check()


async def test_errors_pickle(aconn: AConn, aconn2: AConn) -> None:
    await aclaim(aconn2, "sweep", holder="them")
    with pytest.raises(LeaseBusy) as busy:
        async with alease(aconn, "sweep", ttl=5):
            pass
    copy = pickle.loads(pickle.dumps(busy.value))
    assert (type(copy), copy.name, copy.holder, str(copy)) == (
        LeaseBusy,
        "sweep",
        "them",
        str(busy.value),
    )
    with pytest.raises(LeaseLost) as lost:
        async with alease(aconn, "other", ttl=5):
            await asteal(aconn2, "other")
    copy = pickle.loads(pickle.dumps(lost.value))
    assert (type(copy), copy.name, copy.reason) == (LeaseLost, "other", lost.value.reason)


async def test_run_exclusive_runs_the_work(aconn: AConn, aconn2: AConn) -> None:
    async def work() -> str:
        assert await aclaim(aconn2, "sweep") is None
        return "done"

    assert await arun_exclusive(aconn, "sweep", 5, work) == Outcome(True, "done")
    assert await aclaim(aconn2, "sweep") is not None


async def test_run_exclusive_is_silent_when_busy(
    aconn: AConn, aconn2: AConn, caplog: pytest.LogCaptureFixture
) -> None:
    await aclaim(aconn2, "sweep")
    caplog.set_level(logging.DEBUG, "pylease")

    async def work() -> None:
        pytest.fail("ran")

    assert await arun_exclusive(aconn, "sweep", 5, work) == Outcome(False, None)
    # What the call said, in this thread: a listener that an earlier test of this process
    # left lingering (its database since dropped) may speak meanwhile from its own.
    said = [r for r in caplog.records if r.thread == threading.get_ident()]
    assert not [r for r in said if r.levelno >= logging.INFO]


async def test_run_exclusive_raises_on_a_missing_schema(empty_dsn: str) -> None:
    async def work() -> None:
        return None

    with pytest.raises(SchemaMissing) as raised:
        await arun_exclusive(empty_dsn, "sweep", 5, work)
    assert isinstance(raised.value.__cause__, psycopg.Error)


async def test_run_exclusive_raises_on_a_dead_server() -> None:
    async def work() -> None:
        return None

    with pytest.raises(DatabaseUnavailable) as raised:
        await arun_exclusive(DEAD_URL, "sweep", 5, work)
    assert isinstance(raised.value.__cause__, psycopg.OperationalError)


async def test_run_exclusive_raises_the_works_exception(aconn: AConn, aconn2: AConn) -> None:
    async def work() -> None:
        raise RuntimeError("sweep failed")

    with pytest.raises(RuntimeError, match="sweep failed"):
        await arun_exclusive(aconn, "sweep", 5, work)
    assert await aclaim(aconn2, "sweep") is not None


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"name": ""}, "name"),
        ({"name": "x" * 201}, "name"),
        ({"ttl": 0}, "ttl"),
        ({"ttl": -1}, "ttl"),
        ({"holder": ""}, "holder"),
        ({"wait": -1}, "wait"),
        ({"min_hold": -1}, "min_hold"),
        ({"on_lost": "no"}, "on_lost"),
    ],
)
async def test_invalid_arguments_raise_before_any_sql(
    kwargs: dict[str, Any], parameter: str
) -> None:
    args: dict[str, Any] = {"name": "sweep", "ttl": 5, **kwargs}
    with pytest.raises(InvalidArgument) as raised:
        alease(DEAD_URL, **args)
    assert isinstance(raised.value, ValueError)
    assert raised.value.parameter == parameter

    async def work() -> None:
        return None

    with pytest.raises(InvalidArgument):
        await arun_exclusive(DEAD_URL, work=work, **args)


if True:  # ASYNC

    async def test_a_target_of_the_wrong_kind_is_refused(conn: psycopg.Connection[Any]) -> None:
        with pytest.raises(InvalidArgument, match="lease"):
            async with alease(conn, "sweep", ttl=5):
                pass
        with pytest.raises(InvalidArgument, match="target"):
            async with alease(42, "sweep", ttl=5):
                pass

else:  # sync: as is

    def test_a_target_of_the_wrong_kind_is_refused(aconn: psycopg.AsyncConnection[Any]) -> None:
        with pytest.raises(InvalidArgument, match="alease"), lease(aconn, "sweep", ttl=5):
            pass
        with pytest.raises(InvalidArgument, match="target"), lease(42, "sweep", ttl=5):
            pass


async def test_a_pool_target(dsn: str, aconn2: AConn) -> None:
    async with AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False) as pool:
        async with alease(pool, "sweep", ttl=0.6) as held:
            assert await asleep_until(lambda: held._ticket.renewals >= 2)
            assert await aclaim(aconn2, "sweep") is None
            held.check()
        assert await aclaim(aconn2, "sweep") is not None


async def test_a_url_target(dsn: str, aconn2: AConn) -> None:
    async with alease(dsn, "sweep", ttl=0.6) as held:
        assert await asleep_until(lambda: held._ticket.renewals >= 2)
        assert await aclaim(aconn2, "sweep") is None
    assert await aclaim(aconn2, "sweep") is not None

    async def work() -> int:
        return 7

    assert await arun_exclusive(dsn, "sweep2", 5, work) == Outcome(True, 7)


async def test_a_connection_with_another_row_factory(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, row_factory=dict_row
    ) as mine:
        async with alease(mine, "sweep", ttl=0.6) as held:
            assert await asleep_until(lambda: held._ticket.renewals >= 1)
            assert isinstance(held.fence, int)
        cur = await mine.execute("SELECT 1 AS one")
        assert await cur.fetchone() == {"one": 1}


async def test_a_claim_from_inside_a_transaction_commits_on_its_own(
    dsn: str, aconn2: AConn
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as mine:  # not autocommit
        await mine.execute("SELECT 1")  # the caller's transaction is open
        async with alease(mine, "sweep", ttl=5) as held:
            row = await astatus(aconn2, "sweep")
            assert row is not None and row["holder"] == held.holder
        assert mine.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        # Kept until the caller's transaction ends, so what the block wrote in it is
        # committed (or gone) before another holder can read it (issue 21, item 3).
        assert await aclaim(aconn2, "sweep") is None
        await mine.rollback()
        granted = None
        for _ in range(250):  # the release follows the rollback (bounded: 5 s)
            granted = await aclaim(aconn2, "sweep")
            if granted is not None:
                break
            await asleep(0.02)
        assert granted is not None


async def test_an_idle_non_autocommit_connection_commits_claim_and_release(
    dsn: str, aconn2: AConn
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as mine:
        async with alease(mine, "sweep", ttl=5) as held:
            assert mine.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            row = await astatus(aconn2, "sweep")
            assert row is not None and row["holder"] == held.holder
        assert mine.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert await aclaim(aconn2, "sweep") is not None


async def test_min_hold_keeps_the_name_after_release(aconn: AConn, aconn2: AConn) -> None:
    async with alease(aconn, "sweep", ttl=5, min_hold=60):
        pass
    assert await aclaim(aconn2, "sweep") is None
    row = await astatus(aconn2, "sweep")
    assert row is not None and not row["held"]  # released, yet not free before min_hold


async def test_default_holders_are_unique_per_claim(aconn: AConn) -> None:
    async with alease(aconn, "a", ttl=5) as a, alease(aconn, "b", ttl=5) as b:
        assert a.holder != b.holder
        host, pid, token = a.holder.rsplit(":", 2)
        assert len(token) == 32 and int(pid) > 0 and host


async def test_stopping_while_ticks_run_never_reports_a_loss(aconn: AConn) -> None:
    seen: list[LeaseLost] = []
    # Bodies end at every phase of the renewal cycle (ttl/3 = 0.4 s), with a ttl that a
    # loaded machine's renewals do not outrun.
    for i in range(20):
        async with alease(aconn, f"quick-{i}", ttl=1.2, on_lost=seen.append):
            await asleep(0.05 + (i % 7) * 0.06)
    assert seen == []
    assert keeper().tickets() == []


async def test_keep_fresh_renews_somebody_elses_lease(
    dsn: str, aconn: AConn, aconn2: AConn
) -> None:
    await aclaim(aconn2, "sweep", holder="owner", ttl="600ms")
    async with akeep_fresh(dsn, "sweep", "owner") as held:
        assert held.holder == "owner" and held.fence == 1
        await asleep(1.5)
        assert await aclaim(aconn, "sweep") is None
        held.check()
    row = await astatus(aconn2, "sweep")
    assert row is not None and row["holder"] == "owner" and row["held"]


async def test_keep_fresh_of_a_lease_not_held_raises(dsn: str, aconn2: AConn) -> None:
    await aclaim(aconn2, "sweep", holder="owner")
    with pytest.raises(LeaseLost):
        async with akeep_fresh(dsn, "sweep", "somebody"):
            pytest.fail("the body ran")


if True:  # ASYNC

    async def test_keep_fresh_notices_a_loss(dsn: str, aconn2: AConn) -> None:
        await aclaim(aconn2, "sweep", holder="owner", ttl="600ms")
        told = asyncio.Event()

        async def on_lost(_error: LeaseLost) -> None:
            told.set()

        with pytest.raises(LeaseLost):
            async with akeep_fresh(dsn, "sweep", "owner", on_lost=on_lost) as held:
                await asteal(aconn2, "sweep")
                await asyncio.wait_for(told.wait(), DETECT)
                assert held.lost

else:

    def test_keep_fresh_notices_a_loss(dsn: str, conn2: Conn) -> None:
        claim(conn2, "sweep", holder="owner", ttl="600ms")
        told = threading.Event()
        with (
            pytest.raises(LeaseLost),
            keep_fresh(dsn, "sweep", "owner", on_lost=lambda _e: told.set()) as held,
        ):
            steal(conn2, "sweep")
            assert told.wait(DETECT)
            assert held.lost


async def test_a_lease_no_renewal_can_reach_is_lost_before_its_expiry(
    pg_admin_dsn: str, aconn: AConn, aconn2: AConn
) -> None:
    seen: list[dict[str, Any] | None] = []

    async def on_lost(_error: LeaseLost) -> None:
        seen.append(await astatus(aconn2, "sweep"))

    dbname = aconn.info.dbname
    admin = await psycopg.AsyncConnection.connect(pg_admin_dsn, autocommit=True)
    with pytest.raises(LeaseLost) as raised:
        async with alease(aconn, "sweep", ttl=1, on_lost=on_lost):
            pids: list[int] = []
            for _ in range(100):
                pids = await abackends(aconn2, "pylease-heartbeat")
                if pids:
                    break
                await asleep(0.05)
            await admin.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS false')
            try:
                await aterminate(aconn2, pids)
                await asleep(DETECT)  # cancelled by the loss
            finally:
                await admin.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS true')
                await admin.close()
    assert "no renewal succeeded" in raised.value.reason
    # Reported before the lease really expired: the body had time to stop.
    assert seen and seen[0] is not None and seen[0]["held"]


if True:  # ASYNC

    async def test_heartbeat_target_names_where_renewals_run(
        dsn: str, aconn: AConn, aconn2: AConn
    ) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as dedicated:
            async with alease(aconn, "a", ttl=0.6, heartbeat_target=dedicated) as held:
                assert await asleep_until(lambda: held._ticket.renewals >= 2)
            assert not await abackends(aconn2, "pylease-heartbeat")
        async with alease(aconn, "b", ttl=0.6, heartbeat_target=dsn) as held:
            assert await asleep_until(lambda: held._ticket.renewals >= 2)
        with pytest.raises(InvalidArgument, match="heartbeat_target"):
            async with alease(dsn, "c", ttl=1, heartbeat_target=dsn):
                pass

else:

    def test_heartbeat_target_names_where_renewals_run(dsn: str, conn: Conn, conn2: Conn) -> None:
        with psycopg.connect(dsn, autocommit=True) as dedicated:
            with lease(conn, "a", ttl=0.6, heartbeat_target=dedicated) as held:
                assert wait_until(lambda: held._ticket.renewals >= 2)
            assert not backends(conn2, "pylease-heartbeat")
        with lease(conn, "b", ttl=0.6, heartbeat_target=dsn) as held:
            assert wait_until(lambda: held._ticket.renewals >= 2)
        with (
            pytest.raises(InvalidArgument, match="heartbeat_target"),
            lease(dsn, "c", ttl=1, heartbeat_target=dsn),
        ):
            pass


async def test_the_heartbeat_connection_carries_the_password(dsn: str) -> None:
    from pylease.postgres._conninfo import connection_conninfo

    async with await psycopg.AsyncConnection.connect(
        dsn, password="s3cret", autocommit=True
    ) as mine:
        assert "s3cret" not in mine.info.dsn
        assert "password=s3cret" in connection_conninfo(mine)


if True:  # ASYNC

    async def test_a_pool_target_waits_through_notify(
        dsn: str, aconn: AConn, aconn2: AConn
    ) -> None:
        result: dict[str, Any] = {}
        async with AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False) as pool:
            async with alease(aconn, "sweep", ttl=120):
                task = asyncio.create_task(
                    _waiter(pool, "sweep", result, wait=60, poll_interval=60)
                )
                for _ in range(100):
                    if await abackends(aconn2, "pylease-listen"):
                        break
                    await asleep(0.05)
                await asleep(0.2)
                released_at = time.monotonic()
            await asyncio.wait_for(task, DETECT)
        assert "fence" in result, result
        assert result["at"] - released_at < 2.0

else:

    def test_a_pool_target_waits_through_notify(dsn: str, conn: Conn, conn2: Conn) -> None:
        with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
            with lease(conn, "sweep", ttl=120):
                thread, result = _wait_in_thread(pool, "sweep", wait=60, poll_interval=60)
                assert wait_until(lambda: backends(conn2, "pylease-listen"))
                time.sleep(0.2)
                released_at = time.monotonic()
            thread.join(DETECT)
            assert "fence" in result, result
            assert time.monotonic() - released_at < 2.0


async def test_a_schema_named_in_the_connection_string_reaches_the_heartbeat(
    empty_dsn: str,
) -> None:
    from pylease.migrate import migrate

    migrate(empty_dsn, "leases", say=lambda _line: None)
    url = psycopg.conninfo.make_conninfo(empty_dsn, options="-c search_path=leases")
    async with (
        await psycopg.AsyncConnection.connect(url, autocommit=True) as mine,
        alease(mine, "sweep", ttl=0.6) as held,
    ):
        assert await asleep_until(lambda: held._ticket.renewals >= 2)
        held.check()


async def test_a_body_that_closes_the_connection_is_released_through_the_leases_own(
    dsn: str, aconn2: AConn
) -> None:
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as mine,
        alease(mine, "sweep", ttl=5),
    ):
        await mine.close()
    assert await aclaim(aconn2, "sweep") is not None
