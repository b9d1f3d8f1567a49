"""A lease holder process for tests/test_faults*.py, reporting what it sees as JSON lines.

    fault_holder.py pg DSN NAME TTL [WAIT]   hold with a heartbeat; fenced writes into
                                            `writes` every 50 ms until the lease is lost
    fault_holder.py sqlite-tx PATH NAME      claim inside BEGIN IMMEDIATE, write, never commit
    fault_holder.py sqlite-churn PATH        claim, renew, release in a loop, forever

Events: held {fence, holder}, write {ok}, on_lost, lost {reason}, renew {ok},
late-write {ok}, in-tx, tick. The process is killed or stopped by the test.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psycopg

from pylease import LeaseLost, lease

FENCED_WRITE = (
    "INSERT INTO writes (holder, fence) SELECT %s, %s WHERE lease_holds(%s, %s, %s) RETURNING seq"
)


_out = threading.Lock()


def say(event: str, **fields: object) -> None:
    # One write per line, under a lock: on_lost reports from the keeper's thread.
    line = json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n"
    with _out:
        sys.stdout.write(line)
        sys.stdout.flush()


def hold_pg(dsn: str, name: str, ttl: float, wait: float) -> None:
    writer = psycopg.connect(dsn, autocommit=True, prepare_threshold=None)

    def fenced_write(holder: str, fence: int) -> bool:
        row = writer.execute(FENCED_WRITE, (holder, fence, name, holder, fence)).fetchone()
        return row is not None

    def on_lost(error: LeaseLost) -> None:
        say("on_lost", reason=error.reason)

    try:
        with lease(dsn, name, ttl=ttl, wait=wait, on_lost=on_lost) as held:
            say("held", fence=held.fence, holder=held.holder)
            while not held.lost:
                say("write", ok=fenced_write(held.holder, held.fence))
                time.sleep(0.05)
            say("lost", reason=held._ticket.error().reason)  # type: ignore[union-attr]
            renewed = writer.execute("SELECT lease_renew(%s, %s)", (name, held.holder)).fetchone()
            say("renew", ok=bool(renewed and renewed[0]))
            say("late-write", ok=fenced_write(held.holder, held.fence))
    except LeaseLost as exc:
        say("exit-lost", reason=exc.reason)
    time.sleep(3600)


def sqlite_tx(path: str, name: str) -> None:
    from pylease.sqlite import SqliteBackend, connect

    conn = connect(path)
    conn.execute("CREATE TABLE IF NOT EXISTS writes (holder TEXT, fence INTEGER)")
    backend = SqliteBackend(conn)
    conn.execute("BEGIN IMMEDIATE")
    fence = backend.claim(name, timedelta(hours=1), "doomed")
    conn.execute("INSERT INTO writes VALUES ('doomed', ?)", (fence,))
    say("in-tx", fence=fence)
    time.sleep(3600)


def sqlite_churn(path: str) -> None:
    from pylease.sqlite import SqliteBackend, connect

    # Two churners write one file: one starved while it holds the write lock (a loaded
    # machine) must not outlast the other's busy timeout; kills, not timeouts, are tried.
    backend = SqliteBackend(connect(path, busy_timeout=60.0))
    n = 0
    while True:
        n += 1
        name = f"churn-{n % 3}"
        holder = f"churner-{os.getpid()}-{n}"
        if backend.claim(name, timedelta(seconds=0.05), holder) is not None:
            backend.renew(name, holder)
            if n % 2:
                backend.release(name, holder)
        if n % 50 == 0:
            say("tick", n=n)


def main() -> None:
    mode, *args = sys.argv[1:]
    if mode == "pg":
        dsn, name, ttl, *wait = args
        hold_pg(dsn, name, float(ttl), float(wait[0]) if wait else 0.0)
    elif mode == "sqlite-tx":
        sqlite_tx(*args)
    elif mode == "sqlite-churn":
        sqlite_churn(*args)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
