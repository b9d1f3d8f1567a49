# The source of tests/api/test_belief.py: tools/async_to_sync.py writes it from this file.
"""What a holder may believe (CONTRACT section 2), tried from outside, on both APIs.

One test per defect of issue 10, each reproducing it as the issue tells it, written
once for both APIs: test_belief_async.py is the source, test_belief.py is generated
from it. The belief witness (tests/support/witness.py) records, on the
machine's one monotonic clock, every grant to a contender and every belief the holder
sampled (``held.lost`` and ``held.check()``); a test fails on any belief of the first
holder stamped after a grant to another. No test asserts a duration: the order of
events is the assertion, and the few liveness bounds are generous. The contender runs
in a thread of its own (another party, with its own connection).

The twins differ where the APIs do: a body on the event loop is cancelled when its
lease is lost, before any callback runs, where a thread's body learns it from
``held.lost``; a forked child must not touch the parent's event loop. The tests of
other processes (a child forked during a renewal thread's statement, the command
``pylease run`` runs) are in test_belief_processes.py, the kit's own in
test_belief_kit.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pylease import InvalidArgument, LeaseLost, PyleaseError, akeep_fresh, alease, errors
from pylease._acompat import AEvent, asleep, ato_thread
from tests.support import faultkit
from tests.support.faultkit import BLACKHOLE, DROP, Fork, proxy
from tests.support.leases import afinished_within, ajoin_workers, asleep_until, astart_worker
from tests.support.safety_kit import Contender, Db, akeep_sampling, aleave
from tests.support.witness import Witness

BOUND = 30.0
MAX_FENCE = 2**63 - 1


@pytest.fixture
def w(tmp_path: Path) -> Witness:
    return Witness(tmp_path / "witness.jsonl")


@contextlib.asynccontextmanager
async def entered(cm: Any) -> AsyncIterator[Any]:
    """Enter ``cm``, and leave it at the end whatever its exit raises."""
    held = await cm.__aenter__()
    try:
        yield held
    finally:
        await aleave(cm)


def uncancelled(url: str, name: str, ttl: float) -> Any:
    """A lease block whose body runs on when the lease is lost, to sample its belief."""
    if True:  # ASYNC
        return alease(url, name, ttl=ttl, cancel_on_lost=False)
    else:
        return alease(url, name, ttl=ttl)


# 1. A shortened ttl ---------------------------------------------------------------


# The owner renews every 1 s; past its claim's 3 s, a renewal with the row's 0.5 s
# ttl would leave the server's expiry 0.5 s short of each next renewal, so a contender
# trying until two renewals past the claim's ttl would be granted the lease.
OWNER_TTL = 3.0
SHORT_TTL = 0.5
TRIED_FOR = OWNER_TTL + 2 * OWNER_TTL / 3


@pytest.mark.parametrize("via", ["akeep_fresh", "lease_renew"])
async def test_1_an_owner_sees_a_ttl_shortened_by_another_renewer(
    db: Db, w: Witness, via: str
) -> None:
    claimed = time.monotonic()
    async with entered(alease(db.url, "kf", ttl=OWNER_TTL)) as held:
        w.sample(held)
        if via == "akeep_fresh":
            # A helper keeps the owner's lease fresh with a shorter ttl, and stops at
            # once: its entry renewal put its ttl in force (and raises if the owner's
            # lease were not held). A helper whose own 0.5 s ran out before its exit (a
            # loaded machine) says so, as it must: its business, not the owner's.
            helper = akeep_fresh(db.url, "kf", held.holder, ttl=SHORT_TTL)
            await helper.__aenter__()
            ended = await aleave(helper)
            assert ended is None or isinstance(ended, LeaseLost), ended
        else:
            assert db.backend().renew("kf", held.holder, timedelta(seconds=SHORT_TTL))
        shortened = db.row("kf")
        # The owner's next renewal puts its own ttl back in force.
        assert await asleep_until(lambda: db.row("kf").renewed_at > shortened.renewed_at, BOUND), (
            "the owner did not renew"
        )
        assert db.row("kf").ttl == timedelta(seconds=OWNER_TTL), db.row("kf")
        with Contender(w, db.backend(), "kf") as contender:
            left = claimed + TRIED_FOR - time.monotonic()
            # At least two renewals' time, however late a loaded machine got here.
            await akeep_sampling(
                w, held, contender.granted.is_set, bound=max(left, 2 * OWNER_TTL / 3)
            )
    w.assert_sound()
    assert not contender.granted.is_set(), w.story()


# 2. Fork --------------------------------------------------------------------------


async def test_2_a_forked_child_leaving_the_block_releases_nothing(db: Db, w: Witness) -> None:
    fork = Fork()
    cm = alease(db.url, "fork", ttl=3)
    held = await cm.__aenter__()
    try:
        with fork.guard():
            if fork.fork():
                # The child leaves the block it inherited, as SystemExit would.
                if True:  # ASYNC
                    # Not on the parent's loop: its epoll and self-pipe are the parent's too.
                    loop = asyncio.new_event_loop()
                    loop.run_until_complete(cm.__aexit__(SystemExit, SystemExit(0), None))
                else:
                    cm.__exit__(SystemExit, SystemExit(0), None)
                sys.exit(0)
        result = await ato_thread(fork.wait, 15)
        with Contender(w, db.backend(), "fork") as contender:
            await akeep_sampling(w, held, contender.granted.is_set, bound=1.5)
        w.assert_sound()
        assert result.escaped == "SystemExit" and result.status == 0, result.output
        assert db.holder_of("fork") == held.holder, w.story()
        held.check()
    finally:
        await aleave(cm)


# 4. A renewal in the caller's transaction -------------------------------------------


async def test_4_the_lease_connection_as_heartbeat_target_is_refused(pg: Db) -> None:
    conn = await psycopg.AsyncConnection.connect(pg.dsn or "")
    try:
        await conn.execute("CREATE TABLE work (x int)")
        await conn.commit()
        await conn.execute("INSERT INTO work VALUES (1)")  # the caller's open transaction
        with contextlib.suppress(LeaseLost), pytest.raises(InvalidArgument):  # noqa: SIM117, RUF100
            async with alease(conn, "hb", ttl=1.5, heartbeat_target=conn):
                await asleep(1.2)  # a few renewals' time
        await conn.rollback()
        cur = await conn.execute("SELECT count(*) FROM work")
        assert await cur.fetchone() == (0,)
    finally:
        await conn.close()


async def test_4_no_renewal_runs_on_a_heartbeat_connection_that_is_not_idle(pg: Db) -> None:
    own = await psycopg.AsyncConnection.connect(pg.dsn or "", autocommit=True)
    dedicated = await psycopg.AsyncConnection.connect(pg.dsn or "")
    try:
        await own.execute("CREATE TABLE work (x int)")
        with contextlib.suppress(LeaseLost):  # noqa: SIM117, RUF100
            async with alease(own, "hb2", ttl=1.5, heartbeat_target=dedicated):
                # Somebody opens a transaction on the connection dedicated to renewals.
                await dedicated.execute("INSERT INTO work VALUES (1)")
                await asleep(1.2)
        await dedicated.rollback()
        cur = await own.execute("SELECT count(*) FROM work")
        assert await cur.fetchone() == (0,)
    finally:
        await own.close()
        await dedicated.close()


# 5. A database that stops answering while TCP stays up -----------------------------


async def test_5_leaving_the_block_is_bounded_when_the_database_stops_answering(
    pg: Db, w: Witness, own_keeper: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pylease")
    with proxy(pg.dsn or "") as p:
        cm = uncancelled(p.dsn, "stuck", ttl=2)
        held = await cm.__aenter__()
        p.set(BLACKHOLE)
        with Contender(w, pg.backend(), "stuck") as contender:
            await akeep_sampling(
                w, held, lambda: held.lost and contender.granted.is_set(), bound=BOUND
            )
        assert held.lost, w.story()
        w.note("body-end", "stuck", held.holder)
        outcome: list[BaseException | None] = []

        async def exit_block() -> None:
            outcome.append(await aleave(cm))

        exiting = astart_worker(exit_block)
        # The contract allows 10 s; the bound here is a generous liveness bound.
        left = await afinished_within(exiting, 25)
        p.set(DROP)  # unblocks a hung exit, so the test ends either way
        await afinished_within(exiting, BOUND)
    w.assert_sound()
    assert left, "leaving the block hung with the database silent"
    assert isinstance(outcome[0], LeaseLost), outcome
    assert p.cancels == 0, "a query cancel was sent"


# 6. A slow on_lost -----------------------------------------------------------------

# Longer than b's 2 s ttl by a renewal interval and more: had the callback held up
# the keeper, b would run out while it ran, and the contender would be granted b.
SLOW_ON_LOST = 3.5


@pytest.mark.parametrize("callback", ["awaits", "blocks"])
async def test_6_a_slow_on_lost_does_not_stall_other_leases(
    pg: Db, w: Witness, own_keeper: Any, callback: str
) -> None:
    slow_done = threading.Event()

    async def awaits(_error: LeaseLost) -> None:
        w.note("on_lost-start", "a")
        await asleep(SLOW_ON_LOST)
        slow_done.set()

    def blocks(_error: LeaseLost) -> None:
        # Issue 21, item 7: a plain callback that blocked, called on the event loop,
        # stopped the renewals of every other lease of the loop.
        w.note("on_lost-start", "a")
        time.sleep(SLOW_ON_LOST)
        slow_done.set()

    slow: Any = awaits if callback == "awaits" else blocks

    with proxy(pg.dsn or "") as p:
        if True:  # ASYNC
            # A's body is cancelled when A is lost, before its callback runs.
            a_cancelled = AEvent()

            async def body_a(held_ready: asyncio.Event) -> None:
                with contextlib.suppress(LeaseLost):
                    async with alease(p.dsn, "a", ttl=2, on_lost=slow):
                        held_ready.set()
                        try:
                            await asleep(3600)
                        except asyncio.CancelledError:
                            w.note("a-cancelled", "a")
                            a_cancelled.set()
                            raise

            ready = AEvent()
            task_a = astart_worker(body_a, ready)
            await asyncio.wait_for(ready.wait(), BOUND)
        else:
            cm_a = alease(p.dsn, "a", ttl=2, on_lost=slow)
            a = cm_a.__enter__()
        try:
            async with alease(pg.dsn or "", "b", ttl=2) as b:
                p.set(BLACKHOLE)
                with Contender(w, pg.backend(), "b") as contender:
                    await akeep_sampling(w, b, slow_done.is_set, bound=BOUND)
                w.assert_sound()
                if True:  # ASYNC
                    # Cancel first: A's body ended before its slow callback did.
                    assert a_cancelled.is_set(), w.story()
                else:
                    assert a.lost
                assert not contender.granted.is_set(), w.story()
                assert not b.lost
        finally:
            p.set(DROP)
            if True:  # ASYNC
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(task_a, BOUND)
            else:
                aleave(cm_a)


# 7. A fenced transaction ------------------------------------------------------------


async def test_7_a_fenced_transaction_does_not_make_other_leases_lose(pg: Db, w: Witness) -> None:
    owner = await psycopg.AsyncConnection.connect(pg.dsn or "", autocommit=True)
    fencer = psycopg.connect(pg.dsn or "")
    try:
        # A ttl of 4: the keeper's first renewal opens its connection, which a loaded
        # machine (make test's two cores) has taken over a second to do.
        async with alease(owner, "fen", ttl=4) as fen, alease(owner, "other", ttl=4) as other:
            fencer.execute(
                "SELECT lease_holds(%s, %s, %s)", ("fen", fen.holder, fen.fence)
            )  # the fenced transaction stays open
            with Contender(w, pg.backend(), "other") as contender:
                await akeep_sampling(w, other, lambda: False, bound=4.6)  # past other's ttl
            fencer.commit()
            w.assert_sound()
            assert not other.lost, "a fenced transaction on 'fen' made 'other' lose"
            assert not contender.granted.is_set()
    finally:
        fencer.close()
        await owner.close()


# 8. An abandoned lease --------------------------------------------------------------


async def test_8_an_abandoned_lease_stops_being_renewed(
    db: Db, w: Witness, own_keeper: Any
) -> None:
    cm = alease(db.url, "abandoned", ttl=1.5)
    await cm.__aenter__()
    del cm
    gc.collect()
    with Contender(w, db.backend(), "abandoned") as contender:
        granted = await ato_thread(contender.granted.wait, 10)
    assert granted, "an abandoned lease was still renewed 10 s after it was collected"


# 9. Clock steps --------------------------------------------------------------------

# The holder of the clock tests, in a process of its own: it samples its belief until
# it learns it lost, says so, and holds on. select() rather than time.sleep(): under
# libfaketime 0.9.10, the clock_nanosleep with an absolute CLOCK_MONOTONIC deadline
# that time.sleep() uses fails with EINVAL once the wall clock was stepped.
HOLD_AND_REPORT = """
import select, sys
from pylease import lease
from tests.support.witness import Witness
url, name, ttl, path = sys.argv[1:5]
w = Witness(path)
with lease(url, name, ttl=float(ttl)) as held:
    w.note("held", name, held.holder)
    while w.sample(held):
        select.select([], [], [], 0.02)
    w.note("detected", name, held.holder, reason=str(held._ticket.error()))
    select.select([], [], [], 3600)
