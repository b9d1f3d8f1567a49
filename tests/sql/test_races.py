"""Races scripted on two sessions in a fixed order, and what a busy claim costs.

Where one session must block, it runs in a thread; the test proves it is blocked
(its backend waits on a lock in pg_stat_activity) before letting the other go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from tests.support.sessions import blocking_conn, one, wait_blocked

Conn = psycopg.Connection[Any]
Connect = Callable[..., Conn]

HOUR = timedelta(hours=1)
SHORT = timedelta(milliseconds=300)


def wait_expired(conn: Conn, name: str, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not one(
        conn, "SELECT expires_at <= clock_timestamp() FROM pylease_leases WHERE name = %s", (name,)
    ):
        assert time.monotonic() < deadline, f"lease {name!r} never expired"
        time.sleep(0.02)


@pytest.fixture
def background() -> Iterator[Callable[..., Future[Any]]]:
    """Runs a call in a thread; the test later waits for it with ``.result()``."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield pool.submit


# -- two claimers -------------------------------------------------------------


def test_two_claimers_after_an_expiry_exactly_one_wins(
    conn: Conn, connect: Connect, background: Callable[..., Future[Any]]
) -> None:
    assert one(conn, "SELECT lease_claim('sweep', %s, 'old')", (SHORT,)) == 1
    wait_expired(conn, "sweep")
    first, second = connect(), blocking_conn(connect)
    with first.transaction():
        assert one(first, "SELECT lease_claim('sweep', %s, 'first')", (HOUR,)) == 2
        # The second claimer saw the expired row too: it must wait for the first ...
        loser = background(one, second, "SELECT lease_claim('sweep', %s, 'second')", (HOUR,))
        wait_blocked(conn, second)
        assert not loser.done()
    # ... and, once the first commits, find the lease busy: NULL, not an error.
    assert loser.result(timeout=30) is None
    assert conn.execute("SELECT holder, fence, held FROM lease_status('sweep')").fetchall() == [
        ("first", 2, True)
    ]


def test_a_claimer_waiting_on_a_rolled_back_claim_wins(
    conn: Conn, connect: Connect, background: Callable[..., Future[Any]]
) -> None:
    assert one(conn, "SELECT lease_claim('sweep', %s, 'old')", (SHORT,)) == 1
    wait_expired(conn, "sweep")
    first, second = connect(), blocking_conn(connect)
    tx = first.transaction()
    tx.__enter__()
    assert one(first, "SELECT lease_claim('sweep', %s, 'first')", (HOUR,)) == 2
    winner = background(one, second, "SELECT lease_claim('sweep', %s, 'second')", (HOUR,))
    wait_blocked(conn, second)
    tx.__exit__(psycopg.Rollback, psycopg.Rollback(), None)
    assert winner.result(timeout=30) == 2
    assert one(conn, "SELECT holder FROM lease_status('sweep')") == "second"


def test_two_first_claims_of_a_new_name(
    conn: Conn, connect: Connect, background: Callable[..., Future[Any]]
) -> None:
    first, second = connect(), blocking_conn(connect)
    with first.transaction():
        assert one(first, "SELECT lease_claim('fresh', %s, 'first')", (HOUR,)) == 1
        loser = background(one, second, "SELECT lease_claim('fresh', %s, 'second')", (HOUR,))
        wait_blocked(conn, second)
    assert loser.result(timeout=30) is None
    assert one(conn, "SELECT holder FROM lease_status('fresh')") == "first"


# A claim that is not READ COMMITTED (a caller's transaction, a role's default) and
# loses the race answers as in READ COMMITTED: busy, not PostgreSQL's 40001.
LOSERS = {
    "claim": "SELECT lease_claim('sweep', %s, 'second')",
    "claim_new": "SELECT lease_claim_new('sweep', %s, 'second')",
    "steal": "SELECT lease_steal('sweep', %s, 'second')",
    "claim_all": "SELECT count(*) FROM lease_claim_all(ARRAY['sweep'], %s, 'second')",
}


