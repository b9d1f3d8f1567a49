"""Row-lock waits of grants, scripted on two sessions (CONTRACT sections 1 and 2).

A takeover that meets the previous holder's open fenced transaction counts as busy
after a bounded wait instead of hanging; a steal with ``older_than '0'`` is
unconditional even when a renewal commits while it waits for the row.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg

Conn = psycopg.Connection[Any]

HOUR = timedelta(hours=1)


def _waiting_for_a_lock(conn: Conn, pid: int) -> bool:
    found = conn.execute(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return bool(found and found[0])


def _in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(work()), daemon=True)
    thread.start()
    return thread, out


def _until(condition: Callable[[], bool], limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_a_takeover_blocked_by_a_fenced_transaction_is_busy_then_granted(
    conn: Conn, conn2: Conn, connect: Callable[..., Conn]
) -> None:
    fence = conn.execute("SELECT lease_claim('fen', '1 second', 'old')").fetchone()
    assert fence is not None and fence[0] is not None
    fenced = connect(autocommit=False)
    assert fenced.execute("SELECT lease_holds('fen', 'old', %s)", (fence[0],)).fetchone() == (True,)
    time.sleep(1.2)  # the lease expires while the fenced transaction is still open
    answer = conn2.execute("SELECT lease_claim('fen', '1 minute', 'new')").fetchone()
    # Busy, not an error and not a hang, while the old holder's write may still commit.
    assert answer == (None,)
    assert fenced.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    fenced.commit()
    granted = conn2.execute("SELECT lease_claim('fen', '1 minute', 'new')").fetchone()
    assert granted == (fence[0] + 1,)


def test_a_renewal_while_a_fenced_transaction_is_open_does_not_wait(
    conn: Conn, connect: Callable[..., Conn]
) -> None:
    fence = conn.execute("SELECT lease_claim('fen', '1 minute', 'me')").fetchone()
    assert fence is not None
    fenced = connect(autocommit=False)
    fenced.execute("SELECT lease_holds('fen', 'me', %s)", (fence[0],))
    assert conn.execute("SELECT lease_renew('fen', 'me')").fetchone() == (True,)
    fenced.rollback()


def test_an_unconditional_steal_survives_a_renewal_committed_while_it_waits(
    conn: Conn, conn2: Conn, connect: Callable[..., Conn]
) -> None:
    conn.execute("SELECT lease_claim('st', '1 hour', 'owner')")
    renewer = connect(autocommit=False)
    renewer.execute("SELECT 1 FROM pylease_leases WHERE name = 'st' FOR UPDATE")
    pid = conn2.info.backend_pid
    thread, out = _in_thread(
        lambda: conn2.execute("SELECT lease_steal('st', '1 hour', 'thief')").fetchone()
    )
    _until(lambda: _waiting_for_a_lock(conn, pid))
    # The renewal is stamped after the steal read the clock, and commits while it waits.
    assert renewer.execute("SELECT lease_renew('st', 'owner')").fetchone() == (True,)
    renewer.commit()
    thread.join(10)
    assert not thread.is_alive()
    assert out[0] is not None and out[0][0] is not None
    holder = conn.execute("SELECT holder FROM lease_status('st')").fetchone()
    assert holder == ("thief",)


def test_a_takeover_blocked_by_a_fenced_transaction_is_busy_within_a_statement_timeout(
    conn: Conn, conn2: Conn, connect: Callable[..., Conn]
) -> None:
    # A session's (or role's) statement_timeout below the claim's 2 s lock_timeout used to
    # cancel the claim: an error where the wait is busy (issue 21, item 12).
    fence = conn.execute("SELECT lease_claim('fen', '300 ms', 'old')").fetchone()
    assert fence is not None and fence[0] is not None
    fenced = connect(autocommit=False)
    assert fenced.execute("SELECT lease_holds('fen', 'old', %s)", (fence[0],)).fetchone() == (True,)
    time.sleep(0.5)
    conn2.execute("SET statement_timeout = '400ms'")
    for claim in ("lease_claim", "lease_claim_new"):
        answer = conn2.execute(f"SELECT {claim}('fen', '1 minute', 'new')").fetchone()
        assert answer == (None,), claim
    assert conn2.execute("SHOW lock_timeout").fetchone() == ("0",)  # nothing left set
    fenced.commit()
    granted = conn2.execute("SELECT lease_claim('fen', '1 minute', 'new')").fetchone()
    assert granted == (fence[0] + 1,)


def test_a_claim_in_a_read_only_transaction_says_so_whether_free_or_held(conn: Conn) -> None:
    conn.execute("SELECT lease_claim('held', '1 minute', 'someone')")
    conn.execute("SET default_transaction_read_only = on")
    for claim in ("lease_claim", "lease_claim_new"):
        for name in ("free", "held"):
            try:
                conn.execute(f"SELECT {claim}(%s, '1 minute', 'me')", (name,))
            except psycopg.errors.ReadOnlySqlTransaction as exc:
                assert exc.diag.message_primary == (
                    f"pylease: {claim} needs a read-write transaction, and this one is read-only"
                )
                assert "default_transaction_read_only" in (exc.diag.message_hint or "")
            else:
                raise AssertionError(f"{claim} of {name!r} answered in a read-only transaction")
