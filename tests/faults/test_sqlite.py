"""Faults on the SQLite backend: holders killed mid-transaction, a file locked by a long writer.

Every wait is bounded (the busy timeout, then a clear error), and after every fault
the file passes ``PRAGMA integrity_check`` and still holds every committed lease.
tests/sqlite/test_files_and_processes.py covers the single faults of the backend; these are the
faults as an application meets them, through ``lease()`` and the command line.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pylease import DatabaseUnavailable, LeaseLost, lease
from pylease.sqlite import SqliteBackend, connect
from tests.support.faultkit import ROOT, Proc, holders, wait_until

HOUR = timedelta(hours=1)
BOUND = 30.0


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "leases.sqlite3"
    connect(path).close()
    return path


def integrity(path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        conn.close()


def rows(path: Path) -> dict[str, tuple[str, int, bool]]:
    conn = sqlite3.connect(path)
    try:
        return {
            name: (holder, fence, bool(released))
            for name, holder, fence, released in conn.execute(
                "SELECT name, holder, fence, released FROM pylease_leases"
            )
        }
    finally:
        conn.close()


def test_a_holder_killed_inside_its_transaction_leaves_nothing_behind(db: Path) -> None:
    backend = SqliteBackend(connect(db))
    assert backend.claim("kept", HOUR, "survivor") == 1
    assert backend.claim("job", HOUR, "earlier") == 1
    assert backend.release("job", "earlier")
    with holders() as started:
        doomed = Proc("sqlite-tx", str(db), "job")
        started.append(doomed)
        assert doomed.wait_for("in-tx")["fence"] == 2
        # It holds the write lock: a writer with a short busy timeout fails, bounded.
        impatient = SqliteBackend(connect(db, busy_timeout=0.3))
        with pytest.raises(DatabaseUnavailable, match="locked"):
            impatient.claim("other", HOUR, "me")
        doomed.signal(signal.SIGKILL)
        doomed.proc.wait(BOUND)
    integrity(db)
    # Its claim and its write were never committed: they never happened.
    assert rows(db) == {"kept": ("survivor", 1, False), "job": ("earlier", 1, True)}
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT count(*) FROM writes").fetchone() == (0,)
    conn.close()
    assert backend.claim("job", HOUR, "next") == 2
    assert not backend.holds("job", "doomed", 2)
    assert backend.holds("kept", "survivor", 1)


def test_churning_holders_killed_at_random_moments_corrupt_nothing(db: Path) -> None:
    backend = SqliteBackend(connect(db))
    assert backend.claim("kept", HOUR, "survivor") == 1
    rng = random.Random(7)
    high: dict[str, int] = {}
    with holders() as started:
        for round_ in range(4):
            churners = [Proc("sqlite-churn", str(db)) for _ in range(2)]
            started.extend(churners)
            for churner in churners:
                churner.wait_for("tick")
            time.sleep(rng.uniform(0.0, 0.2))
            for churner in churners:
                churner.signal(signal.SIGKILL)
            for churner in churners:
                churner.proc.wait(BOUND)
            integrity(db)
            now = rows(db)
            assert now["kept"] == ("survivor", 1, False), round_
            for name, (_holder, fence, _released) in now.items():
                assert fence >= high.get(name, 1), (name, fence, high)
                high[name] = fence
            for row in backend.status():
                assert row.acquired_at <= row.renewed_at <= row.expires_at, row
    # Every name is usable at once afterwards (the churners' ttls are 50 ms).
    for name in [n for n in high if n != "kept"]:
        wait_until(lambda n=name: backend.claim(n, HOUR, "after") is not None, what=name)
        assert backend.status(name)[0].fence > high[name] - 1


LONG_WRITER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("CREATE TABLE IF NOT EXISTS bulk (x)")
conn.execute("INSERT INTO bulk VALUES (1)")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
print("committed", flush=True)
time.sleep(3600)
"""


