"""lease_prune on PostgreSQL: what only a server with concurrent sessions can show.

The rules both backends share (what goes, what stays, fences above every pruned
one) are scenarios of tests/sql/test_conformance.py. Here: a prune and a first
grant in the same bucket of names serialize, a prune never waits for anyone, and
pruning is an operator's (not executable by PUBLIC).
Where one session must block, it runs in a thread, and the test proves it blocked
(its backend waits on a lock in pg_stat_activity) before letting the other go on.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg import sql

from pylease import dsn as dsn_mod
from tests.support.leases import wait_until

Conn = psycopg.Connection[Any]
BOUND = 30.0  # seconds: the most a scripted step may take before the test fails


def one(conn: Conn, query: str, params: Any = ()) -> Any:
    row = conn.execute(query, params).fetchone()  # type: ignore[call-overload]
    assert row is not None
    return row[0]


def bucket_mate(conn: Conn, name: str) -> str:
    """Another name in the same bucket of names as ``name``."""
    mate: str = one(
        conn,
        "SELECT 'mate-' || i FROM generate_series(1, 100000) AS i"
        " WHERE hashtext('mate-' || i) & 1023 = hashtext(%s) & 1023 LIMIT 1",
        (name,),
    )
    return mate


def waiting_on(conn: Conn, pid: int, wait_event: str) -> bool:
    return (
        one(
            conn,
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
            " AND wait_event_type = 'Lock' AND wait_event = %s",
            (pid, wait_event),
        )
        == 1
    )


def test_a_first_grant_waits_for_a_prune_of_its_bucket_and_starts_above_its_floor(
    conn: Conn, conn2: Conn, dsn: str
) -> None:
    conn.execute("SELECT lease_claim('old', interval '1 hour', 'h1')")
    conn.execute("UPDATE pylease_leases SET fence = 1000 WHERE name = 'old'")
    conn.execute("SELECT lease_release('old', 'h1')")
    mate = bucket_mate(conn, "old")
    conn.execute("SELECT lease_claim('elsewhere', interval '1 hour', 'h1')")

    conn2.execute("BEGIN")
    assert one(conn2, "SELECT lease_prune(interval '0')") == 1
    with psycopg.connect(dsn, autocommit=True) as claimer, ThreadPoolExecutor(1) as pool:
        pid = claimer.info.backend_pid
        first = pool.submit(
            one, claimer, "SELECT lease_claim(%s, interval '1 hour', 'h2')", (mate,)
        )
        assert wait_until(lambda: waiting_on(conn, pid, "advisory"), BOUND), "no wait on the bucket"
        # A name that exists is claimed without the bucket's lock.
        assert one(conn, "SELECT lease_claim('elsewhere', interval '1 hour', 'h1')") is not None
        conn2.execute("COMMIT")
        assert first.result(BOUND) == 1001
    assert one(conn, "SELECT lease_claim('old', interval '1 hour', 'h3')") == 1001


def test_a_prune_never_waits_for_a_row_another_transaction_holds(conn: Conn, conn2: Conn) -> None:
    for name in ("locked", "free"):
        conn.execute("SELECT lease_claim(%s, interval '1 hour', 'h1')", (name,))
        conn.execute("SELECT lease_release(%s, 'h1')", (name,))
    conn2.execute("BEGIN")
    conn2.execute("SELECT 1 FROM pylease_leases WHERE name = 'locked' FOR UPDATE")
    conn.execute("SET statement_timeout = '10s'")
    assert one(conn, "SELECT lease_prune(interval '0')") == 1
    conn2.execute("ROLLBACK")
    assert [r[0] for r in conn.execute("SELECT name FROM lease_status()")] == ["locked"]
    assert one(conn, "SELECT lease_prune(interval '0')") == 1


def test_a_semaphore_with_a_slot_in_a_claimers_hands_is_left_whole(conn: Conn, conn2: Conn) -> None:
    conn.execute("SELECT * FROM permit_claim('sem', 3, interval '1 hour', 'h1')")
    conn.execute("SELECT permit_release('sem', 'h1')")
    conn2.execute("BEGIN")
    conn2.execute("SELECT 1 FROM pylease_permits WHERE name = 'sem' AND slot = 2 FOR UPDATE")
    conn.execute("SET statement_timeout = '10s'")
    assert one(conn, "SELECT lease_prune(interval '0')") == 0
    conn2.execute("ROLLBACK")
    assert one(conn, "SELECT count(*) FROM pylease_permits WHERE name = 'sem'") == 3
    assert one(conn, "SELECT lease_prune(interval '0')") == 1


@pytest.fixture
def login(conn: Conn) -> Iterator[str]:
    """A LOGIN role that may do only what PUBLIC may."""
    role = f"pylease_login_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        yield role
    finally:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_pruning_is_an_operators(conn: Conn, dsn: str, login: str) -> None:
    conn.execute("SELECT lease_claim('gone', interval '1 hour', 'h1')")
    conn.execute("SELECT lease_release('gone', 'h1')")
    params = dsn_mod.parse(dsn)
    params["user"] = login
    with psycopg.connect(psycopg.conninfo.make_conninfo("", **params), autocommit=True) as mine:
        with pytest.raises(pg_errors.InsufficientPrivilege):
            mine.execute("SELECT lease_prune(interval '0')")
        with pytest.raises(pg_errors.InsufficientPrivilege):
            mine.execute("SELECT * FROM pylease_fence_floors")
    assert one(conn, "SELECT lease_prune(interval '0')") == 1
