"""What a holder may believe (CONTRACT section 2), tried from outside, async API.

The twins of tests/api/test_belief.py for ``alease`` and ``akeep_fresh``: the same
defects of issue 10, the same belief witness, the contender in a thread of its
own (another party, with its own connection). An ``alease`` body must also be
cancelled when its lease is lost, before any callback runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pylease import InvalidArgument, LeaseLost, PyleaseError, akeep_fresh, alease, errors
from tests.api.test_belief import (
    MAX_FENCE,
    OWNER_TTL,
    SHORT_TTL,
    SLOW_ON_LOST,
    TRIED_FOR,
    exhaust,
    server_ahead,
)
from tests.support import faultkit
from tests.support.faultkit import BLACKHOLE, DROP, Fork, proxy
from tests.support.safety_kit import KINDS, Contender, Db, make_db
from tests.support.witness import Witness

BOUND = 30.0


@pytest.fixture
def w(tmp_path: Path) -> Witness:
    return Witness(tmp_path / "witness.jsonl")


@pytest.fixture(params=KINDS)
def db(
    request: pytest.FixtureRequest, fresh_db: Any, pg_template: str, tmp_path: Path
) -> Iterator[Db]:
    with make_db(request.param, lambda: fresh_db(pg_template), tmp_path) as made:
        yield made


@pytest.fixture
def pg(fresh_db: Any, pg_template: str, tmp_path: Path) -> Iterator[Db]:
    with make_db("postgres", lambda: fresh_db(pg_template), tmp_path) as made:
        yield made


async def keep_sampling(w: Witness, held: Any, until: Callable[[], bool], bound: float) -> None:
    """The body's own samples, every 10 ms, until ``until()`` or ``bound`` seconds."""
    limit = time.monotonic() + bound
    while time.monotonic() < limit:
        w.sample(held)
        if until():
            break
        await asyncio.sleep(0.01)
    for _ in range(5):
        w.sample(held)
        await asyncio.sleep(0.01)


async def until(predicate: Callable[[], bool], timeout: float = BOUND) -> None:
    """Wait for ``predicate()``, looking every 20 ms; a liveness bound, never a speed."""
    limit = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < limit, f"not within {timeout} s"
        await asyncio.sleep(0.02)


async def leave(cm: Any) -> BaseException | None:
    try:
        await cm.__aexit__(None, None, None)
    except BaseException as exc:
        return exc
    return None


@contextlib.asynccontextmanager
async def entered(cm: Any) -> AsyncIterator[Any]:
    """Enter ``cm``, and leave it at the end whatever its exit raises."""
    held = await cm.__aenter__()
    try:
        yield held
    finally:
        await leave(cm)


# 1. A shortened ttl ---------------------------------------------------------------


@pytest.mark.parametrize("via", ["akeep_fresh"])
async def test_1_an_owner_sees_a_ttl_shortened_by_another_renewer(
    db: Db, w: Witness, via: str
) -> None:
    claimed = time.monotonic()
    async with entered(alease(db.url, "kf", ttl=OWNER_TTL)) as held:
        w.sample(held)
        if via == "akeep_fresh":
            # Left at once: its entry renewal put its ttl in force. A helper whose own
            # 0.5 s ran out before its exit (a loaded machine) says so, as it must.
            helper = akeep_fresh(db.url, "kf", held.holder, ttl=SHORT_TTL)
            await helper.__aenter__()
            ended = await leave(helper)
            assert ended is None or isinstance(ended, LeaseLost), ended
        else:
            assert db.backend().renew("kf", held.holder, timedelta(seconds=SHORT_TTL))
        shortened = db.row("kf")
        # The owner's next renewal puts its own ttl back in force.
        await until(lambda: db.row("kf").renewed_at > shortened.renewed_at)
        assert db.row("kf").ttl == timedelta(seconds=OWNER_TTL), db.row("kf")
        with Contender(w, db.backend(), "kf") as contender:
            left = claimed + TRIED_FOR - time.monotonic()
            await keep_sampling(
                w, held, contender.granted.is_set, bound=max(left, 2 * OWNER_TTL / 3)
            )
    w.assert_sound()
    assert not contender.granted.is_set(), w.story()


# 2. Fork --------------------------------------------------------------------------


