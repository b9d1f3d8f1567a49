"""Contract revision 2 in SQL: renewals never move an expiry earlier, lease_renew_each,
fence exhaustion and timeline-floored fences (CONTRACT section 1; issues 10 and 12).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors

from pylease.errors import FenceExhausted, InvalidArgument
from pylease.postgres import wrap_errors
from tests.sql.test_contract import claim, one, release, renew, row, steal, table

Conn = psycopg.Connection[Any]

HOUR = timedelta(hours=1)
SECOND = timedelta(seconds=1)
MAX_FENCE = 2**63 - 1

# -- a renewal never moves an expiry earlier (issue 10, defect 1) -------------


def test_a_shorter_ttl_renewal_keeps_the_expiry_and_stores_the_ttl(conn: Conn) -> None:
    claim(conn, "kf", HOUR, "owner")
    before = row(conn, "kf")
    assert renew(conn, "kf", "owner", SECOND) is True
    after = row(conn, "kf")
    assert after["expires_at"] == before["expires_at"]
    assert after["ttl"] == SECOND
    assert after["renewed_at"] > before["renewed_at"]
    # The stored ttl is what the next renewal without a ttl applies: still never earlier.
    assert renew(conn, "kf", "owner") is True
    assert row(conn, "kf")["expires_at"] == before["expires_at"]


def test_renew_many_with_a_shorter_ttl_keeps_each_expiry(conn: Conn) -> None:
    claim(conn, "a", HOUR, "owner")
    claim(conn, "b", timedelta(minutes=1), "owner")
    a, b = row(conn, "a"), row(conn, "b")
    rows = conn.execute(
        "SELECT * FROM lease_renew_many('{a,b}', '{owner,owner}', %s)", (timedelta(minutes=30),)
    ).fetchall()
    assert rows == [("a", True), ("b", True)]
    assert row(conn, "a")["expires_at"] == a["expires_at"]
    after_b = row(conn, "b")
    assert after_b["expires_at"] == after_b["renewed_at"] + timedelta(minutes=30)
    assert after_b["expires_at"] > b["expires_at"]
    assert row(conn, "a")["ttl"] == timedelta(minutes=30)


# -- lease_renew_each ------------------------------------------------------------

EACH = "SELECT * FROM lease_renew_each(%s::text[], %s::text[], %s::interval[])"


def test_renew_each_applies_each_ttl_and_reports_the_granted_expiry(conn: Conn) -> None:
    claim(conn, "long", HOUR, "me")
    claim(conn, "short", timedelta(minutes=1), "me")
    claim(conn, "theirs", HOUR, "you")
    long_before = row(conn, "long")["expires_at"]
    rows = conn.execute(
        EACH,
        (
            ["short", "gone", "long", "theirs"],
            ["me", "me", "me", "me"],
            [timedelta(minutes=10), HOUR, SECOND, HOUR],
        ),
    ).fetchall()
    assert [(r[0], r[1]) for r in rows] == [
        ("short", True),
        ("gone", False),
        ("long", True),
        ("theirs", False),
    ]
    short, gone, long, theirs = rows
    assert short[2] == short[3] + timedelta(minutes=10)
    assert short[2] == row(conn, "short")["expires_at"]
    # A shorter ttl never cuts the expiry: the reply says what the server kept.
    assert long[2] == long_before == row(conn, "long")["expires_at"]
    assert row(conn, "long")["ttl"] == SECOND
    # One statement, one clock: every renewed row has the same server_time ...
    assert short[3] == long[3] == row(conn, "short")["renewed_at"]
    # ... and NULLs where nothing was renewed.
    assert gone[2:] == theirs[2:] == (None, None)


def test_renew_each_with_a_null_ttl_uses_the_last_one(conn: Conn) -> None:
    claim(conn, "a", timedelta(minutes=2), "me")
    ((name, renewed, expires, now),) = conn.execute(EACH, (["a"], ["me"], [None])).fetchall()
    assert (name, renewed) == ("a", True)
    assert expires == now + timedelta(minutes=2)


def test_renew_each_of_nothing_is_nothing(conn: Conn) -> None:
    assert conn.execute(EACH, ([], [], [])).fetchall() == []


def test_renew_each_is_false_after_a_release(conn: Conn) -> None:
    claim(conn, "a", HOUR, "me")
    release(conn, "a", "me")
    assert conn.execute(EACH, (["a"], ["me"], [HOUR])).fetchall() == [("a", False, None, None)]


# -- fence exhaustion (issue 10, defect 11) -----------------------------------


@pytest.fixture
def exhausted(conn: Conn) -> Conn:
    """'worn' was granted its last fence, to 'old', and has expired."""
    claim(conn, "worn", HOUR, "old")
    conn.execute(
        "UPDATE pylease_leases SET fence = %s, expires_at = clock_timestamp() - interval '1s'",
        (MAX_FENCE,),
    )
    return conn


@pytest.mark.parametrize(
    "grant",
    [
        "SELECT lease_claim('worn', interval '1 hour', 'new')",
        "SELECT lease_steal('worn', interval '1 hour', 'new')",
        "SELECT lease_steal('worn', interval '1 hour', 'old')",
    ],
)
def test_a_grant_past_the_last_fence_raises_54000_naming_the_lease(
    exhausted: Conn, grant: str
) -> None:
    conn = exhausted
    before = table(conn)
    with pytest.raises(pg_errors.ProgramLimitExceeded) as caught:
        conn.execute(grant)  # type: ignore[call-overload]
    assert caught.value.sqlstate == "54000"
    assert "'worn'" in (caught.value.diag.message_primary or "")
    assert table(conn) == before


def test_after_a_release_the_last_fence_cannot_be_granted_again(exhausted: Conn) -> None:
    conn = exhausted
    assert release(conn, "worn", "old") is True
    before = table(conn)
    with pytest.raises(pg_errors.ProgramLimitExceeded):
        claim(conn, "worn", HOUR, "old")
    assert table(conn) == before


def test_the_holder_of_the_last_fence_keeps_it(exhausted: Conn) -> None:
    conn = exhausted
    # Still ours (expired, nobody took it): a re-claim and a renewal keep the fence.
    assert claim(conn, "worn", HOUR, "old") == MAX_FENCE
    assert renew(conn, "worn", "old") is True
    assert steal(conn, "worn", HOUR, "new", HOUR) is None


# -- timeline-floored fences (issue 12) ---------------------------------------


def test_fences_start_at_the_floor_of_the_timeline_wal_is_written_on(conn: Conn) -> None:
    timeline = one(
        conn, "SELECT ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::int"
    )
    assert timeline == one(conn, "SELECT timeline_id FROM pg_control_checkpoint()")
    floor = ((timeline - 1) << 40) + 1
    assert claim(conn, "new", HOUR, "me") == floor
    assert steal(conn, "stolen", HOUR, "me") == floor


def test_a_fence_below_the_floor_jumps_to_it_and_one_above_goes_on(conn: Conn) -> None:
    """What a promoted standby does, seen from the rows: greatest(fence + 1, floor).

    On a server that never failed over the floor is 1, so the jump cannot be
    seen here; the failover tests promote a standby. This proves the arithmetic
    keeps counting above the floor.
    """
    claim(conn, "a", SECOND, "me")
    conn.execute(
        "UPDATE pylease_leases SET fence = %s, expires_at = clock_timestamp() - interval '1s'",
        (1 << 41,),
    )
    assert claim(conn, "a", HOUR, "you") == (1 << 41) + 1


# -- what Python makes of it ------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "parameter"),
    [
        ("SELECT lease_claim('', interval '1 hour', 'me')", "name"),
        ("SELECT lease_release('a', 'me', interval '-1 second')", "min_hold"),
        ("SELECT * FROM lease_renew_each('{a}', '{me}', '{0}')", "ttls"),
        ("SELECT * FROM lease_renew_many('{a}', NULL)", "holders"),
    ],
)
def test_python_reads_the_parameter_from_the_errors_column_field(
    conn: Conn, call: str, parameter: str
) -> None:
    with pytest.raises(InvalidArgument) as caught, wrap_errors("a"):
        conn.execute(call)  # type: ignore[call-overload]
    assert caught.value.parameter == parameter
    assert isinstance(caught.value.__cause__, pg_errors.InvalidParameterValue)
    assert caught.value.__cause__.diag.column_name == parameter


def test_python_raises_fence_exhausted(exhausted: Conn) -> None:
    with pytest.raises(FenceExhausted, match="'worn'") as caught, wrap_errors("worn"):
        exhausted.execute("SELECT lease_claim('worn', interval '1 hour', 'new')")
    assert caught.value.name == "worn"
