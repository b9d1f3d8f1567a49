"""Waiting on a direct server connection, where LISTEN works: handovers through NOTIFY.

Kept out of test_lease.py, whose tests also run through PgBouncer in transaction mode
(tests/faults/test_pgbouncer.py), where LISTEN cannot work. Async twins in
test_waiting_async.py.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import psycopg

from pylease import _operations, lease
from tests.support.leases import claim, wait_until

Conn = psycopg.Connection[Any]


def test_waiters_take_turns_through_notify(dsn: str, conn: Conn) -> None:
    # Five waiters, one lease: each release wakes the others, one wins; with a poll
    # interval of a minute, only the notifications can get them all through in time.
    fences: list[int] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with lease(dsn, "sweep", ttl=120, wait=60, poll_interval=60) as held:
                fences.append(held.fence)
                time.sleep(0.05)
        except BaseException as exc:
            errors.append(exc)

    with lease(conn, "sweep", ttl=120):
        threads = [threading.Thread(target=worker) for _ in range(5)]
        for thread in threads:
            thread.start()
        time.sleep(0.3)
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert sorted(fences) == fences and len(set(fences)) == 5


def test_a_queued_waiter_claims_in_one_statement_with_its_status_or_its_exit(
    dsn: str, conn: Conn, conn2: Conn
) -> None:
    # A waiter's claim after its first is one statement: busy, it reads the status
    # row that stood in the way (at most every STATUS_FRESH seconds) and writes
    # nothing (its process stays queued); granted, its process leaves pylease_waiters
    # in the claim's own transaction, one round trip after the release's notification.
    statements: list[tuple[str, Any]] = []

    class Recording(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            statements.append((str(query), params))
            return super().execute(query, params, **kwargs)

    def queued() -> int:
        row = conn2.execute("SELECT count(*) FROM pylease_waiters WHERE name = 'job'").fetchone()
        assert row is not None
        return int(row[0])

    def claims() -> list[bool]:
        """Each combined claim so far: whether it read the status."""
        return [bool(p[-1]) for q, p in statements if "lease_claim" in q and "lease_status" in q]

    claim(conn, "job", ttl="60s")
    inside: list[Any] = []
    errors: list[BaseException] = []
    wconn = psycopg.connect(dsn, autocommit=True, cursor_factory=Recording)

    def waiter() -> None:
        try:
            with lease(wconn, "job", ttl=60, wait=60, poll_interval=60, heartbeat=False):
                inside.append((list(statements), queued()))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    try:
        # Queued (lease_wait), then one claim that found the name busy, with the status.
        assert wait_until(lambda: queued() == 1 and len(claims()) >= 1, 30)
        assert claims()[0] is True
        # A notification without a release: the head claims again at once, in vain.
        seen = len(claims())
        conn.execute("NOTIFY pylease, 'job'")
        assert wait_until(lambda: len(claims()) > seen, 30)
        assert queued() == 1  # the busy claim wrote nothing
        # A claim that left the status out (read less than STATUS_FRESH before) is
        # followed, on its own, by one that reads it again.
        assert wait_until(lambda: claims()[-1] is True, 30)
        before = len(statements)
        row = conn.execute("SELECT lease_release('job', 'other')").fetchone()
        assert row is not None and row[0] is True
        thread.join(30)
    finally:
        wconn.close()
    assert errors == []
    ran, rows = inside[0]
    # Between the release and the block: the claim alone, and the process had left.
    assert len(ran) == before + 1 and "lease_unwait" in ran[-1][0]
    assert rows == 0
    separate = ("SELECT lease_unwait", "SELECT name")
    assert not [q for q, _ in statements if q.startswith(separate)]


def test_a_waiters_busy_claim_commits_without_a_wal_flush_even_after_meeting_the_winner(
    dsn: str, conn: Conn, conn2: Conn
) -> None:
    # A waiter's claim that meets the winner's claim on the row waits for it, then
    # locks the row's new version to recheck it: its transaction gets an xid, and
    # the winner's fenced writes wait for its commit. Busy, that commit need not be
    # durable (synchronous_commit off); a granted claim's stays durable.
    claim(conn, "job", ttl="60s")
    row = conn.execute("SELECT lease_release('job', 'other')").fetchone()
    assert row is not None and row[0] is True
    params = ("job", timedelta(seconds=60), "waiter")
    conn2.autocommit = False
    conn2.execute("SELECT lease_claim('job', '60s', 'winner')")  # granted, not committed
    seen: list[Any] = []
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            with psycopg.connect(dsn) as tx:  # not autocommit: look inside its transaction
                got = tx.execute(_operations.CLAIM_WAITING.postgres, params).fetchone()
                assert got is not None
                xid = tx.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()
                sync = tx.execute("SHOW synchronous_commit").fetchone()
                seen.append((got[0], xid and xid[0], sync and sync[0]))
                tx.rollback()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    blocked = (
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database()"
    )
    assert wait_until(lambda: (conn.execute(blocked).fetchone() or (0,))[0] == 1, 30)
    conn2.commit()
    thread.join(30)
    assert errors == []
    fence, xid, sync = seen[0]
    assert fence is None and xid is not None and sync == "off"

    # Granted, the claim commits durably as every grant does.
    row = conn.execute("SELECT lease_release('job', 'winner')").fetchone()
    assert row is not None and row[0] is True
    with psycopg.connect(dsn) as tx:
        got = tx.execute(_operations.CLAIM_WAITING.postgres, params).fetchone()
        assert got is not None and got[0] is not None
        assert (tx.execute("SHOW synchronous_commit").fetchone() or ("",))[0] == "on"
        tx.rollback()
