"""The keeper: one statement per tick and database, whatever the ttls; async twins in
test_heartbeat_async.py."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import ExitStack
from typing import Any

import psycopg
import pytest

from pylease import LeaseLost, lease
from pylease.heartbeat import Keeper, keeper
from tests.helpers_lease import (
    DETECT,
    claim,
    function_calls,
    steal,
    track_functions,
    wait_until,
)

Conn = psycopg.Connection[Any]


def test_each_database_gets_its_own_statement_per_tick(fresh_db: Any, pg_template: str) -> None:
    dsns = [fresh_db(pg_template), fresh_db(pg_template)]
    admins = [psycopg.connect(d, autocommit=True) for d in dsns]
    try:
        for admin in admins:
            track_functions(admin)
        with ExitStack() as stack:
            helds = [
                stack.enter_context(lease(d, f"job-{i}", ttl=0.6)) for d in dsns for i in range(50)
            ]
            assert wait_until(lambda: all(h._ticket.renewals >= 2 for h in helds))
        ticks = max(h._ticket.renewals for h in helds)
        for admin in admins:
            assert wait_until(lambda a=admin: function_calls(a, "lease_renew_many") > 0)
            calls = function_calls(admin, "lease_renew_many")
            assert 2 <= calls <= ticks + 1, (calls, ticks)
    finally:
        for admin in admins:
            admin.close()


def test_a_long_lease_is_renewed_with_the_short_ones(conn: Conn, conn2: Conn) -> None:
    with lease(conn, "short", ttl=0.3) as short, lease(conn, "long", ttl=60) as long:
        assert wait_until(lambda: short._ticket.renewals >= 3)
        # One statement renews both: the long lease rides along with the short one.
        assert long._ticket.renewals >= 2
        assert claim(conn2, "short") is None and claim(conn2, "long") is None


def test_a_failing_on_lost_callback_does_not_stop_the_keeper(
    conn: Conn, conn2: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    def on_lost(_error: LeaseLost) -> None:
        raise RuntimeError("callback bug")

    with lease(conn, "other", ttl=0.4) as other:
        with pytest.raises(LeaseLost), lease(conn, "sweep", ttl=0.4, on_lost=on_lost) as held:
            steal(conn2, "sweep")
            assert wait_until(lambda: held.lost)
        renewals = other._ticket.renewals
        assert wait_until(lambda: other._ticket.renewals > renewals + 1)
        other.check()
    assert any("on_lost callback" in r.getMessage() for r in caplog.records)


def test_the_keeper_thread_ends_with_the_last_lease(conn: Conn, own_keeper: Keeper) -> None:
    with lease(conn, "sweep", ttl=0.3) as held:
        assert wait_until(lambda: held._ticket.renewals >= 1)
        thread = own_keeper._thread
        assert thread is not None and thread.name == "pylease-heartbeat" and thread.is_alive()
    assert keeper().tickets() == []
    assert wait_until(lambda: not thread.is_alive(), DETECT)


def test_a_renewal_failure_is_logged_and_retried(
    conn: Conn, conn2: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "pylease")
    with lease(conn, "sweep", ttl=2) as held:
        assert wait_until(lambda: held._ticket.renewals >= 1)
        conn2.execute("ALTER FUNCTION lease_renew_many(text[], text[], interval) RENAME TO gone")
        assert wait_until(lambda: any("renewing 1 lease" in r.getMessage() for r in caplog.records))
        conn2.execute("ALTER FUNCTION gone(text[], text[], interval) RENAME TO lease_renew_many")
        renewals = held._ticket.renewals
        assert wait_until(lambda: held._ticket.renewals > renewals)
        time.sleep(0.1)
        held.check()


def test_a_renewal_that_hangs_does_not_delay_the_loss(conn: Conn, conn2: Conn) -> None:
    told = threading.Event()
    # Another session locks the row: the next renewal waits for it, unanswered.
    with (
        pytest.raises(LeaseLost) as raised,
        lease(conn, "sweep", ttl=1, on_lost=lambda _e: told.set()) as held,
        conn2.transaction(),
    ):
        conn2.execute("SELECT FROM pylease_leases WHERE name = 'sweep' FOR UPDATE")
        assert told.wait(DETECT), "the loss waited for the hung renewal"
        assert held.lost
    assert "no renewal succeeded" in raised.value.reason
