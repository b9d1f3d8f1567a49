"""Faults: the PostgreSQL server restarts under a held lease.

A throwaway server, started here as the ``postgres`` user on a free loopback port,
is stopped and started again while a lease is held with a heartbeat. The lease
row is durable, so a short outage costs nothing: the heartbeat reconnects and the
holder never reports a loss. An outage longer than the ttl is reported as a loss
before the lease's expiry, so the holder stops before anybody else may start.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from pylease import LeaseLost, alease, lease
from pylease._keeper import margin
from pylease.migrate import migrate
from tests.support.faultkit import Server, server, wait_until
from tests.support.leases import backends, status

# One worker runs the module (make test's parallel workers): its server is started once.
pytestmark = pytest.mark.xdist_group("restart")


@pytest.fixture(scope="module")
def restartable() -> Iterator[tuple[Server, str]]:
    """A throwaway server with the schema in its ``leases`` database."""
    with server() as srv:
        with psycopg.connect(srv.dsn, autocommit=True) as c:
            c.execute("CREATE DATABASE leases")
        url = srv.dsn.rsplit("/", 1)[0] + "/leases"
        migrate(url, say=lambda _line: None)
        yield srv, url


def renew_failures(caplog: pytest.LogCaptureFixture) -> int:
    return sum(
        1
        for r in caplog.records
        if r.name == "pylease"
        and r.getMessage().startswith("renewing")
        and "failed" in r.getMessage()
    )


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_restart_shorter_than_the_ttl_keeps_the_lease(
    restartable: tuple[Server, str], mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    srv, url = restartable
    caplog.set_level(logging.WARNING, logger="pylease")
    name = f"sweep-{uuid.uuid4().hex[:8]}"
    ttl = 15.0
    lost: list[LeaseLost] = []
    with lease(url, name, ttl=ttl, on_lost=lost.append) as held:
        with psycopg.connect(url, autocommit=True) as c:
            before = status(c, name)
        assert before is not None and before["held"]
        # Stop just after a renewal, and stay down until a renewal has failed.
        renewals = held._ticket.renewals
        wait_until(lambda: held._ticket.renewals > renewals, what="a renewal")
        renewed_at = time.monotonic()
        srv.stop(mode)
        down = datetime.now(UTC)
        wait_until(lambda: renew_failures(caplog) > 0, what="the heartbeat to meet the outage")
        assert not held.lost
        srv.start()
        back_at = time.monotonic()
        # The premise: the outage, seen from the last renewal, ended before the
        # deadline (ttl minus the safety margin). On a machine so slow that it did
        # not, this test proves nothing and says so.
        assert back_at - renewed_at < ttl - margin(ttl), "the server took too long to come back"
        failures = held._ticket.renewals
        wait_until(lambda: held._ticket.renewals > failures, what="a renewal after the restart")
        held.check()
        with psycopg.connect(url, autocommit=True) as c:
            after = status(c, name)
            assert backends(c, "pylease-heartbeat")
        assert after is not None and after["held"]
        assert (after["holder"], after["fence"]) == (held.holder, held.fence)
        assert after["fence"] == before["fence"]
        assert after["renewed_at"] > down  # renewed since the server went down
    assert lost == []
    with psycopg.connect(url, autocommit=True) as c:
        row = status(c, name)
    assert row is not None and not row["held"]  # released at the end, as usual


def test_a_restart_longer_than_the_ttl_is_reported_before_the_expiry(
    restartable: tuple[Server, str],
) -> None:
    srv, url = restartable
    name = f"sweep-{uuid.uuid4().hex[:8]}"
    told: list[datetime] = []

    def on_lost(_error: LeaseLost) -> None:
        told.append(datetime.now(UTC))

    with pytest.raises(LeaseLost), lease(url, name, ttl=3, on_lost=on_lost) as held:
        wait_until(lambda: held._ticket.renewals >= 1, what="a renewal")
        srv.stop("fast")
        try:
            wait_until(lambda: bool(told), timeout=20, what="the holder to report the loss")
            assert held.lost
            with pytest.raises(LeaseLost):
                held.check()
        finally:
            srv.start()
        # The row as the last renewal before the outage left it (the release at
        # the end of the block rewrites expires_at).
        with psycopg.connect(url, autocommit=True) as c:
            row: dict[str, Any] | None = status(c, name)
    assert row is not None and row["holder"] == held.holder
    # Told on this host's clock, the expiry on the server's: the same clock here.
    assert told[0] < row["expires_at"], (told[0], row["expires_at"])


async def test_an_async_holder_rides_out_a_short_restart(
    restartable: tuple[Server, str], caplog: pytest.LogCaptureFixture
) -> None:
    """The async twin: the keeper task on the event loop reconnects, the body is not cancelled."""
    srv, url = restartable
    caplog.set_level(logging.WARNING, logger="pylease")
    name = f"sweep-{uuid.uuid4().hex[:8]}"
    ttl = 15.0
    lost: list[LeaseLost] = []

    async def until(predicate: Any, what: str) -> None:
        limit = time.monotonic() + 30
        while not predicate():
            assert time.monotonic() < limit, f"gave up waiting for {what}"
            await asyncio.sleep(0.02)

    async with alease(url, name, ttl=ttl, on_lost=lost.append) as held:
        renewals = held._ticket.renewals
        await until(lambda: held._ticket.renewals > renewals, "a renewal")
        renewed_at = time.monotonic()
        await asyncio.to_thread(srv.stop, "fast")
        await until(lambda: renew_failures(caplog) > 0, "the keeper to meet the outage")
        await asyncio.to_thread(srv.start)
        assert time.monotonic() - renewed_at < ttl - margin(ttl), "the server came back too late"
        failures = held._ticket.renewals
        await until(lambda: held._ticket.renewals > failures, "a renewal after the restart")
        held.check()
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
            cur = await c.execute("SELECT holder, fence, held FROM lease_status(%s)", (name,))
            assert await cur.fetchone() == (held.holder, held.fence, True)
    assert lost == []
