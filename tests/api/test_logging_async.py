# The source of tests/api/test_logging.py: tools/async_to_sync.py writes it from this file.
"""The ``pylease`` logger (issue 15): DEBUG records for a lease's claim, renewals and
release with structured fields, and one WARNING per outage, never one per retry.

The outage is real: the database stops accepting connections (``ALLOW_CONNECTIONS
false``) and its backends are terminated, so every renewal fails until it is allowed
again. test_logging.py is generated from test_logging_async.py (the keeper is a
thread there, a task of the event loop in the source).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pylease import LeaseLost, alease
from pylease._acompat import asleep, ato_thread
from tests.support.leases import asleep_until

Conn = psycopg.Connection[Any]

# Generous: the machine is shared; nothing here asserts a speed.
BOUND = 30.0


def events(caplog: pytest.LogCaptureFixture, *names: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "pylease" and getattr(r, "pylease_event", None) in names
    ]


def check_prefixes(caplog: pytest.LogCaptureFixture) -> None:
    for record in caplog.records:
        if record.name == "pylease":
            message = record.getMessage()
            assert not message.startswith("pylease:"), message
            assert "pylease: pylease:" not in message, message


class Outage:
    """Stop the test's database from accepting connections, and let it again."""

    def __init__(self, admin: Conn, dbname: str) -> None:
        self.admin = admin
        self.dbname = dbname

    def begin(self) -> None:
        db = sql.Identifier(self.dbname)
        self.admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(db))
        self.admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (self.dbname,),
        )

    def end(self) -> None:
        db = sql.Identifier(self.dbname)
        self.admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(db))


@pytest.fixture
def outage(pg_admin_dsn: str, dsn: str) -> Iterator[Outage]:
    dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        cut = Outage(admin, str(dbname))
        try:
            yield cut
        finally:
            cut.end()


async def test_a_lease_life_at_debug(caplog: pytest.LogCaptureFixture, dsn: str) -> None:
    caplog.set_level(logging.DEBUG, logger="pylease")
    async with alease(dsn, "life", ttl=1.5) as held:
        assert await asleep_until(lambda: len(events(caplog, "renewed")) >= 2, BOUND)
    claimed = events(caplog, "claimed")
    renewed = events(caplog, "renewed")
    released = events(caplog, "released")
    assert len(claimed) == 1 and len(released) == 1 and len(renewed) >= 2
    for record in [*claimed, *renewed, *released]:
        assert record.levelno == logging.DEBUG
        assert record.pylease_name == "life"  # type: ignore[attr-defined]
        assert record.pylease_holder == held.holder  # type: ignore[attr-defined]
        assert record.pylease_fence == held.fence  # type: ignore[attr-defined]
    assert released[0].pylease_released is True  # type: ignore[attr-defined]
    life = events(caplog, "claimed", "renewed", "released")
    assert life[0] is claimed[0] and life[-1] is released[0]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    check_prefixes(caplog)


async def test_nothing_below_warning_is_formatted_when_disabled(
    caplog: pytest.LogCaptureFixture, dsn: str
) -> None:
    caplog.set_level(logging.INFO, logger="pylease")
    async with alease(dsn, "quiet", ttl=1.5):
        await asleep(1.2)
    assert not events(caplog, "claimed", "renewed", "released")


async def test_an_outage_is_one_warning_then_one_at_recovery(
    caplog: pytest.LogCaptureFixture, dsn: str, outage: Outage
) -> None:
    caplog.set_level(logging.DEBUG, logger="pylease")
    # ttl 9 s: a renewal every 3 s, given up 1.5 s before the expiry; the outage lasts
    # until a few retries failed, well within that.
    async with alease(dsn, "outage", ttl=9) as held:
        assert await asleep_until(lambda: len(events(caplog, "renewed")) >= 1, BOUND)
        await ato_thread(outage.begin)
        assert await asleep_until(lambda: len(events(caplog, "renew_failed")) >= 4, BOUND)
        await ato_thread(outage.end)
        assert await asleep_until(lambda: events(caplog, "renew_recovered"), BOUND)
        assert not held.lost
    failed = events(caplog, "renew_failed")
    warnings = [r for r in caplog.records if r.name == "pylease" and r.levelno >= logging.WARNING]
    assert [getattr(r, "pylease_event", None) for r in warnings] == [
        "renew_failed",
        "renew_recovered",
    ], [r.getMessage() for r in warnings]
    assert warnings[0] is failed[0]
    assert all(r.levelno == logging.DEBUG for r in failed[1:])
    assert [r.pylease_attempt for r in failed] == list(range(1, len(failed) + 1))  # type: ignore[attr-defined]
    first = failed[0]
    assert first.pylease_names == ["outage"]  # type: ignore[attr-defined]
    assert first.pylease_expires_in > 0  # type: ignore[attr-defined]
    assert isinstance(first.pylease_error, Exception)  # type: ignore[attr-defined]
    recovered = events(caplog, "renew_recovered")
    assert len(recovered) == 1
    assert recovered[0].pylease_attempt == len(failed)  # type: ignore[attr-defined]
    assert recovered[0].pylease_names == ["outage"]  # type: ignore[attr-defined]
    # The error's own "pylease:" is not repeated inside the message.
    assert "pylease:" not in first.getMessage()
    check_prefixes(caplog)


async def test_an_outage_that_outlasts_the_lease_ends_with_the_loss(
    caplog: pytest.LogCaptureFixture, dsn: str, outage: Outage
) -> None:
    caplog.set_level(logging.DEBUG, logger="pylease")
    with pytest.raises(LeaseLost) as ended:
        async with alease(dsn, "gone", ttl=2) as held:
            assert await asleep_until(lambda: len(events(caplog, "renewed")) >= 1, BOUND)
            await ato_thread(outage.begin)
            try:
                if True:  # ASYNC
                    await asleep(BOUND)  # cancelled by the loss
                else:
                    assert await asleep_until(lambda: held.lost, BOUND)
            finally:
                await ato_thread(outage.end)
    assert "gone" in str(ended.value)
    warnings = [r for r in caplog.records if r.name == "pylease" and r.levelno >= logging.WARNING]
    kinds = [getattr(r, "pylease_event", None) for r in warnings]
    # The first failure, then the loss; the release that follows may fail or find it
    # no longer ours, but no retry of the renewal warns.
    assert kinds[:2] == ["renew_failed", "lost"], [r.getMessage() for r in warnings]
    assert kinds.count("renew_failed") == 1
    lost = events(caplog, "lost")[0]
    assert lost.pylease_name == "gone"  # type: ignore[attr-defined]
    assert lost.pylease_fence == held.fence  # type: ignore[attr-defined]
    assert "pylease:" not in lost.getMessage()
    check_prefixes(caplog)
