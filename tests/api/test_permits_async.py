# The source of tests/api/test_permits.py: tools/async_to_sync.py writes it from this file.
"""apermit() and aleases() (contract 5.1 and 5.3) on PostgreSQL and SQLite.

test_permits.py, for permit() and leases(), is generated from this file. The other
party (who holds, releases, revokes) acts through a backend on a connection of its
own, from a thread when it must act while a block waits.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pylease import InvalidArgument, LeaseBusy, LeaseLost, aleases, apermit
from pylease._acompat import asleep
from tests.support.leases import (
    DETECT,
    aenter_once,
    asleep_until,
    atogether,
    function_calls,
    later,
    no_poll,
    track_functions,
    wait_until,
)
from tests.support.safety_kit import Db

NAME = "exports"
HOUR = timedelta(hours=1)
# Liveness bounds of a loaded machine, never speeds.
BOUND = 30.0
# A wait whose deadline (and its last claim) comes only after BOUND has failed a test.
PATIENT = 4 * BOUND


async def test_permits_are_granted_up_to_the_limit_and_never_one_more(db: Db) -> None:
    other = db.backend()
    async with apermit(db.url, NAME, ttl=30, max_permits=2) as one:
        async with apermit(db.url, NAME, ttl=30, max_permits=2) as two:
            assert {*one.slots, *two.slots} == {0, 1}
            assert one.fence == next(iter(one.slots.values()))
            with pytest.raises(LeaseBusy) as busy:
                await aenter_once(apermit(db.url, NAME, ttl=30, max_permits=2))
            assert busy.value.name == NAME
            assert busy.value.holder in (one.holder, two.holder)
            held = sorted(r.holder for r in other.permit_status(NAME) if r.held)
            assert held == sorted([one.holder, two.holder])
            for h in (one, two):
                fence = next(iter(h.slots.values()))
                assert other.permit_holds(NAME, h.holder, fence)
        async with apermit(db.url, NAME, ttl=30, max_permits=2, wait=BOUND) as three:
            assert set(three.slots) <= {0, 1}
    assert not any(r.held for r in other.permit_status(NAME))


async def test_several_permits_are_granted_together_or_not_at_all(db: Db) -> None:
    other = db.backend()
    assert len(other.permit_claim(NAME, 3, HOUR, "x")) == 1
    with pytest.raises(LeaseBusy):
        await aenter_once(apermit(db.url, NAME, ttl=30, max_permits=3, permits=3))
    assert [r.holder for r in other.permit_status(NAME) if r.held] == ["x"]
    async with apermit(db.url, NAME, ttl=30, max_permits=3, permits=2) as held:
        assert len(held.slots) == 2
        assert all(fence >= 1 for fence in held.slots.values())  # a fence per slot


async def test_a_permit_waiter_wakes_when_a_slot_is_freed(db: Db) -> None:
    other = db.backend()
    assert len(other.permit_claim(NAME, 2, HOUR, "x", 2)) == 2

    def release() -> None:
        time.sleep(0.5)
        other.permit_release(NAME, "x")

    releaser = later(release)
    async with apermit(
        db.url, NAME, ttl=30, max_permits=2, wait=BOUND, poll_interval=no_poll(db)
    ) as held:
        assert len(held.slots) == 1
    # Its release committed before the grant, but the thread may still read the reply
    # on the connection that the test's end closes.
    releaser.join(BOUND)


@pytest.mark.usefixtures("only_notifications")
async def test_one_release_of_two_slots_wakes_two_waiters(db: Db) -> None:
    """permit_release sends one NOTIFY for both slots: the first waiter granted passes
    its turn on, so the second claims at once (not at its next poll)."""
    other = db.backend()
    assert len(other.permit_claim(NAME, 2, HOUR, "x", 2)) == 2
    got: list[dict[int, int]] = []

    async def wait_for_one() -> dict[int, int]:
        async with apermit(
            db.url, NAME, ttl=30, max_permits=2, wait=PATIENT, poll_interval=no_poll(db)
        ) as held:
            got.append(held.slots)
            # Both held at once: the second was woken while the first held its slot.
            assert await asleep_until(lambda: len(got) == 2, BOUND)
            return held.slots

    def release() -> None:
        time.sleep(0.5)
        other.permit_release(NAME, "x")

    releaser = later(release)
    first, second = await atogether(wait_for_one, wait_for_one)
    assert {*first, *second} == {0, 1}
    releaser.join(BOUND)


async def test_a_revoked_permit_is_lost_and_the_block_names_the_slot(db: Db) -> None:
    other = db.backend()
    with pytest.raises(LeaseLost) as lost:
        async with apermit(db.url, NAME, ttl=0.9, max_permits=1) as held:
            assert other.permit_revoke(NAME, held.holder)
            assert other.permit_claim(NAME, 1, HOUR, "thief")
            assert await asleep_until(lambda: held.lost, DETECT)
            with pytest.raises(LeaseLost):
                held.check()
    assert lost.value.name == NAME
    assert "'thief'" in str(lost.value)


async def test_a_release_that_finds_a_slot_taken_fails_the_work(db: Db) -> None:
    other = db.backend()

    def unkept() -> Any:
        # No keeper: the release is what finds the slot taken.
        return apermit(db.url, NAME, ttl=30, max_permits=2, heartbeat=False)

    with pytest.raises(LeaseLost):
        async with unkept() as held:
            assert other.permit_revoke(NAME, held.holder)
    failure = RuntimeError("the body's own")
    with pytest.raises(RuntimeError) as raised:
        async with unkept() as held:
            assert other.permit_revoke(NAME, held.holder)
            raise failure
    assert raised.value is failure
    assert any("no longer ours" in note for note in raised.value.__notes__)


async def test_the_keeper_keeps_permits_and_several_names_past_their_ttl(db: Db) -> None:
    other = db.backend()
    async with (
        apermit(db.url, NAME, ttl=1, max_permits=1) as permit_held,
        aleases(db.url, ["b", "a"], ttl=1) as names_held,
    ):
        limit = time.monotonic() + 3
        while time.monotonic() < limit:
            assert other.permit_claim(NAME, 1, HOUR, "x") == {}
            assert other.claim_all(["a"], HOUR, "x") == {}
            assert other.claim_all(["b"], HOUR, "x") == {}
            await asleep(0.2)
        permit_held.check()
        names_held.check()
    assert other.permit_claim(NAME, 1, HOUR, "x") != {}
    assert set(other.claim_all(["a", "b"], HOUR, "x")) == {"a", "b"}


async def test_several_names_are_granted_all_or_none(db: Db) -> None:
    other = db.backend()
    assert other.claim("b", HOUR, "x") is not None
    with pytest.raises(LeaseBusy) as busy:
        await aenter_once(aleases(db.url, ["c", "a", "b"], ttl=30))
    assert busy.value.name == "b" and busy.value.holder == "x"
    assert other.status("a") == [] and other.status("c") == []
    assert other.release("b", "x")
    async with aleases(db.url, ["c", "a", "b"], ttl=30) as held:
        assert list(held.fences) == ["c", "a", "b"] == list(held.names)
        assert held.name == "c" and held.fence == held.fences["c"]
        for name, fence in held.fences.items():
            assert other.holds(name, held.holder, fence)
    assert not any(r.held for n in "abc" for r in other.status(n))


async def test_one_name_stolen_loses_the_claim_of_several(db: Db) -> None:
    other = db.backend()
    with pytest.raises(LeaseLost) as lost:
        async with aleases(db.url, ["a", "b"], ttl=0.9) as held:
            assert other.steal("b", HOUR, "thief") is not None
            assert await asleep_until(lambda: held.lost, DETECT)
    assert "'b' granted to 'thief'" in str(lost.value)
    # The name still ours was given back; the stolen one stays the thief's.
    assert db.holder_of("a") is None and db.holder_of("b") == "thief"


@pytest.mark.usefixtures("only_notifications")
async def test_a_waiter_for_several_names_holds_none_while_it_waits(db: Db) -> None:
    """It waits on the first name in the way and then on the next one: woken by each
    release (no poll on PostgreSQL), holding neither name meanwhile."""
    other = db.backend()
    assert other.claim("a", HOUR, "x") is not None
    assert other.claim("b", HOUR, "y") is not None
    seen: list[str | None] = []

    def release_one_then_the_other() -> None:
        time.sleep(0.5)
        assert other.release("a", "x")
        time.sleep(1.0)
        seen.extend([db.holder_of("a"), db.holder_of("c")])
        assert other.release("b", "y")

    thread = later(release_one_then_the_other)
    started = time.monotonic()
    async with aleases(
        db.url, ["c", "b", "a"], ttl=30, wait=PATIENT, poll_interval=no_poll(db)
    ) as held:
        # Woken by the releases, not by the wait's last claim at its deadline.
        assert time.monotonic() - started < BOUND
        assert set(held.fences) == {"a", "b", "c"}
    thread.join(BOUND)
    assert seen == [None, None]


async def test_the_same_explicit_holder_twice_is_refused_before_any_sql(db: Db) -> None:
    async with aleases(db.url, ["a", "b"], ttl=30, holder="me"):
        with pytest.raises(InvalidArgument):
            await aenter_once(aleases(db.url, ["c", "b"], ttl=30, holder="me"))
        # The refused claim recorded nothing: "c" is free for this holder.
        async with aleases(db.url, ["c"], ttl=30, holder="me"):
            pass


async def test_invalid_arguments_raise_before_any_sql() -> None:
    url = "postgresql://postgres@127.0.0.1:1/nowhere"
    for call in (
        lambda: apermit(url, NAME, ttl=30, max_permits=0),
        lambda: apermit(url, NAME, ttl=30, max_permits=2, permits=3),
        lambda: apermit(url, NAME, ttl=30, max_permits=True),  # type: ignore[arg-type]
        lambda: aleases(url, [], ttl=30),
        lambda: aleases(url, ["a", "a"], ttl=30),
        lambda: aleases(url, "ab", ttl=30),
    ):
        with pytest.raises(InvalidArgument):
            call()


async def test_every_kind_is_renewed_by_one_statement_per_tick(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """The keeper across kinds (contract 5): a lease, permits and several names held
    by one process are renewed by pylease_renew_held, one statement per tick."""
    from pylease import alease

    track_functions(conn)
    async with (
        alease(dsn, "job", ttl=1.5) as lease_held,
        apermit(dsn, NAME, ttl=1.5, max_permits=3, permits=2) as permit_held,
        aleases(dsn, ["a", "b"], ttl=1.5) as names_held,
    ):
        helds = [lease_held, permit_held, names_held]
        assert await asleep_until(lambda: all(h._ticket.renewals >= 2 for h in helds), BOUND)
        ticks = max(h._ticket.renewals for h in helds)
    assert wait_until(lambda: function_calls(conn, "pylease_renew_held") >= 2, BOUND)
    calls = function_calls(conn, "pylease_renew_held")
    assert 2 <= calls <= ticks + 1, (calls, ticks)
    for one_by_one in ("lease_renew_each", "lease_renew", "permit_renew", "lease_renew_many"):
        assert function_calls(conn, one_by_one) == 0, one_by_one