"""
if True:  # ASYNC
    # The holder of an alease, its body not cancelled when it learns it lost.
    HOLD_AND_REPORT = """
import asyncio, sys
from pylease import alease
from tests.support.witness import Witness
url, name, ttl, path = sys.argv[1:5]
w = Witness(path)
async def main():
    async with alease(url, name, ttl=float(ttl), cancel_on_lost=False) as held:
        w.note("held", name, held.holder)
        while w.sample(held):
            await asyncio.sleep(0.02)
        w.note("detected", name, held.holder, reason=str(held._ticket.error()))
        await asyncio.sleep(3600)
asyncio.run(main())
"""


def detected(w: Witness) -> bool:
    return any(e.kind == "note" and e.fields.get("what") == "detected" for e in w.events())


def noted(w: Witness, what: str) -> bool:
    return any(e.kind == "note" and e.fields.get("what") == what for e in w.events())


def test_9_sqlite_a_holder_whose_clock_steps_forward_learns_it_lost(
    tmp_path: Path, w: Witness
) -> None:
    from pylease.sqlite import connect

    path = tmp_path / "clock.sqlite3"
    connect(path).close()
    with faultkit.fake_clock(0) as clock:
        holder = faultkit.python_under(
            clock, HOLD_AND_REPORT, f"sqlite:///{path}", "clk", "1.5", str(w.path)
        )
        try:
            faultkit.wait_until(lambda: noted(w, "held"), what="the holder to hold")
            time.sleep(1.0)  # a renewal or two on the true clock
            clock.step_to(120)
            w.note("stepped", "clk")
            faultkit.wait_until(
                lambda: detected(w), timeout=10, what="the holder to report the step as a loss"
            )
        finally:
            holder.kill()
            holder.wait(BOUND)


def test_9_sqlite_a_contender_whose_clock_runs_ahead_is_reported_at_the_next_renewal(
    tmp_path: Path, w: Witness
) -> None:
    from pylease.sqlite import connect

    path = tmp_path / "ahead.sqlite3"
    connect(path).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_REPORT, f"sqlite:///{path}", "ahead", "3", str(w.path)],
        cwd=faultkit.ROOT,
    )
    try:
        faultkit.wait_until(lambda: noted(w, "held"), what="the holder to hold")
        with faultkit.fake_clock(120) as clock:
            grab = (
                "import sys; from datetime import timedelta\n"
                "from pylease.sqlite import SqliteBackend, connect\n"
                "from tests.support.witness import Witness\n"
                "backend = SqliteBackend(connect(sys.argv[1]))\n"
                "fence = backend.claim('ahead', timedelta(seconds=60), 'early')\n"
                "assert fence is not None, 'the contender ahead was not granted the lease'\n"
                "Witness(sys.argv[2]).grant('ahead', 'early', fence)\n"
            )
            contender = faultkit.python_under(clock, grab, str(path), str(w.path))
            assert contender.wait(BOUND) == 0
        # Outside the clock assumption the grant cannot be prevented, only reported.
        faultkit.wait_until(lambda: detected(w), timeout=10, what="the next renewal to report it")
        grant = w.grants("ahead")[0]
        found = next(e for e in w.events() if e.fields.get("what") == "detected")
        assert found.t > grant.t
    finally:
        holder.kill()
        holder.wait(BOUND)


def server_ahead(dsn: str) -> float:
    """How far the server's clock is ahead of ours, in seconds."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()
    assert row is not None
    return float(row[0]) - time.time()