@contextlib.contextmanager
def long_writer(db: Path, seconds: float = 600) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the file's write lock for ``seconds``, then committing."""
    child = subprocess.Popen(
        [sys.executable, "-c", LONG_WRITER, str(db), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "locked"
        yield child
    finally:
        child.kill()
        child.wait(BOUND)


def in_thread(body: Any) -> dict[str, Any]:
    """Run ``body`` in a thread; its result or exception, after a generous bound."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = body()
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND)
    assert not thread.is_alive(), "a wait on a locked SQLite file never ended"
    return out


def test_a_long_writer_makes_every_wait_bounded_then_everything_works(db: Path) -> None:
    url = f"sqlite:///{db}"
    with lease(url, "kept", ttl=3600, heartbeat=False) as kept:
        pass
    backend = SqliteBackend(connect(db))
    assert backend.claim("kept", HOUR, kept.holder) == kept.fence + 1
    with long_writer(db):

        def claim() -> None:
            with lease(url, "job", ttl=30):
                pass

        def claim_waiting() -> None:
            with lease(url, "job", ttl=30, wait=2):
                pass

        for body in (claim, claim_waiting):
            out = in_thread(body)
            error = out.get("error")
            assert isinstance(error, DatabaseUnavailable), out
            assert "locked" in str(error) and error.name == "job"

        env = {**os.environ, "PYLEASE_DSN": url}
        cli = subprocess.run(
            [sys.executable, "-m", "pylease", "claim", "job", "--ttl", "30s", "--wait", "1s"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            env=env,
        )
        assert cli.returncode == 3, cli
        assert "Traceback" not in cli.stderr and len(cli.stderr.strip().splitlines()) == 1
        assert "locked" in cli.stderr
        # Readers never wait for a writer (WAL): status still answers.
        assert [r.name for r in backend.status()] == ["kept"]
    integrity(db)
    with lease(url, "job", ttl=30) as held:
        assert held.fence == 1
    assert rows(db)["kept"] == (kept.holder, kept.fence + 1, False)
    conn = sqlite3.connect(db)
    # The writer was killed before it committed: its table never existed.
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'bulk'").fetchone() == (0,)
    conn.close()


def test_a_writer_that_commits_in_time_only_delays_a_claim(db: Path) -> None:
    url = f"sqlite:///{db}"
    with long_writer(db, seconds=1.0) as child:

        def claim() -> tuple[int, str, str]:
            with lease(url, "job", ttl=30) as held:
                return held.fence, held.holder, rows(db)["job"][0]

        out = in_thread(claim)
        assert child.stdout is not None and child.stdout.readline().strip() == "committed"
    assert "result" in out, out
    fence, holder, holder_in_file = out["result"]
    assert fence == 1 and holder_in_file == holder
    integrity(db)


def test_a_new_file_that_another_process_is_setting_up_is_waited_for(tmp_path: Path) -> None:
    # Two processes opening a new file at once (`make demo`): one holds the write lock
    # (it is migrating) while the other asks for WAL mode, which SQLite then refuses at
    # once, without its busy handler.
    path = tmp_path / "new.sqlite3"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    committed: list[float] = []

    def commit() -> None:
        other.execute("COMMIT")
        committed.append(time.monotonic())

    timer = threading.Timer(0.3, commit)
    timer.start()
    try:
        conn = connect(path)
        opened = time.monotonic()
    finally:
        timer.join()
        other.close()
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert committed and committed[0] <= opened
        assert SqliteBackend(conn).claim("job", timedelta(seconds=30), "h") == 1
    finally:
        conn.close()
    integrity(path)


def test_a_heartbeat_locked_out_past_the_ttl_reports_the_loss(db: Path) -> None:
    url = f"sqlite:///{db}"
    told: list[datetime] = []

    def on_lost(_error: LeaseLost) -> None:
        told.append(datetime.now(UTC))

    with pytest.raises(LeaseLost), lease(url, "job", ttl=2, on_lost=on_lost) as held:
        wait_until(lambda: held._ticket.renewals >= 1, what="a renewal")
        with long_writer(db):
            wait_until(lambda: bool(told), timeout=BOUND, what="the loss to be reported")
            assert held.lost
        [row] = SqliteBackend(connect(db)).status("job")
        # Nobody could take it while the file was locked; the holder was told
        # before its expiry, so it could stop before anybody else may start.
        assert row.holder == held.holder
        assert told[0] < row.expires_at, (told[0], row.expires_at)
    with lease(url, "job", ttl=30, heartbeat=False) as after:
        assert after.fence == held.fence + 1
    integrity(db)