def _ready(conn: Conn, was: str) -> None:
    """'sweep' released, expired, or never claimed."""
    if was == "new":
        return
    assert one(conn, "SELECT lease_claim('sweep', %s, 'old')", (SHORT,)) == 1
    if was == "released":
        assert one(conn, "SELECT lease_release('sweep', 'old')") is True
    else:
        wait_expired(conn, "sweep")


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
@pytest.mark.parametrize("was", ["released", "expired", "new"])
@pytest.mark.parametrize("statement", LOSERS.values(), ids=LOSERS.keys())
def test_a_claim_whose_snapshot_predates_the_winners_grant_is_busy(
    statement: str, was: str, isolation: str, conn: Conn, connect: Connect
) -> None:
    """The loser's snapshot still shows the name free; the winner's grant committed
    since. (A steal of an expired or released lease is what a claim is.)"""
    _ready(conn, was)
    loser = connect()
    loser.execute(f"BEGIN ISOLATION LEVEL {isolation}")
    loser.execute("SELECT 1")  # the snapshot is taken now
    assert one(conn, "SELECT lease_claim('sweep', %s, 'first')", (HOUR,)) is not None
    assert one(loser, statement, (HOUR,)) in (None, 0)
    loser.rollback()
    assert one(conn, "SELECT holder FROM lease_status('sweep')") == "first"


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
@pytest.mark.parametrize("was", ["released", "expired", "new"])
@pytest.mark.parametrize("statement", LOSERS.values(), ids=LOSERS.keys())
def test_a_claim_under_a_roles_isolation_that_waited_for_the_winner_is_busy(
    statement: str,
    was: str,
    isolation: str,
    conn: Conn,
    connect: Connect,
    background: Callable[..., Future[Any]],
) -> None:
    """Autocommit, each statement its own transaction at the session's default level:
    the loser meets the winner's grant in progress, waits for it, and once it commits
    finds the name busy."""
    _ready(conn, was)
    first, second = connect(), blocking_conn(connect)
    second.execute(f"SET default_transaction_isolation = '{isolation}'")
    with first.transaction():
        assert one(first, "SELECT lease_claim('sweep', %s, 'first')", (HOUR,)) is not None
        loser = background(one, second, statement, (HOUR,))
        wait_blocked(conn, second)
        assert not loser.done()
    assert loser.result(timeout=30) in (None, 0)
    assert one(conn, "SELECT holder FROM lease_status('sweep')") == "first"


# -- fenced writes against a takeover ----------------------------------------


@pytest.fixture
def report(conn: Conn) -> Conn:
    conn.execute("CREATE TABLE report (fence bigint, note text)")
    conn.execute("GRANT ALL ON report TO PUBLIC")
    return conn


FENCED_WRITE = "INSERT INTO report (fence, note) SELECT %s, %s WHERE lease_holds('sweep', %s, %s)"


def test_holds_in_an_open_transaction_holds_off_a_steal(
    report: Conn, connect: Connect, background: Callable[..., Future[Any]]
) -> None:
    conn = report
    assert one(conn, "SELECT lease_claim('sweep', %s, 'alice')", (HOUR,)) == 1
    writer, stealer = connect(), blocking_conn(connect)
    with writer.transaction():
        assert writer.execute(FENCED_WRITE, (1, "first", "alice", 1)).rowcount == 1
        steal = background(one, stealer, "SELECT lease_steal('sweep', %s, 'bob')", (HOUR,))
        wait_blocked(conn, stealer)
        # While the fenced transaction is open, the lease is still alice's.
        assert one(conn, "SELECT holder FROM lease_status('sweep')") == "alice"
        assert writer.execute(FENCED_WRITE, (1, "second", "alice", 1)).rowcount == 1
        assert not steal.done()
    assert steal.result(timeout=30) == 2
    assert one(conn, "SELECT holder FROM lease_status('sweep')") == "bob"
    # The old holder's next fenced write is rejected.
    assert writer.execute(FENCED_WRITE, (1, "stale", "alice", 1)).rowcount == 0
    assert conn.execute("SELECT fence, note FROM report ORDER BY note").fetchall() == [
        (1, "first"),
        (1, "second"),
    ]