async def test_9_postgres_a_server_clock_step_is_reported_at_the_next_renewal(w: Witness) -> None:
    from pylease.migrate import migrate

    with faultkit.fake_clock(0) as clock, faultkit.server(env=clock.env()) as srv:
        migrate(srv.dsn, say=lambda _line: None)
        async with entered(uncancelled(srv.dsn, "srvclk", ttl=1.5)) as held:
            await asleep(1.0)
            assert w.sample(held)
            clock.step_to(120)
            w.note("stepped", "srvclk")
            await ato_thread(
                faultkit.wait_until, lambda: server_ahead(srv.dsn) > 100, BOUND, "the server's step"
            )
            # libfaketime rereads its file within a second; the next renewals follow.
            await akeep_sampling(w, held, lambda: held.lost, bound=10)
            assert held.lost, "a server clock 120 s ahead went unnoticed:\n" + w.story()


# 10. One holder, two claims ----------------------------------------------------------


async def test_10_the_same_explicit_holder_twice_in_one_process_is_refused(
    db: Db, w: Witness
) -> None:
    first_cm = alease(db.url, "dup", ttl=3, holder="worker-1")
    await first_cm.__aenter__()
    second: list[Any] = []
    errors_: list[BaseException] = []

    async def claim_again() -> None:
        # Another party in this process: a task on the event loop, a thread on the sync side.
        try:
            cm = alease(db.url, "dup", ttl=3, holder="worker-1")
            second.append((cm, await cm.__aenter__()))
        except BaseException as exc:
            errors_.append(exc)

    await ajoin_workers([astart_worker(claim_again)], BOUND)
    try:
        if second:
            # Today both are inside with fence 1; the first to leave releases it.
            await aleave(first_cm)
            with Contender(w, db.backend(), "dup") as contender:
                await akeep_sampling(w, second[0][1], contender.granted.is_set, bound=3)
            await aleave(second[0][0])
            w.assert_sound()
        assert errors_ and isinstance(errors_[0], InvalidArgument), errors_
    finally:
        await aleave(first_cm)


