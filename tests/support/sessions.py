"""Races scripted on two sessions: what the SQL tests that script them share.

One session must block (on a row lock another session holds) before the test lets the
other go on; ``wait_blocked`` proves it is blocked, and ``blocking_conn`` gives a session
that gives up, rather than hanging the suite, if its lock never comes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg

Conn = psycopg.Connection[Any]
BOUND = 30.0  # seconds: the most a session may take to block


def one(conn: Conn, query: Any, params: Any = ()) -> Any:
    """The first value of the first row."""
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def wait_blocked(observer: Conn, blocked: Conn, limit: float = BOUND) -> None:
    """Return once ``blocked``'s backend waits for a lock; fail if it never does."""
    pid = blocked.info.backend_pid
    deadline = time.monotonic() + limit
    while not one(
        observer,
        "SELECT wait_event_type = 'Lock' AND EXISTS"
        " (SELECT FROM pg_locks WHERE pid = a.pid AND NOT granted)"
        " FROM pg_stat_activity AS a WHERE pid = %s",
        (pid,),
    ):
        assert time.monotonic() < deadline, f"backend {pid} never blocked on a lock"
        time.sleep(0.01)


def blocking_conn(connect: Callable[..., Conn]) -> Conn:
    """A session that gives up, rather than hanging the suite, if a lock never comes."""
    c = connect()
    c.execute("SET lock_timeout = '20s'")
    return c
