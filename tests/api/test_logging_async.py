"""The ``pylease`` logger under the async API: the twin of tests/api/test_logging.py (the
keeper is a task of the event loop there, a thread here)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pylease import LeaseLost, alease
from tests.api.test_logging import BOUND, Outage, check_prefixes, events, outage
from tests.support.leases import asleep_until

__all__ = ["outage"]  # the fixture, shared with the sync tests


async def test_a_lease_life_at_debug(caplog: pytest.LogCaptureFixture, dsn: str) -> None:
    caplog.set_level(logging.DEBUG, logger="pylease")
    async with alease(dsn, "life", ttl=1.5) as held:
        assert await asleep_until(lambda: len(events(caplog, "renewed")) >= 2, BOUND)
    life = events(caplog, "claimed", "renewed", "released")
    kinds = [r.pylease_event for r in life]  # type: ignore[attr-defined]
    assert kinds[0] == "claimed" and kinds[-1] == "released"
    assert kinds.count("claimed") == 1 and kinds.count("released") == 1
    assert kinds.count("renewed") >= 2
    for record in life:
        assert record.levelno == logging.DEBUG
        assert record.pylease_name == "life"  # type: ignore[attr-defined]
        assert record.pylease_holder == held.holder  # type: ignore[attr-defined]
        assert record.pylease_fence == held.fence  # type: ignore[attr-defined]
    assert life[-1].pylease_released is True  # type: ignore[attr-defined]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    check_prefixes(caplog)


async def test_an_outage_is_one_warning_then_one_at_recovery(
    caplog: pytest.LogCaptureFixture, dsn: str, outage: Outage
) -> None:
    caplog.set_level(logging.DEBUG, logger="pylease")
    async with alease(dsn, "outage", ttl=9) as held:
        assert await asleep_until(lambda: len(events(caplog, "renewed")) >= 1, BOUND)
        await asyncio.to_thread(outage.begin)
        assert await asleep_until(lambda: len(events(caplog, "renew_failed")) >= 4, BOUND)
        await asyncio.to_thread(outage.end)
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
    recovered = events(caplog, "renew_recovered")[0]
    assert recovered.pylease_attempt == len(failed)  # type: ignore[attr-defined]
    assert recovered.pylease_names == ["outage"]  # type: ignore[attr-defined]
    check_prefixes(caplog)


async def test_an_outage_that_outlasts_the_lease_ends_with_the_loss(
    caplog: pytest.LogCaptureFixture, dsn: str, outage: Outage
) -> None:
    caplog.set_level(logging.DEBUG, logger="pylease")
    with pytest.raises(LeaseLost):
        async with alease(dsn, "gone", ttl=2) as held:
            assert await asleep_until(lambda: len(events(caplog, "renewed")) >= 1, BOUND)
            await asyncio.to_thread(outage.begin)
            await asyncio.sleep(BOUND)  # cancelled by the loss
    await asyncio.to_thread(outage.end)
    warnings = [r for r in caplog.records if r.name == "pylease" and r.levelno >= logging.WARNING]
    kinds = [getattr(r, "pylease_event", None) for r in warnings]
    assert kinds[:2] == ["renew_failed", "lost"], [r.getMessage() for r in warnings]
    assert kinds.count("renew_failed") == 1
    assert events(caplog, "lost")[0].pylease_fence == held.fence  # type: ignore[attr-defined]
    check_prefixes(caplog)
