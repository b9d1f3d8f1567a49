"""A tenure's expiry and its release, scripted on two sessions (issue 21, items 5 and 17).

A claim or steal by the holder the row still names never moves the expiry earlier
(the never-earlier rule of renewals); a release that names its tenure's fence
changes nothing once that tenure is over, even when the same holder holds the name
again.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors

Conn = psycopg.Connection[Any]

HOUR = timedelta(hours=1)
BLINK = timedelta(milliseconds=20)


def one(conn: Conn, query: Any, params: Any = ()) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def expiry_and_ttl(conn: Conn, name: str) -> tuple[Any, Any]:
    row = conn.execute("SELECT expires_at, ttl FROM lease_status(%s)", (name,)).fetchone()
    assert row is not None
    return row[0], row[1]


def past(seconds: float = 0.1) -> None:
    """Sleep past a BLINK-long expiry (the database's clock decides; a margin of 5x)."""
    time.sleep(seconds)


# -- never earlier (item 5) ---------------------------------------------------


def test_a_same_holder_reclaim_with_a_shorter_ttl_keeps_the_later_expiry(
    conn: Conn, conn2: Conn
) -> None:
    assert one(conn, "SELECT lease_claim('job', %s, 'h')", (HOUR,)) == 1
    granted, _ = expiry_and_ttl(conn, "job")
    # Another session of the same holder (`pylease claim --holder $PYLEASE_HOLDER`).
    assert one(conn2, "SELECT lease_claim('job', %s, 'h')", (BLINK,)) == 1
    expires_at, ttl = expiry_and_ttl(conn, "job")
    assert expires_at == granted
    assert ttl == BLINK  # stored, as a renewal stores it
    past()
    assert one(conn2, "SELECT lease_claim('job', %s, 'other')", (HOUR,)) is None


def test_a_same_holder_reclaim_with_a_longer_ttl_extends(conn: Conn, conn2: Conn) -> None:
    assert one(conn, "SELECT lease_claim('job', %s, 'h')", (BLINK,)) == 1
    assert one(conn2, "SELECT lease_claim('job', %s, 'h')", (HOUR,)) == 1
    past()
    assert one(conn2, "SELECT lease_claim('job', %s, 'other')", (HOUR,)) is None


def test_a_same_holder_steal_with_a_shorter_ttl_keeps_the_later_expiry(
    conn: Conn, conn2: Conn
) -> None:
    assert one(conn, "SELECT lease_claim('job', %s, 'h')", (HOUR,)) == 1
    granted, _ = expiry_and_ttl(conn, "job")
    assert one(conn2, "SELECT lease_steal('job', %s, 'h')", (BLINK,)) == 2
    assert expiry_and_ttl(conn, "job") == (granted, BLINK)
    past()
    assert one(conn2, "SELECT lease_claim('job', %s, 'other')", (HOUR,)) is None


def test_a_steal_from_another_holder_takes_its_own_ttl(conn: Conn, conn2: Conn) -> None:
    assert one(conn, "SELECT lease_claim('job', %s, 'h')", (HOUR,)) == 1
    assert one(conn2, "SELECT lease_steal('job', %s, 'thief')", (BLINK,)) == 2
    past()
    assert one(conn2, "SELECT lease_claim('job', %s, 'other')", (HOUR,)) == 3


# -- the fenced release (item 17, contract 5.6) -------------------------------


def test_a_late_release_of_an_earlier_tenure_leaves_the_same_holders_next_one(
    conn: Conn, conn2: Conn
) -> None:
    first = one(conn, "SELECT lease_claim('job', %s, 'h')", (HOUR,))
    assert one(conn, "SELECT lease_release('job', 'h', NULL, %s)", (first,)) is True
    second = one(conn, "SELECT lease_claim('job', %s, 'h')", (HOUR,))
    assert second > first
    # The first tenure's release again, arriving late on another session.
    assert one(conn2, "SELECT lease_release('job', 'h', NULL, %s)", (first,)) is False
    assert one(conn2, "SELECT lease_holds('job', 'h', %s)", (second,)) is True
    assert one(conn2, "SELECT lease_claim('job', %s, 'other')", (HOUR,)) is None
    assert one(conn2, "SELECT lease_release('job', 'h', NULL, %s)", (second,)) is True
    assert one(conn2, "SELECT lease_claim('job', %s, 'other')", (HOUR,)) == second + 1


def test_a_fenced_release_matches_holder_and_fence(conn: Conn) -> None:
    fence = one(conn, "SELECT lease_claim('job', %s, 'h')", (HOUR,))
    assert one(conn, "SELECT lease_release('job', 'other', NULL, %s)", (fence,)) is False
    assert one(conn, "SELECT lease_release('nothing', 'h', NULL, %s)", (fence,)) is False
    assert one(conn, "SELECT held FROM lease_status('job')") is True
    assert one(conn, "SELECT lease_release('job', 'h', '1 hour', %s)", (fence,)) is True
    assert one(conn, "SELECT state FROM lease_status('job')") == "resting"
    assert one(conn, "SELECT releases FROM lease_counters('job')") == 1


def test_a_fenced_release_of_an_expired_tenure_nobody_took_counts_as_held(conn: Conn) -> None:
    fence = one(conn, "SELECT lease_claim('job', %s, 'h')", (BLINK,))
    past()
    assert one(conn, "SELECT lease_release('job', 'h', NULL, %s)", (fence,)) is True


def test_a_fenced_release_that_frees_the_name_notifies(conn: Conn, dsn: str) -> None:
    fence = one(conn, "SELECT lease_claim('job', %s, 'h')", (HOUR,))
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pylease")
        assert one(conn, "SELECT lease_release('job', 'h', NULL, %s)", (fence,)) is True
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert heard == ["job"]


def test_a_fenced_release_refuses_a_null_fence(conn: Conn) -> None:
    one(conn, "SELECT lease_claim('job', %s, 'h')", (HOUR,))
    with pytest.raises(pg_errors.InvalidParameterValue) as raised:
        conn.execute("SELECT lease_release('job', 'h', NULL, NULL::bigint)")
    assert raised.value.diag.column_name == "fence"
    assert one(conn, "SELECT held FROM lease_status('job')") is True


def test_the_overload_leaves_every_earlier_call_unambiguous(conn: Conn) -> None:
    calls = (
        "SELECT lease_release('job', 'h')",
        "SELECT lease_release('job', 'h', NULL)",
        "SELECT lease_release(name => 'job', holder => 'h')",
        "SELECT lease_release(name => 'job', holder => 'h', min_hold => NULL)",
        "SELECT lease_release(holder => 'h', name => 'job', min_hold => '0')",
    )
    for call in calls:
        one(conn, "SELECT lease_claim('job', %s, 'h')", (HOUR,))
        assert one(conn, call) is True, call
    unknown_types = "SELECT lease_release(%s, %s, %s)"
    one(conn, "SELECT lease_claim('job', %s, 'h')", (HOUR,))
    assert one(conn, unknown_types, ("job", "h", None)) is True
    fence = one(conn, "SELECT lease_claim('job', %s, 'h')", (HOUR,))
    named = "SELECT lease_release(name => %s, holder => %s, min_hold => %s, fence => %s)"
    assert one(conn, named, ("job", "h", None, fence)) is True
    fence = one(conn, "SELECT lease_claim('job', %s, 'h')", (HOUR,))
    assert one(conn, "SELECT lease_release(%s, %s, %s, %s)", ("job", "h", None, fence)) is True
    # The fence has no default: naming it without min_hold matches no function.
    with pytest.raises(pg_errors.UndefinedFunction):
        conn.execute("SELECT lease_release(name => 'job', holder => 'h', fence => 1)")