def test_a_fenced_write_waits_for_a_pending_steal_and_is_rejected(
    report: Conn, connect: Connect, background: Callable[..., Future[Any]]
) -> None:
    conn = report
    assert one(conn, "SELECT lease_claim('sweep', %s, 'alice')", (HOUR,)) == 1
    stealer, writer = connect(), blocking_conn(connect)
    with stealer.transaction():
        assert one(stealer, "SELECT lease_steal('sweep', %s, 'bob')", (HOUR,)) == 2
        write = background(lambda: writer.execute(FENCED_WRITE, (1, "stale", "alice", 1)).rowcount)
        wait_blocked(conn, writer)
    assert write.result(timeout=30) == 0
    assert conn.execute("SELECT * FROM report").fetchall() == []
    assert writer.execute(FENCED_WRITE, (2, "new", "bob", 2)).rowcount == 1


def test_holds_does_not_block_a_busy_claim(
    report: Conn, connect: Connect, background: Callable[..., Future[Any]]
) -> None:
    conn = report
    assert one(conn, "SELECT lease_claim('sweep', %s, 'alice')", (HOUR,)) == 1
    writer, poller = connect(), blocking_conn(connect)
    poller.execute("SET lock_timeout = '2s'")
    with writer.transaction():
        assert writer.execute(FENCED_WRITE, (1, "first", "alice", 1)).rowcount == 1
        # A waiter polling with claim gets its answer at once, lock or no lock.
        assert one(poller, "SELECT lease_claim('sweep', %s, 'bob')", (HOUR,)) is None


# -- what a busy claim costs --------------------------------------------------


def test_a_busy_claim_takes_no_transaction_id(conn: Conn, conn2: Conn) -> None:
    assert one(conn, "SELECT lease_claim('sweep', %s, 'alice')", (HOUR,)) == 1
    assert one(conn, "SELECT lease_claim('gone', %s, 'alice')", (HOUR,)) == 1
    assert one(conn, "SELECT lease_release('gone', 'alice', %s)", (HOUR,)) is True
    with conn2.transaction():
        assert one(conn2, "SELECT lease_claim('sweep', %s, 'bob')", (HOUR,)) is None
        assert one(conn2, "SELECT lease_claim('gone', %s, 'bob')", (HOUR,)) is None
        # No xid: the claim neither wrote a tuple nor locked a row (a row lock needs one).
        assert one(conn2, "SELECT pg_current_xact_id_if_assigned()") is None
    with conn2.transaction():
        assert one(conn2, "SELECT lease_claim('other', %s, 'bob')", (HOUR,)) == 1
        assert one(conn2, "SELECT pg_current_xact_id_if_assigned()") is not None


def test_a_busy_claim_writes_no_wal(conn: Conn, conn2: Conn) -> None:
    assert one(conn, "SELECT lease_claim('sweep', %s, 'alice')", (HOUR,)) == 1
    conn2.execute("SELECT lease_claim('sweep', %s, 'bob')", (HOUR,))  # plan and cache once
    # The insert position is cluster-wide: other sessions and background writers
    # move it too. One attempt during which it stood still is proof enough.
    attempts = []
    for _ in range(50):
        before = one(conn2, "SELECT pg_current_wal_insert_lsn()")
        assert one(conn2, "SELECT lease_claim('sweep', %s, 'bob')", (HOUR,)) is None
        after = one(conn2, "SELECT pg_current_wal_insert_lsn()")
        attempts.append((before, after))
        if before == after:
            return
        time.sleep(0.05)
    pytest.fail(f"the WAL insert position moved around every busy claim: {attempts}")


def test_a_granted_claim_does_write_wal(conn: Conn, conn2: Conn) -> None:
    """The probe above can see a write: a granted claim always moves the position."""
    before = one(conn2, "SELECT pg_current_wal_insert_lsn()")
    assert one(conn2, "SELECT lease_claim('sweep', %s, 'bob')", (HOUR,)) == 1
    assert one(conn2, "SELECT pg_current_wal_insert_lsn()") > before


