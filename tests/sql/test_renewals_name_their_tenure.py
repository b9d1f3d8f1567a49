"""Renewals that name their tenure, and the one claim body, scripted on two sessions
(issue 21; migration 0012).

A renewal used to match the holder alone: one sent in a tenure and arriving after the
lease expired and was granted to the same holder again (another process using that
holder) extended the new tenure. lease_renew, lease_renew_many and the keeper's
pylease_renew_held now take the fence the renewer knows; their earlier signatures
still match the holder alone, as the contract says. lease_claim and lease_claim_new
are one body (pylease_claim), inlined into the caller's statement.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors

from tests.support.sessions import blocking_conn, one, wait_blocked

Conn = psycopg.Connection[Any]
Connect = Callable[..., Conn]

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
BLINK = timedelta(milliseconds=20)
HELD = (
    "SELECT name, renewed FROM pylease_renew_held(%s::text[], %s::text[], %s::text[],"
    " %s::interval[], %s::bigint[], %s::integer[])"
)


def expiry(conn: Conn, name: str) -> Any:
    return one(conn, "SELECT expires_at FROM lease_status(%s)", (name,))


def past() -> None:
    """Sleep past a BLINK-long expiry (the database's clock decides; a margin of 5x)."""
    time.sleep(0.1)


@pytest.fixture
def background() -> Iterator[Callable[..., Future[Any]]]:
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit


def two_tenures(conn: Conn, conn2: Conn) -> tuple[int, int]:
    """The holder's first tenure, expired; its second, granted on the other session."""
    first = one(conn, "SELECT lease_claim_new('job', %s, 'h')", (BLINK,))
    past()
    second = one(conn2, "SELECT lease_claim_new('job', %s, 'h')", (HOUR,))
    assert second > first
    return first, second


# -- a late renewal of an earlier tenure ---------------------------------------


def test_a_late_renewal_of_an_earlier_tenure_renews_nothing(conn: Conn, conn2: Conn) -> None:
    first, second = two_tenures(conn, conn2)
    granted = expiry(conn2, "job")
    assert one(conn, "SELECT lease_renew('job', 'h', %s, %s)", (DAY, first)) is False
    assert (
        one(conn, "SELECT renewed FROM lease_renew_many('{job}', '{h}', %s, %s)", (DAY, [first]))
        is False
    )
    assert conn.execute(HELD, (["lease"], ["job"], ["h"], [DAY], [first], [None])).fetchall() == [
        ("job", False)
    ]
    assert expiry(conn2, "job") == granted
    assert one(conn2, "SELECT ttl FROM lease_status('job')") == HOUR
    # The second tenure's own renewal is one.
    assert one(conn2, "SELECT lease_renew('job', 'h', %s, %s)", (DAY, second)) is True
    assert expiry(conn2, "job") > granted


def test_the_earlier_signatures_still_match_the_holder_alone(conn: Conn, conn2: Conn) -> None:
    """Contract section 1: renew extends while the row names this holder. The earlier
    signatures keep that (they are the new ones with a NULL fence), which is why the
    keeper and a careful SQL caller name the tenure."""
    two_tenures(conn, conn2)
    granted = expiry(conn2, "job")
    assert one(conn, "SELECT lease_renew('job', 'h', %s)", (DAY,)) is True
    assert one(conn, "SELECT lease_renew('job', 'h', %s, NULL)", (DAY,)) is True
    assert conn.execute("SELECT * FROM lease_renew_many('{job}', '{h}')").fetchall() == [
        ("job", True)
    ]
    assert expiry(conn2, "job") > granted


def test_a_renewal_in_flight_across_a_new_tenure_of_its_holder_renews_nothing(
    conn: Conn, conn2: Conn, connect: Connect, background: Callable[..., Future[Any]]
) -> None:
    """The keeper's renewal of the first tenure is sent; before it is run, the lease
    expired and the holder's other process is granted it again: the renewal waits
    for that grant's row lock, then finds a fence that is not its own."""
    first = one(conn, "SELECT lease_claim_new('job', %s, 'h')", (BLINK,))
    past()
    renewer = blocking_conn(connect)
    with conn2.transaction():
        second = one(conn2, "SELECT lease_claim_new('job', %s, 'h')", (HOUR,))
        assert second > first
        late = background(
            lambda: renewer.execute(
                HELD, (["lease"], ["job"], ["h"], [DAY], [first], [None])
            ).fetchall()
        )
        wait_blocked(conn, renewer)
    assert late.result(timeout=20) == [("job", False)]
    assert one(conn, "SELECT expires_at - acquired_at FROM lease_status('job')") == HOUR


def test_a_late_renewal_of_an_earlier_tenure_of_permits_renews_nothing(
    conn: Conn, conn2: Conn
) -> None:
    (slot, earlier), *_ = conn.execute(
        "SELECT slot, fence FROM permit_claim_new('sem', 2, %s, 'h')", (BLINK,)
    ).fetchall()
    past()
    again = conn2.execute(
        "SELECT slot, fence FROM permit_claim_new('sem', 2, %s, 'h')", (HOUR,)
    ).fetchall()
    assert again == [(slot, earlier + 1)]
    row = (["permit"], ["sem"], ["h"], [DAY])
    assert conn.execute(HELD, (*row, [earlier], [slot])).fetchall() == [("sem", False)]
    assert one(conn, "SELECT max(expires_at - renewed_at) FROM permit_status('sem')") == HOUR
    assert conn.execute(HELD, (*row, [earlier + 1], [slot])).fetchall() == [("sem", True)]
    assert one(conn, "SELECT max(expires_at - renewed_at) FROM permit_status('sem')") == DAY


def test_fences_may_be_null_per_element_and_must_match_the_names(conn: Conn) -> None:
    one(conn, "SELECT lease_claim('a', %s, 'h')", (HOUR,))
    one(conn, "SELECT lease_claim('b', %s, 'h')", (HOUR,))
    rows = conn.execute(
        "SELECT * FROM lease_renew_many('{a,b,a}', '{h,h,h}', NULL, %s)", ([None, 1, 2],)
    ).fetchall()
    assert rows == [("a", True), ("b", True), ("a", False)]
    for query, params, column in (
        ("SELECT * FROM lease_renew_many('{a}', '{h}', NULL, '{1,2}')", (), "fences"),
        (HELD, (["lease"], ["a"], ["h"], [None], [1, 2], None), "fences"),
        (HELD, (["lease"], ["a"], ["h"], [None], None, [1, 2]), "slots"),
    ):
        with pytest.raises(pg_errors.InvalidParameterValue) as raised:
            conn.execute(query, params)
        assert raised.value.diag.column_name == column


def test_the_fence_overload_leaves_every_earlier_call_unambiguous(conn: Conn) -> None:
    fence = one(conn, "SELECT lease_claim('job', %s, 'h')", (HOUR,))
    for call in (
        "SELECT lease_renew('job', 'h')",
        "SELECT lease_renew('job', 'h', NULL)",
        "SELECT lease_renew(name => 'job', holder => 'h')",
        "SELECT lease_renew(holder => 'h', name => 'job', ttl => '1 hour')",
    ):
        assert one(conn, call) is True, call
    assert one(conn, "SELECT lease_renew(%s, %s, %s)", ("job", "h", None)) is True
    named = "SELECT lease_renew(name => %s, holder => %s, ttl => %s, fence => %s)"
    assert one(conn, named, ("job", "h", None, fence)) is True
    assert one(conn, "SELECT renewed FROM lease_renew_many('{job}', '{h}')") is True
    # The fence has no default: naming it without the ttl matches no function.
    with pytest.raises(pg_errors.UndefinedFunction):
        conn.execute("SELECT lease_renew(name => 'job', holder => 'h', fence => 1)")


# -- one claim body --------------------------------------------------------------


@pytest.mark.parametrize(
    ("claim", "new_tenure"), [("lease_claim", False), ("lease_claim_new", True)]
)
def test_a_claim_is_the_one_body_inlined_into_the_callers_statement(
    conn: Conn, claim: str, new_tenure: bool
) -> None:
    """lease_claim and lease_claim_new run pylease_claim as the caller's own statement:
    no call of their own (what the exclusive cycle pays is what it paid)."""
    plan = conn.execute(
        f"EXPLAIN (VERBOSE, FORMAT JSON) SELECT {claim}('job', '1 hour', 'h')"  # type: ignore[arg-type]
    ).fetchone()
    assert plan is not None
    output = plan[0][0]["Plan"]["Output"]
    assert output == [
        f"pylease_claim('job'::text, '01:00:00'::interval, 'h'::text, {str(new_tenure).lower()},"
        " NULL::jsonb)"
    ]
    conn.execute("SET track_functions = 'pl'")
    assert one(conn, f"SELECT {claim}('job', '1 hour', 'h')") == 1  # type: ignore[arg-type]
    calls = conn.execute(
        "SELECT funcname, calls FROM pg_stat_xact_user_functions"
        " WHERE funcname IN ('lease_claim', 'lease_claim_new', 'pylease_claim')"
    ).fetchall()
    assert calls == [("pylease_claim", 1)]


def test_the_keepers_renewal_answers_every_element_in_its_place(conn: Conn) -> None:
    """Each element's answer is at its own position, a lease named twice too, among
    elements of other kinds and leases that are not renewed."""
    a = one(conn, "SELECT lease_claim('a', %s, 'h')", (HOUR,))
    b = one(conn, "SELECT lease_claim('b', %s, 'h')", (HOUR,))
    one(conn, "SELECT group_join('g', 'h', %s)", (HOUR,))
    rows = conn.execute(
        HELD,
        (
            ["lease", "member", "lease", "lease", "lease", "lease"],
            ["b", "g", "a", "b", "other", "a"],
            ["h", "h", "h", "h", "h", "someone"],
            [HOUR, HOUR, DAY, None, HOUR, HOUR],
            [b, None, a, None, None, None],
            None,
        ),
    ).fetchall()
    assert rows == [
        ("b", True),
        ("g", True),
        ("a", True),
        ("b", True),
        ("other", False),
        ("a", False),
    ]
    # The longest ttl a lease was named with is its ttl now.
    assert one(conn, "SELECT ttl FROM lease_status('a')") == DAY
