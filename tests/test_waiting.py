"""Waiting on a direct server connection, where LISTEN works: handovers through NOTIFY.

Kept out of test_lease.py, whose tests also run through PgBouncer in transaction mode
(tests/test_faults_pgbouncer.py), where LISTEN cannot work. Async twins in
test_waiting_async.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from pylease import lease
from tests.helpers_lease import claim, wait_until

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
    # row that stood in the way (and writes nothing: its process stays queued);
    # granted, its process leaves pylease_waiters in the claim's own transaction,
    # so that the block starts one round trip after the release's notification.
    statements: list[str] = []

    class Recording(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            statements.append(str(query))
            return super().execute(query, params, **kwargs)

    def queued() -> int:
        row = conn2.execute("SELECT count(*) FROM pylease_waiters WHERE name = 'job'").fetchone()
        assert row is not None
        return int(row[0])

    def combined() -> list[str]:
        return [s for s in statements if "lease_claim" in s and "lease_status" in s]

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
        # Queued (lease_wait), then one claim that found the name busy.
        assert wait_until(lambda: queued() == 1 and len(combined()) == 1, 30)
        before = len(statements)
        # A notification without a release: the head claims again, in vain.
        conn.execute("NOTIFY pylease, 'job'")
        assert wait_until(lambda: len(statements) > before, 30)
        time.sleep(0.3)
        assert len(statements) == before + 1 and "lease_status" in statements[-1]
        assert queued() == 1  # the busy claim wrote nothing
        before = len(statements)
        row = conn.execute("SELECT lease_release('job', 'other')").fetchone()
        assert row is not None and row[0] is True
        thread.join(30)
    finally:
        wconn.close()
    assert errors == []
    ran, rows = inside[0]
    # Between the release and the block: the claim alone, and the process had left.
    assert len(ran) == before + 1 and "lease_unwait" in ran[-1]
    assert rows == 0
    assert not [s for s in statements if s.startswith(("SELECT lease_unwait", "SELECT name"))]
