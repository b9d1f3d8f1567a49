# The source of tests/api/test_readers.py: tools/async_to_sync.py writes it from this file.
"""alease(..., shared=True) (contract 5.2) on PostgreSQL and SQLite: readers together,
a writer alone, the epoch, and who is woken when.

test_readers.py, for lease(..., shared=True), is generated from this file. The other
party acts through a backend on a connection of its own, from a thread when it must
act while a block waits. The processes' witness is test_readers_writers_witness.py.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from pylease import InvalidArgument, LeaseBusy, LeaseLost, alease
from pylease import _hub_async as hub
from pylease._acompat import asleep
from tests.support.leases import (
    DETECT,
    aenter_once,
    ajoin_workers,
    asleep_until,
    astart_worker,
    atogether,
    later,
    no_poll,
)
from tests.support.safety_kit import Db

NAME = "catalog"
HOUR = timedelta(hours=1)
# Liveness bounds of a loaded machine, never speeds.
BOUND = 30.0
PATIENT = 4 * BOUND


def in_line(db: Db, name: str) -> bool:
    """Whether a writer waits in line for ``name`` (the queue of waiting processes, or
    SQLite's own line)."""
    conn = db.backend().conn
    query = "SELECT count(*) FROM pylease_waiters WHERE name = " + (
        "?" if db.kind == "sqlite" else "%s"
    )
    return bool(conn.execute(query, (name,)).fetchone()[0])


async def test_readers_hold_together_with_the_epoch_and_a_writer_alone(db: Db) -> None:
    other = db.backend()
    async with (
        alease(db.url, NAME, ttl=30, shared=True) as one,
        alease(db.url, NAME, ttl=30, shared=True) as two,
    ):
        assert (one.fence, two.fence) == (0, 0)
        with pytest.raises(LeaseBusy):
            await aenter_once(alease(db.url, NAME, ttl=30))
        [row] = other.status(NAME)
        assert (row.state, row.holder, row.fence, row.shared) == ("shared", None, 0, 2)
        assert other.holds(NAME, one.holder, one.fence)
        assert not other.holds(NAME, one.holder, 1)
    async with alease(db.url, NAME, ttl=30) as writer:
        assert writer.fence == 1
        with pytest.raises(LeaseBusy):
            await aenter_once(alease(db.url, NAME, ttl=30, shared=True))
    async with alease(db.url, NAME, ttl=30, shared=True) as reader:
        assert reader.fence == 1  # the epoch: the latest writer's fence
    assert other.holders(NAME) == []


async def test_the_keeper_renews_a_reader_with_the_leases_beside_it(db: Db) -> None:
    async with (
        alease(db.url, NAME, ttl=0.9, shared=True) as reader,
        alease(db.url, "beside", ttl=0.9) as writer,
    ):
        await asleep(2.5)  # past the ttl: only renewals keep them
        assert not reader.lost and not writer.lost
        reader.check()
    assert db.backend().holders() == []


async def test_a_reader_that_stalled_past_a_writers_grant_is_told_it_lost(db: Db) -> None:
    other = db.backend()
    unkept = alease(db.url, NAME, ttl=0.5, shared=True, heartbeat=False)
    with pytest.raises(LeaseLost) as lost:
        async with unkept as reader:
            # Its ttl runs out (no renewal): a writer is granted the name.
            assert await asleep_until(lambda: other.claim(NAME, HOUR, "writer") == 1, BOUND)
            assert reader.lost
            # Its fenced writes are rejected from then on.
            assert not other.holds(NAME, reader.holder, reader.fence)
    assert "a writer was granted it since its epoch, with fence 1" in str(lost.value)


async def test_a_reader_takes_no_min_hold() -> None:
    with pytest.raises(InvalidArgument) as bad:
        alease("sqlite:///:memory:", NAME, ttl=30, shared=True, min_hold=30)
    assert bad.value.parameter == "min_hold"


@pytest.mark.usefixtures("only_notifications")
async def test_a_waiting_writer_is_woken_when_the_last_reader_leaves(db: Db) -> None:
    other = db.backend()
    assert other.claim_shared(NAME, HOUR, "r1") == 0
    assert other.claim_shared(NAME, HOUR, "r2") == 0

    left: list[float] = []

    def leave() -> None:
        # Once the writer waits: then only the last release can let it in.
        deadline = time.monotonic() + BOUND
        while not in_line(db, NAME) and time.monotonic() < deadline:
            time.sleep(0.02)
        other.release(NAME, "r1")
        time.sleep(0.3)
        # Marked before the last release: the writer it lets in may run before this
        # thread runs again (a loaded machine), and look at the mark at once.
        left.append(time.monotonic())
        other.release(NAME, "r2")

    leaver = later(leave)
    async with alease(db.url, NAME, ttl=30, wait=PATIENT, poll_interval=no_poll(db)) as writer:
        # Woken by the last reader's release, not by a poll nor its wait's deadline.
        assert left and time.monotonic() - left[0] < BOUND
        assert writer.fence == 1
        assert other.holders(NAME)[0].mode == "exclusive"
    # Before the test's end closes the connection it may still read its reply on.
    leaver.join(BOUND)


@pytest.mark.usefixtures("only_notifications")
async def test_waiting_readers_are_all_woken_when_the_writer_leaves(db: Db) -> None:
    other = db.backend()
    assert other.claim(NAME, HOUR, "writer") == 1
    inside: list[str] = []

    async def read() -> int:
        async with alease(
            db.url, NAME, ttl=30, shared=True, wait=PATIENT, poll_interval=no_poll(db)
        ) as held:
            inside.append(held.holder)
            # All three in at once: each was woken while the others held their shares.
            assert await asleep_until(lambda: len(inside) == 3, BOUND)
            return held.fence

    async def leave() -> int:
        # Once the readers wait (SQLite's poll: a moment), only the release wakes them.
        if db.kind == "postgres":
            assert await asleep_until(lambda: hub.waiters(NAME) == 3, BOUND)
        else:
            await asleep(0.5)
        other.release(NAME, "writer")
        return 1

    assert await atogether(read, read, read, leave) == [1, 1, 1, 1]


async def test_a_waiting_writer_keeps_new_readers_out(db: Db) -> None:
    other = db.backend()
    assert other.claim_shared(NAME, HOUR, "r1") == 0
    granted: list[int] = []

    async def write() -> None:
        async with alease(db.url, NAME, ttl=30, wait=PATIENT, poll_interval=no_poll(db)) as held:
            granted.append(held.fence)

    async def meanwhile() -> None:
        # Once the writer waits in line, a new reader is busy; the old one stays in.
        async def kept_out() -> bool:
            try:
                await aenter_once(alease(db.url, NAME, ttl=30, shared=True))
            except LeaseBusy:
                return True
            return False

        deadline = time.monotonic() + BOUND
        while not await kept_out():
            assert time.monotonic() < deadline, "the waiting writer never kept a reader out"
            await asleep(0.1)
        assert other.renew(NAME, "r1")
        assert other.release(NAME, "r1")

    await atogether(write, meanwhile)
    assert granted == [1]
    assert await asleep_until(lambda: other.claim_shared(NAME, HOUR, "r2") == 1, DETECT)


def share_id(db: Db, name: str, holder: str) -> int | None:
    """The id of ``holder``'s share of ``name`` (migration 0019; SQLite 0009)."""
    mark = "?" if db.kind == "sqlite" else "%s"
    row = (
        db.backend()
        .conn.execute(
            f"SELECT share FROM pylease_shared WHERE name = {mark} AND holder = {mark}",
            (name, holder),
        )
        .fetchone()
    )
    return None if row is None else int(row[0])


async def test_an_explicit_readers_holder_used_twice_never_frees_the_later_share(
    db: Db,
) -> None:
    """A reader's explicit holder reused by a later block: the earlier block's release,
    run late (its connection abandoned), names the earlier share and frees nothing of
    the later one, which the keeper goes on renewing; while a share of the holder is
    live, another process's claim with that holder is busy (contract 5.6)."""
    other = db.backend()
    async with alease(db.url, NAME, ttl=30, holder="h", shared=True) as first:
        earlier = share_id(db, NAME, "h")
        assert earlier is not None
        # Another process that uses the same holder: busy, never joined to this share.
        assert other.claim_share(NAME, HOUR, "h", new=True) is None
    async with alease(db.url, NAME, ttl=0.9, holder="h", shared=True) as second:
        assert second.fence == first.fence
        later_share = share_id(db, NAME, "h")
        assert later_share is not None and later_share != earlier
        # The earlier block's release, arriving now.
        assert other.release_share(NAME, "h", first.fence, earlier) is False
        with pytest.raises(LeaseBusy):
            await aenter_once(alease(db.url, NAME, ttl=30))
        await asleep(2.5)  # past the ttl: only the keeper's renewals of its share keep it
        assert not second.lost
        second.check()
        assert share_id(db, NAME, "h") == later_share
    assert other.holders(NAME) == []


async def test_a_reused_readers_holder_believes_until_a_writer_is_granted(db: Db) -> None:
    """The belief of a reused reader's holder at the moment a writer is granted: the
    earlier block's release, arriving after a later block of the same holder took a
    share of the same epoch, leaves that share; the writer waiting meanwhile is granted
    only once the later block gave its share back, never while that block believes, and
    the later block is never told it lost. (A release by epoch alone deletes the later
    share: the writer is then granted inside the later block, which still believes.)"""
    other = db.backend()
    async with alease(db.url, NAME, ttl=30, holder="h", shared=True) as first:
        earlier = share_id(db, NAME, "h")
    assert earlier is not None
    believing: list[Any] = []  # the later block's lease while its body runs
    at_grant: list[bool] = []  # whether the later block believed as the writer was granted

    async def write() -> None:
        async with alease(db.url, NAME, ttl=30, wait=PATIENT, poll_interval=no_poll(db)):
            at_grant.append(any(not held.lost for held in believing))

    async with alease(db.url, NAME, ttl=0.9, holder="h", shared=True) as second:
        believing.append(second)
        assert second.fence == first.fence
        writing = astart_worker(write)
        assert await asleep_until(lambda: in_line(db, NAME), BOUND)
        # The earlier block's release, arriving now: it names the earlier share.
        assert other.release_share(NAME, "h", first.fence, earlier) is False
        # Past the ttl: only the keeper's renewals of the later share keep it, and the
        # writer (woken by any reader's release while it waits) stays out.
        until = time.monotonic() + 2.5
        while time.monotonic() < until:
            assert not second.lost
            await asleep(0.05)
        second.check()
        # The body ends here: its belief ends before its release is sent.
        believing.clear()
    await ajoin_workers([writing], PATIENT)
    assert at_grant == [False]
    assert other.holders(NAME) == []