async def test_2_a_forked_child_leaving_an_inherited_async_block_releases_nothing(
    db: Db, w: Witness
) -> None:
    fork = Fork()
    cm = alease(db.url, "afork", ttl=3)
    held = await cm.__aenter__()
    try:
        with fork.guard():
            if fork.fork():
                # The child must not touch the parent's loop (its epoll and self-pipe
                # are shared with the parent): it leaves the inherited block on its own.
                loop = asyncio.new_event_loop()
                loop.run_until_complete(cm.__aexit__(SystemExit, SystemExit(0), None))
                sys.exit(0)
        result = await asyncio.to_thread(fork.wait, 15)
        with Contender(w, db.backend(), "afork") as contender:
            await keep_sampling(w, held, contender.granted.is_set, bound=1.5)
        w.assert_sound()
        assert result.escaped == "SystemExit" and result.status == 0, result.output
        assert db.holder_of("afork") == held.holder
        held.check()
    finally:
        await leave(cm)


# 4. A renewal in the caller's transaction -------------------------------------------


async def test_4_the_lease_connection_as_heartbeat_target_is_refused(pg: Db) -> None:
    conn = await psycopg.AsyncConnection.connect(pg.dsn or "")
    try:
        await conn.execute("CREATE TABLE work (x int)")
        await conn.commit()
        await conn.execute("INSERT INTO work VALUES (1)")  # the caller's open transaction
        with contextlib.suppress(LeaseLost), pytest.raises(InvalidArgument):
            async with alease(conn, "hb", ttl=1.5, heartbeat_target=conn):
                await asyncio.sleep(1.2)
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
        with contextlib.suppress(LeaseLost):
            async with alease(own, "hb2", ttl=1.5, heartbeat_target=dedicated):
                await dedicated.execute("INSERT INTO work VALUES (1)")
                await asyncio.sleep(1.2)
        await dedicated.rollback()
        cur = await own.execute("SELECT count(*) FROM work")
        assert await cur.fetchone() == (0,)
    finally:
        await own.close()
        await dedicated.close()


# 5. A database that stops answering while TCP stays up -----------------------------


async def test_5_leaving_the_block_is_bounded_and_sends_no_cancel(
    pg: Db, w: Witness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pylease")
    with proxy(pg.dsn or "") as p:
        cm = alease(p.dsn, "stuck", ttl=2, cancel_on_lost=False)
        held = await cm.__aenter__()
        p.set(BLACKHOLE)
        with Contender(w, pg.backend(), "stuck") as contender:
            await keep_sampling(
                w, held, lambda: held.lost and contender.granted.is_set(), bound=BOUND
            )
        assert held.lost, w.story()
        exiting = asyncio.ensure_future(leave(cm))
        done, _ = await asyncio.wait([exiting], timeout=25)
        left = bool(done)
        p.set(DROP)
        if not left:
            await asyncio.wait([exiting], timeout=BOUND)
        cancels = p.cancels
    w.assert_sound()
    assert left, "leaving the block hung with the database silent"
    assert cancels == 0, "a query cancel was sent"


# 6. A slow on_lost -----------------------------------------------------------------


@pytest.mark.parametrize("callback", ["coroutine", "blocking function"])
async def test_6_a_slow_async_on_lost_does_not_stall_other_leases(
    pg: Db, w: Witness, callback: str
) -> None:
    slow_done = threading.Event()

    async def slow_coroutine(_error: LeaseLost) -> None:
        w.note("on_lost-start", "a")
        await asyncio.sleep(SLOW_ON_LOST)
        slow_done.set()

    def slow_function(_error: LeaseLost) -> None:
        # Issue 21, item 7: a plain callback that blocks, called on the loop, stopped
        # the renewals of every other lease of the loop, and the cancelled body's exit.
        w.note("on_lost-start", "a")
        time.sleep(SLOW_ON_LOST)
        slow_done.set()

    slow: Any = slow_coroutine if callback == "coroutine" else slow_function

    a_cancelled = asyncio.Event()

    async def body_a(held_ready: asyncio.Event) -> None:
        with contextlib.suppress(LeaseLost):
            async with alease(p.dsn, "a", ttl=2, on_lost=slow):
                held_ready.set()
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    w.note("a-cancelled", "a")
                    a_cancelled.set()
                    raise

    with proxy(pg.dsn or "") as p:
        ready = asyncio.Event()
        task_a = asyncio.ensure_future(body_a(ready))
        await asyncio.wait_for(ready.wait(), BOUND)
        try:
            async with alease(pg.dsn or "", "b", ttl=2) as b:
                p.set(BLACKHOLE)
                with Contender(w, pg.backend(), "b") as contender:
                    await keep_sampling(w, b, slow_done.is_set, bound=BOUND)
                w.assert_sound()
                assert not contender.granted.is_set(), w.story()
                assert not b.lost
                # Cancel first: A's body ended before its slow callback did.
                assert a_cancelled.is_set(), w.story()
        finally:
            p.set(DROP)
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task_a, BOUND)


# 7. A fenced transaction ------------------------------------------------------------


