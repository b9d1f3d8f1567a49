"""A holder given to two processes (issue 21, item 10; contract 5.6).

``@exclusive(holder=hostname)`` or ``pylease run --holder $(hostname)`` in two
processes: the second claim was an idempotent re-claim of the first's live tenure, so
both ran at once. A claim from Python with a holder it was given now starts a new
tenure only: the other process's live tenure is busy, saying so, and writes nothing;
an expired one is taken over with a new fence, so the earlier tenure's fenced writes
fail. The other process here claims through the backend, on its own connection.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest

from pylease import LeaseBusy, LeaseLost, alease, lease, run_exclusive
from pylease._backend import Backend
from pylease.sqlite import SqliteBackend
from pylease.sqlite import connect as sqlite_connect


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
