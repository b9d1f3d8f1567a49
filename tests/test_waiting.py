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
