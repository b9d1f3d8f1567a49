"""The keeper's thread: the sync-only tests of the keeper (the rest of its tests are
generated into test_heartbeat.py from test_heartbeat_async.py)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from pylease import LeaseLost, lease
from pylease._keeper import Keeper, keeper
from tests.support.leases import DETECT, wait_until

Conn = psycopg.Connection[Any]


def test_the_keeper_thread_ends_with_the_last_lease(conn: Conn, own_keeper: Keeper) -> None:
    with lease(conn, "sweep", ttl=0.3) as held:
        assert wait_until(lambda: held._ticket.renewals >= 1)
        thread = own_keeper._thread
        assert thread is not None and thread.name == "pylease-heartbeat" and thread.is_alive()
    assert keeper().tickets() == []
    assert wait_until(lambda: not thread.is_alive(), DETECT)


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
