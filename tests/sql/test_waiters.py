"""The queue of waiting processes, scripted on several sessions (issue 21, item 14).

An expired entry never acts as the head of its name's queue, and expired entries
of every name are removed by the queue's own statements (no statement of its own).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

Conn = psycopg.Connection[Any]


def one(conn: Conn, query: Any, params: Any = ()) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def entries(conn: Conn, name: str) -> int:
    return int(one(conn, "SELECT count(*) FROM pylease_waiters WHERE name = %s", (name,)))


def waiting_for_a_lock(conn: Conn, pid: int) -> bool:
    found = conn.execute(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return bool(found and found[0])


def until(condition: Callable[[], bool], limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def expired_entry(conn: Conn, name: str, waiter: str) -> None:
    """An entry whose waiter stopped refreshing it: it expired a microsecond after."""
    assert one(conn, "SELECT lease_wait(%s, %s, '1 microsecond')", (name, waiter)) is not None
    until(
        lambda: one(
            conn,
            "SELECT clock_timestamp() > max(expires_at) FROM pylease_waiters WHERE name = %s",
            (name,),
        )
    )


def test_an_entry_that_expired_while_a_wait_was_under_way_is_not_its_head(
    conn: Conn, connect: Callable[..., Conn]
) -> None:
    # A queues with a tiny ttl, not committed yet; the refresh of B waits for another
    # session's entry of B; A commits (and expires), then B's refresh goes on and asks
    # who is first: A's entry is older than B's, but over.
    early = connect(autocommit=False)
    early.execute("SELECT lease_wait('job', 'A', '1 microsecond')")
    other = connect(autocommit=False)
    other.execute("SELECT lease_wait('job', 'B', '1 hour')")
    refresher = connect()
    out: list[Any] = []
    thread = threading.Thread(
        target=lambda: out.append(one(refresher, "SELECT lease_wait('job', 'B', '1 hour')"))
    )
    thread.start()
    until(lambda: waiting_for_a_lock(conn, refresher.info.backend_pid))
    early.commit()
    other.commit()
    thread.join(10)
    assert not thread.is_alive()
    assert out == [True]


def test_a_wait_removes_the_expired_entries_of_every_name(conn: Conn) -> None:
    expired_entry(conn, "gone", "A")
    assert entries(conn, "gone") == 1
    assert one(conn, "SELECT lease_wait('job', 'B', '1 hour')") is True
    assert entries(conn, "gone") == 0
    assert entries(conn, "job") == 1


def test_an_unwait_removes_the_expired_entries_of_every_name(conn: Conn) -> None:
    assert one(conn, "SELECT lease_wait('job', 'B', '1 hour')") is True
    expired_entry(conn, "gone", "A")
    assert one(conn, "SELECT lease_unwait('job', 'B')") is True
    assert entries(conn, "gone") == 0


def test_live_entries_of_other_names_stay(conn: Conn) -> None:
    assert one(conn, "SELECT lease_wait('kept', 'A', '1 hour')") is True
    assert one(conn, "SELECT lease_wait('job', 'B', '1 hour')") is True
    assert one(conn, "SELECT lease_unwait('job', 'B')") is True
    assert entries(conn, "kept") == 1


def heard(listener: Conn, conn: Conn) -> list[tuple[str, Any]]:
    """What the listener was told since it last looked, up to a marker sent now (a
    session's notifications are delivered in commit order)."""
    conn.execute("SELECT pg_notify('pylease_waiters', 'end')")
    told: list[tuple[str, Any]] = []
    for note in listener.notifies(timeout=10):
        if note.payload == "end":
            return told
        payload = note.payload if note.channel == "pylease" else json.loads(note.payload)
        told.append((note.channel, payload))
    raise AssertionError(f"no marker in time; heard {told}")


def test_an_unwait_wakes_the_new_head_only_when_the_head_leaves(
    conn: Conn, connect: Callable[..., Conn]
) -> None:
    listener = connect()
    listener.execute("LISTEN pylease_waiters")
    listener.execute("LISTEN pylease")
    for waiter in ("A", "B", "C"):
        one(conn, "SELECT lease_wait('job', %s, '1 hour')", (waiter,))
    # Not the head: nobody's turn changes.
    assert one(conn, "SELECT lease_unwait('job', 'B')") is True
    assert heard(listener, conn) == []
    # The head leaves without the lease: the next one in line claims at once.
    assert one(conn, "SELECT lease_unwait('job', 'A')") is True
    assert heard(listener, conn) == [
        ("pylease_waiters", {"name": "job", "waiter": "C", "claim": True})
    ]
    # Not queued (any more): nothing to do.
    assert one(conn, "SELECT lease_unwait('job', 'A')") is False
    assert heard(listener, conn) == []
    # The head leaves with the lease: the next one is first in line and claims on the
    # release to come.
    one(conn, "SELECT lease_wait('job', 'D', '1 hour')")
    assert one(conn, "SELECT lease_unwait('job', 'C', true)") is True
    assert heard(listener, conn) == [
        ("pylease_waiters", {"name": "job", "waiter": "D", "claim": False})
    ]
    # The last waiter leaves without the lease: those it kept out may claim.
    assert one(conn, "SELECT lease_unwait('job', 'D')") is True
    assert heard(listener, conn) == [("pylease", "job")]
    assert entries(conn, "job") == 0


def test_an_expired_entry_ahead_does_not_keep_the_leaving_head_from_waking_the_next(
    conn: Conn, connect: Callable[..., Conn]
) -> None:
    listener = connect()
    listener.execute("LISTEN pylease_waiters")
    for waiter in ("A", "B", "C"):
        one(conn, "SELECT lease_wait('job', %s, '1 hour')", (waiter,))
    # A's waiter refreshes it last with a tiny ttl: its entry, first by arrival, expires
    # in place (a refresh keeps its place in line).
    assert one(conn, "SELECT lease_wait('job', 'A', '1 microsecond')") is not None
    until(
        lambda: one(
            conn,
            "SELECT clock_timestamp() > expires_at FROM pylease_waiters"
            " WHERE name = 'job' AND waiter = 'A'",
        )
    )
    assert entries(conn, "job") == 3
    # B is the head, and C is next.
    assert one(conn, "SELECT lease_unwait('job', 'B')") is True
    assert heard(listener, conn) == [
        ("pylease_waiters", {"name": "job", "waiter": "C", "claim": True})
    ]