# -- synchronous_commit -------------------------------------------------------


@pytest.fixture
def sync_witness(conn: Conn) -> Conn:
    """Records synchronous_commit as it stands while each function writes the table."""
    conn.execute(
        """
        CREATE TABLE sync_witness (op text, setting text);
        CREATE FUNCTION witness_sync() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO public.sync_witness
            VALUES (TG_OP, current_setting('synchronous_commit'));
            RETURN NEW;
        END $$;
        CREATE TRIGGER witness AFTER INSERT OR UPDATE ON pylease_leases
            FOR EACH ROW EXECUTE FUNCTION witness_sync();
        """
    )
    return conn


def witnessed(conn: Conn) -> list[str]:
    settings = [r[0] for r in conn.execute("SELECT setting FROM sync_witness")]
    conn.execute("DELETE FROM sync_witness")
    return settings


def test_release_alone_commits_without_the_flush(sync_witness: Conn, conn2: Conn) -> None:
    conn = sync_witness
    conn2.execute("SET synchronous_commit = on")
    assert one(conn2, "SELECT lease_claim('sweep', %s, 'alice')", (HOUR,)) == 1
    assert witnessed(conn) == ["on"]
    assert one(conn2, "SHOW synchronous_commit") == "on"
    assert one(conn2, "SELECT lease_renew('sweep', 'alice')") is True
    assert one(conn2, "SELECT lease_steal('sweep', %s, 'alice')", (HOUR,)) == 2
    assert witnessed(conn) == ["on", "on"]
    for _ in range(6):  # also once psycopg prepares the statement
        assert one(conn2, "SELECT lease_release(%s, %s)", ("sweep", "alice")) is True
        assert witnessed(conn) == ["off"]
        assert one(conn2, "SHOW synchronous_commit") == "on"
        assert one(conn2, "SELECT lease_claim(%s, %s, %s)", ("sweep", HOUR, "alice")) is not None
        assert witnessed(conn) == ["on"]


def test_release_after_the_callers_writes_keeps_their_flush(
    sync_witness: Conn, conn2: Conn
) -> None:
    conn = sync_witness
    conn2.execute("SET synchronous_commit = on")
    conn2.execute("CREATE TABLE work (x int)")
    assert one(conn2, "SELECT lease_claim('sweep', %s, 'alice')", (HOUR,)) == 1
    witnessed(conn)
    with conn2.transaction():
        conn2.execute("INSERT INTO work VALUES (1)")
        assert one(conn2, "SELECT lease_release('sweep', 'alice')") is True
        assert one(conn2, "SHOW synchronous_commit") == "on"
    assert witnessed(conn) == ["on"]
    assert one(conn2, "SHOW synchronous_commit") == "on"


# -- a holder's open fenced transaction (issue 10, defect 7) ------------------


def impatient_conn(connect: Connect) -> Conn:
    """A session whose statements fail rather than wait long for a row lock."""
    c = connect()
    c.execute("SET lock_timeout = '5s'")
    return c


def test_a_fenced_transaction_never_makes_a_renewal_wait(report: Conn, connect: Connect) -> None:
    conn = report
    for name in ("sweep", "other"):
        assert one(conn, "SELECT lease_claim(%s, %s, 'alice')", (name, HOUR)) == 1
    writer, keeper = connect(), impatient_conn(connect)
    with writer.transaction():
        assert writer.execute(FENCED_WRITE, (1, "fenced", "alice", 1)).rowcount == 1
        # Each of these would wait for the writer's row lock (and fail after
        # lock_timeout) if renewals conflicted with it.
        assert keeper.execute(
            "SELECT * FROM lease_renew_many('{other,sweep}', '{alice,alice}')"
        ).fetchall() == [("other", True), ("sweep", True)]
        assert keeper.execute(
            "SELECT name, renewed FROM lease_renew_each('{sweep,other}', '{alice,alice}',"
            " '{2 hours,NULL}')"
        ).fetchall() == [("sweep", True), ("other", True)]
        assert one(keeper, "SELECT lease_renew('sweep', 'alice', %s)", (HOUR,)) is True
        assert one(keeper, "SELECT lease_release('other', 'alice')") is True
        assert writer.execute(FENCED_WRITE, (1, "still", "alice", 1)).rowcount == 1
    assert conn.execute("SELECT note FROM report ORDER BY note").fetchall() == [
        ("fenced",),
        ("still",),
    ]