async def test_7_a_fenced_transaction_does_not_make_other_leases_lose(pg: Db, w: Witness) -> None:
    owner = await psycopg.AsyncConnection.connect(pg.dsn or "", autocommit=True)
    fencer = psycopg.connect(pg.dsn or "")
    try:
        async with alease(owner, "fen", ttl=2) as fen, alease(owner, "other", ttl=2) as other:
            fencer.execute("SELECT lease_holds(%s, %s, %s)", ("fen", fen.holder, fen.fence))
            with Contender(w, pg.backend(), "other") as contender:
                await keep_sampling(w, other, lambda: False, bound=2.6)  # past other's ttl
            fencer.commit()
            w.assert_sound()
            assert not other.lost, "a fenced transaction on 'fen' made 'other' lose"
            assert not contender.granted.is_set()
    finally:
        fencer.close()
        await owner.close()


# 8. An abandoned lease --------------------------------------------------------------


async def test_8_an_abandoned_async_lease_stops_being_renewed(db: Db, w: Witness) -> None:
    cm = alease(db.url, "abandoned", ttl=1.5)
    await cm.__aenter__()
    del cm
    gc.collect()
    with Contender(w, db.backend(), "abandoned") as contender:
        granted = await asyncio.to_thread(contender.granted.wait, 10)
    assert granted, "an abandoned lease was still renewed 10 s after it was collected"


# 9. Clock steps --------------------------------------------------------------------

AHOLD_AND_REPORT = """
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
        w.note("detected", name, held.holder)
        await asyncio.sleep(3600)
asyncio.run(main())
"""


def test_9_sqlite_an_async_holder_whose_clock_steps_forward_learns_it_lost(
    tmp_path: Path, w: Witness
) -> None:
    from pylease.sqlite import connect

    path = tmp_path / "clock.sqlite3"
    connect(path).close()

    def noted(what: str) -> bool:
        return any(e.kind == "note" and e.fields.get("what") == what for e in w.events())

    with faultkit.fake_clock(0) as clock:
        holder = faultkit.python_under(
            clock, AHOLD_AND_REPORT, f"sqlite:///{path}", "clk", "1.5", str(w.path)
        )
        try:
            faultkit.wait_until(lambda: noted("held"), what="the holder to hold")
            time.sleep(1.0)
            clock.step_to(120)
            faultkit.wait_until(
                lambda: noted("detected"), timeout=10, what="the step reported as a loss"
            )
        finally:
            holder.kill()
            holder.wait(BOUND)


async def test_9_postgres_a_server_clock_step_is_reported_to_an_async_holder(w: Witness) -> None:
    from pylease.migrate import migrate

    with faultkit.fake_clock(0) as clock, faultkit.server(env=clock.env()) as srv:
        migrate(srv.dsn, say=lambda _line: None)
        async with entered(alease(srv.dsn, "srvclk", ttl=1.5, cancel_on_lost=False)) as held:
            await asyncio.sleep(1.0)
            assert w.sample(held)
            clock.step_to(120)
            await asyncio.to_thread(
                faultkit.wait_until, lambda: server_ahead(srv.dsn) > 100, BOUND, "the step"
            )
            await keep_sampling(w, held, lambda: held.lost, bound=10)
            assert held.lost, "a server clock 120 s ahead went unnoticed:\n" + w.story()


# 10. One holder, two claims ----------------------------------------------------------


async def test_10_the_same_explicit_holder_twice_in_one_loop_is_refused(db: Db, w: Witness) -> None:
    first_cm = alease(db.url, "dup", ttl=3, holder="worker-1")
    await first_cm.__aenter__()
    second_cm = alease(db.url, "dup", ttl=3, holder="worker-1")
    try:
        second = await second_cm.__aenter__()
    except InvalidArgument:
        await leave(first_cm)
        return
    # Today both are inside with fence 1; the first to leave releases it.
    await leave(first_cm)
    with Contender(w, db.backend(), "dup") as contender:
        await keep_sampling(w, second, contender.granted.is_set, bound=3)
    await leave(second_cm)
    w.assert_sound()
    raise AssertionError("a second live lease with the same holder was granted")


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


# 11. Fence exhaustion ------------------------------------------------------------------


async def test_11_an_async_claim_at_the_last_fence_raises_fence_exhausted(db: Db) -> None:
    exhaust(db, "fx")
    fence_exhausted = getattr(errors, "FenceExhausted", None)
    assert fence_exhausted is not None, "pylease.errors has no FenceExhausted"
    assert issubclass(fence_exhausted, PyleaseError)
    with pytest.raises(fence_exhausted, match="fx"):
        await alease(db.url, "fx", ttl=5).__aenter__()
    rows = db.backend().status("fx")
    assert [(r.holder, r.fence) for r in rows] == [("old", MAX_FENCE)]
