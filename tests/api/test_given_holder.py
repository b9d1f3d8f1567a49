"""A holder given to two processes (issue 21, item 10; contract 5.6).

``@exclusive(holder=hostname)`` or ``pylease run --holder $(hostname)`` in two
processes: the second claim was an idempotent re-claim of the first's live tenure, so
both ran at once. A claim from Python with a holder it was given now starts a new
tenure only: the other process's live tenure is busy, saying so, and writes nothing;
an expired one is taken over with a new fence, so the earlier tenure's fenced writes
fail. The other process here claims through the backend, on its own connection.
Permits and several names claim a new tenure the same way, and the keeper renews only
the tenure a block holds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest

from pylease import (
    LeaseBusy,
    LeaseLost,
    alease,
    aleases,
    apermit,
    lease,
    leases,
    permit,
    run_exclusive,
)
from pylease._backend import Backend
from pylease.sqlite import SqliteBackend
from pylease.sqlite import connect as sqlite_connect
from tests.support.leases import asleep_until, wait_until

HOUR = timedelta(hours=1)
# Generous: a renewal comes every third of the 1 s ttl.
BOUND = 10.0


@contextmanager
def other_process(url: str) -> Iterator[Backend]:
    """Another process's backend, on a connection of its own."""
    if url.startswith("sqlite"):
        conn: Any = sqlite_connect(url)
        try:
            yield SqliteBackend(conn)
        finally:
            conn.close()
        return
    import psycopg

    from pylease.postgres import PostgresBackend

    with psycopg.connect(url, autocommit=True) as pg:
        yield PostgresBackend(pg)


def test_a_given_holder_live_in_another_process_is_busy_saying_so(url: str) -> None:
    with other_process(url) as other:
        fence = other.claim("nightly", timedelta(seconds=30), "web-1")
        before = other.status("nightly")
        refused = pytest.raises(LeaseBusy, match="another process uses the same holder")
        with refused as busy, lease(url, "nightly", ttl=30, holder="web-1"):
            pytest.fail("the body ran while another process held the lease")
        assert busy.value.holder == "web-1"
        assert run_exclusive(url, "nightly", 30, lambda: 1, holder="web-1").ran is False
        # Refused, it wrote nothing: the other process's tenure is as it was.
        assert other.status("nightly") == before
        assert other.release("nightly", "web-1", None, fence)


def test_a_given_holder_takes_its_expired_tenure_with_a_new_fence(url: str) -> None:
    with other_process(url) as other:
        old = other.claim("nightly", timedelta(seconds=0.3), "web-1")
        assert old is not None
        time.sleep(0.6)
        with lease(url, "nightly", ttl=30, holder="web-1") as held:
            assert held.fence > old
            # The earlier tenure's fenced writes fail from now on; its renewals would
            # extend this tenure, whose fence it does not have.
            assert not other.holds("nightly", "web-1", old)
            assert other.holds("nightly", "web-1", held.fence)


def test_a_default_holder_is_unaffected(url: str) -> None:
    with lease(url, "nightly", ttl=30) as first, other_process(url) as other:
        # The SQL API's re-claim by the same holder stays idempotent (contract 1).
        assert other.claim("nightly", timedelta(seconds=30), first.holder) == first.fence


def test_a_loss_by_a_release_under_the_same_holder_does_not_say_the_ttl_ran_out(
    url: str,
) -> None:
    given = lease(url, "nightly", ttl=30, holder="web-1")
    with pytest.raises(LeaseLost) as lost, given, other_process(url) as other:
        assert other.release("nightly", "web-1")  # as another user of web-1 would
    assert "ttl ran out" not in str(lost.value)
    assert "released by another user of its holder 'web-1'" in str(lost.value)


async def test_async_a_given_holder_live_in_another_process_is_busy_saying_so(url: str) -> None:
    with other_process(url) as other:
        fence = other.claim("nightly", timedelta(seconds=30), "web-1")
        before = other.status("nightly")
        with pytest.raises(LeaseBusy, match="another process uses the same holder"):
            async with alease(url, "nightly", ttl=30, holder="web-1", wait=0.5):
                pytest.fail("the body ran while another process held the lease")
        assert other.status("nightly") == before
        assert other.release("nightly", "web-1", None, fence)


async def test_async_a_given_holder_takes_its_expired_tenure_with_a_new_fence(url: str) -> None:
    with other_process(url) as other:
        old = other.claim("nightly", timedelta(seconds=0.3), "web-1")
        assert old is not None
        time.sleep(0.6)
        async with alease(url, "nightly", ttl=30, holder="web-1") as held:
            assert held.fence > old
            assert not other.holds("nightly", "web-1", old)


# Permits and several names (issue 21, gap c): the same new-tenure claim -------------

SEM = "exports"
NAMES = ["acct-17", "acct-42"]


def test_a_given_holder_of_permits_live_in_another_process_is_busy_saying_so(url: str) -> None:
    with other_process(url) as other:
        slots = other.permit_claim(SEM, 2, timedelta(seconds=30), "web-1")
        before = other.permit_status(SEM)
        refused = pytest.raises(LeaseBusy, match="another process uses the same holder")
        with refused, permit(url, SEM, ttl=30, max_permits=2, holder="web-1"):
            pytest.fail("the body ran on the other process's permits")
        assert other.permit_status(SEM) == before
        assert other.permit_claim(SEM, 2, timedelta(seconds=30), "web-1") == slots