def test_a_takeover_after_expiry_waits_for_the_fenced_transaction(
    report: Conn, connect: Connect, background: Callable[..., Future[Any]]
) -> None:
    conn = report
    assert one(conn, "SELECT lease_claim('sweep', %s, 'alice')", (HOUR,)) == 1
    writer, claimer = connect(), blocking_conn(connect)
    order: list[str] = []
    with writer.transaction():
        assert writer.execute(FENCED_WRITE, (1, "fenced", "alice", 1)).rowcount == 1
        # The transaction outlasts the lease: expire it (a no-key update, as a
        # renewal is, which passes the writer's lock).
        conn.execute(
            "UPDATE pylease_leases SET expires_at = clock_timestamp() - interval '1 second'"
        )

        def take() -> Any:
            fence = one(claimer, "SELECT lease_claim('sweep', %s, 'bob')", (HOUR,))
            order.append(f"granted {fence}")
            return fence

        taken = background(take)
        wait_blocked(conn, claimer)
        assert one(conn, "SELECT holder FROM lease_status('sweep')") == "alice"
        order.append("fenced transaction commits")
    assert taken.result(timeout=30) == 2
    assert order == ["fenced transaction commits", "granted 2"]
    assert writer.execute(FENCED_WRITE, (1, "stale", "alice", 1)).rowcount == 0


def test_a_claim_after_the_holders_release_waits_for_its_fenced_transaction(
    report: Conn, connect: Connect, background: Callable[..., Future[Any]]
) -> None:
    conn = report
    assert one(conn, "SELECT lease_claim('sweep', %s, 'alice')", (HOUR,)) == 1
    writer, claimer = connect(), blocking_conn(connect)
    with writer.transaction():
        assert writer.execute(FENCED_WRITE, (1, "fenced", "alice", 1)).rowcount == 1
        # The release passes (no key change) ...
        assert one(conn, "SELECT lease_release('sweep', 'alice')") is True
        # ... but the grant that follows it waits for the fenced transaction.
        taken = background(one, claimer, "SELECT lease_claim('sweep', %s, 'bob')", (HOUR,))
        wait_blocked(conn, claimer)
        assert not taken.done()
    assert taken.result(timeout=30) == 2


def test_a_claim_waiting_on_a_fenced_transaction_never_holds_up_renewals(
    report: Conn, connect: Connect, background: Callable[..., Future[Any]]
) -> None:
    conn = report
    for name in ("sweep", "other"):
        assert one(conn, "SELECT lease_claim(%s, %s, 'alice')", (name, HOUR)) == 1
    writer, claimer, keeper = connect(), blocking_conn(connect), impatient_conn(connect)
    with writer.transaction():
        assert writer.execute(FENCED_WRITE, (1, "fenced", "alice", 1)).rowcount == 1
        conn.execute(
            "UPDATE pylease_leases SET expires_at = clock_timestamp() - interval '1 second'"
            " WHERE name = 'sweep'"
        )
        taken = background(one, claimer, "SELECT lease_claim('sweep', %s, 'bob')", (HOUR,))
        wait_blocked(conn, claimer)
        # The waiting claimer queues for the row; the holder's batch renewal does not.
        assert keeper.execute(
            "SELECT * FROM lease_renew_many('{other,sweep}', '{alice,alice}')"
        ).fetchall() == [("other", True), ("sweep", True)]
        assert not taken.done()
    # Renewed before anyone took it: the claim finds the lease busy once it may look.
    assert taken.result(timeout=30) is None
    assert one(conn, "SELECT holder FROM lease_status('sweep')") == "alice"