if True:  # ASYNC

    def test_10_the_same_holder_in_a_thread_and_a_loop_is_refused(db: Db) -> None:
        """One process: a sync lease and an async one with the same holder collide too."""
        from pylease import lease

        with lease(db.url, "mixed", ttl=3, holder="worker-2"):
            refused: list[BaseException] = []

            async def again() -> None:
                try:
                    async with alease(db.url, "mixed", ttl=3, holder="worker-2"):
                        pass
                except BaseException as exc:
                    refused.append(exc)

            thread = threading.Thread(target=lambda: asyncio.run(again()))
            thread.start()
            thread.join(BOUND)
            assert refused and isinstance(refused[0], InvalidArgument), refused


async def test_10_keep_fresh_of_a_live_lease_is_fine(db: Db) -> None:
    async with (
        alease(db.url, "kept", ttl=3) as held,
        akeep_fresh(db.url, "kept", held.holder),
    ):
        held.check()


async def test_10_different_names_may_share_a_holder(db: Db) -> None:
    async with (
        alease(db.url, "n1", ttl=3, holder="h"),
        alease(db.url, "n2", ttl=3, holder="h") as h2,
    ):
        h2.check()


# 11. Fence exhaustion ------------------------------------------------------------------


def exhaust(db: Db, name: str) -> None:
    """A lease whose fence is at 2^63-1, expired, held by somebody gone."""
    backend = db.backend()
    assert backend.claim(name, timedelta(seconds=1), "old") is not None
    if db.kind == "postgres":
        backend.conn.execute(
            "UPDATE pylease_leases SET fence = %s, expires_at = now() - interval '1 min'"
            " WHERE name = %s",
            (MAX_FENCE, name),
        )
    else:
        backend.conn.execute(
            "UPDATE pylease_leases SET fence = ?, expires_at = expires_at - 60 WHERE name = ?",
            (MAX_FENCE, name),
        )


async def test_11_a_claim_at_the_last_fence_raises_fence_exhausted(db: Db) -> None:
    exhaust(db, "fx")
    fence_exhausted = getattr(errors, "FenceExhausted", None)
    assert fence_exhausted is not None, "pylease.errors has no FenceExhausted"
    assert issubclass(fence_exhausted, PyleaseError)
    with pytest.raises(fence_exhausted, match="fx"):
        await alease(db.url, "fx", ttl=5).__aenter__()
    rows = db.backend().status("fx")
    assert [(r.holder, r.fence) for r in rows] == [("old", MAX_FENCE)]


if True:  # ASYNC
    pass  # the SQL function is the same for both APIs: tried once, on the sync side
else:

    def test_11_sql_lease_claim_at_the_last_fence_raises_54000(pg: Db) -> None:
        exhaust(pg, "fx")
        with psycopg.connect(pg.dsn or "", autocommit=True) as conn:
            with pytest.raises(psycopg.Error) as caught:
                conn.execute("SELECT lease_claim('fx', '5s', 'new')")
            assert caught.value.sqlstate == "54000", caught.value
            assert "fx" in (caught.value.diag.message_primary or "")