def test_a_given_holder_takes_its_expired_permits_with_new_fences(url: str) -> None:
    with other_process(url) as other:
        old = other.permit_claim(SEM, 2, timedelta(seconds=0.3), "web-1")
        time.sleep(0.6)
        with permit(url, SEM, ttl=30, max_permits=2, holder="web-1") as held:
            assert set(held.slots) == set(old)
            assert all(held.slots[slot] > fence for slot, fence in old.items())
            assert not any(other.permit_holds(SEM, "web-1", fence) for fence in old.values())


def test_a_given_holder_of_several_names_live_in_another_process_is_busy_saying_so(
    url: str,
) -> None:
    with other_process(url) as other:
        other.claim("acct-42", timedelta(seconds=30), "web-1")
        before = other.status()
        refused = pytest.raises(LeaseBusy, match="another process uses the same holder")
        with refused, leases(url, NAMES, ttl=30, holder="web-1"):
            pytest.fail("the body ran on the other process's name")
        assert other.status() == before


def test_a_given_holder_takes_its_expired_names_with_new_fences(url: str) -> None:
    with other_process(url) as other:
        old = other.claim_all(NAMES, timedelta(seconds=0.3), "web-1")
        time.sleep(0.6)
        with leases(url, NAMES, ttl=30, holder="web-1") as held:
            assert all(held.fences[name] > fence for name, fence in old.items())
            assert not any(other.holds(name, "web-1", fence) for name, fence in old.items())


async def test_async_a_given_holder_of_permits_or_names_live_elsewhere_is_busy(url: str) -> None:
    with other_process(url) as other:
        other.permit_claim(SEM, 2, timedelta(seconds=30), "web-1")
        other.claim_all(NAMES, timedelta(seconds=30), "web-1")
        with pytest.raises(LeaseBusy, match="another process uses the same holder"):
            async with apermit(url, SEM, ttl=30, max_permits=2, holder="web-1", wait=0.5):
                pytest.fail("the body ran on the other process's permits")
        with pytest.raises(LeaseBusy, match="another process uses the same holder"):
            async with aleases(url, NAMES, ttl=30, holder="web-1", wait=0.5):
                pytest.fail("the body ran on the other process's names")


# The keeper renews the tenure it holds, not the holder (issue 21, gap b) ------------
#
# Another process that uses the same holder gives the lease back under that holder
# (`pylease release --holder web-1`) and claims it again: a new tenure. A renewal that
# matched the holder renewed that tenure for this block, which believed on (and set the
# other's ttl to its own); one that names its tenure learns the lease was lost. (The
# release of permits and several names still matches the holder alone: leaving these
# blocks frees the other's tenure, issue 24. Only a lease's release names its tenure.)


def test_the_keeper_renews_its_own_tenure_of_a_lease_not_the_holders_next(url: str) -> None:
    with other_process(url) as other:
        with pytest.raises(LeaseLost), lease(url, "nightly", ttl=1, holder="web-1") as held:
            assert other.release("nightly", "web-1")
            again = other.claim("nightly", HOUR, "web-1")
            assert again is not None and again > held.fence
            assert wait_until(lambda: held.lost, BOUND)
        assert [r.ttl for r in other.status("nightly")] == [HOUR]


def test_the_keeper_renews_its_own_tenure_of_permits_not_the_holders_next(url: str) -> None:
    with other_process(url) as other:
        given = permit(url, SEM, ttl=1, max_permits=2, holder="web-1")
        with pytest.raises(LeaseLost), given as held:
            assert other.permit_release(SEM, "web-1")
            assert other.permit_claim(SEM, 2, HOUR, "web-1")
            assert wait_until(lambda: held.lost, BOUND)
            assert {r.ttl for r in other.permit_status(SEM) if r.held} == {HOUR}


def test_the_keeper_renews_its_own_tenure_of_names_not_the_holders_next(url: str) -> None:
    given = leases(url, NAMES, ttl=1, holder="web-1")
    with other_process(url) as other, pytest.raises(LeaseLost), given as held:
        assert all(freed for _, freed in other.release_all(NAMES, "web-1"))
        assert other.claim_all(NAMES, HOUR, "web-1")
        assert wait_until(lambda: held.lost, BOUND)
        assert {r.ttl for r in other.status() if r.held} == {HOUR}


async def test_async_the_keeper_renews_its_own_tenure_not_the_holders_next(url: str) -> None:
    with other_process(url) as other:
        with pytest.raises(LeaseLost):
            async with alease(url, "nightly", ttl=1, holder="web-1") as held:
                assert other.release("nightly", "web-1")
                assert other.claim("nightly", HOUR, "web-1")
                # The loss cancels this wait (cancel_on_lost): the block raises LeaseLost.
                await asleep_until(lambda: held.lost, BOUND)
                pytest.fail("the lease was never reported lost")
        assert [r.ttl for r in other.status("nightly")] == [HOUR]
