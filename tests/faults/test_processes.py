"""Faults on PostgreSQL: a holder killed or paused, connections cut under a live lease.

Holders run as real processes (tests/support/fault_holder.py) so that SIGKILL and SIGSTOP
hit exactly what they hit in production. Bounds are generous: each test checks
what happened (who holds, which fence, which write landed), never how fast.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
import pytest

from pylease import LeaseLost, lease
from tests.support.faultkit import Proc, holders, wait_until
from tests.support.leases import backends, status, terminate

Conn = psycopg.Connection[Any]

WRITES = (
    "CREATE TABLE writes (seq bigserial PRIMARY KEY, holder text NOT NULL, fence bigint NOT NULL)"
)


def one(conn: Conn, query: Any, params: Any = ()) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def fenced_write(conn: Conn, name: str, holder: str, fence: int) -> bool:
    row = conn.execute(
        "INSERT INTO writes (holder, fence) SELECT %s, %s WHERE lease_holds(%s, %s, %s)"
        " RETURNING seq",
        (holder, fence, name, holder, fence),
    ).fetchone()
    return row is not None


def assert_no_double_write(conn: Conn) -> list[tuple[str, int]]:
    """The protected table, in commit order: fences never go back, tenures never interleave."""
    rows = conn.execute("SELECT holder, fence FROM writes ORDER BY seq").fetchall()
    fences = [fence for _holder, fence in rows]
    assert fences == sorted(fences), rows
    holders_by_fence: dict[int, set[str]] = {}
    for holder, fence in rows:
        holders_by_fence.setdefault(fence, set()).add(holder)
    assert all(len(h) == 1 for h in holders_by_fence.values()), holders_by_fence
    return rows


# Crash -------------------------------------------------------------------------


def test_a_holder_killed_with_sigkill_is_taken_over_after_its_expiry(dsn: str, conn: Conn) -> None:
    conn.execute(WRITES)
    ttl = 2.0
    with holders() as started:
        holder = Proc("pg", dsn, "sweep", str(ttl))
        started.append(holder)
        held = holder.wait_for("held")
        # Its heartbeat works: the lease outlives its first ttl, renewed.
        wait_until(
            lambda: status(conn, "sweep")["renewed_at"] > status(conn, "sweep")["acquired_at"],  # type: ignore[index]
            what="a renewal",
        )
        assert one(conn, "SELECT lease_claim('sweep', '5s', 'early')") is None
        holder.signal(signal.SIGKILL)
        holder.proc.wait(10)
        before = status(conn, "sweep")
        assert before is not None and before["holder"] == held["holder"] and before["held"]

        # A waiter allowed ttl + 5 s gets it: the expiry frees a crashed holder's lease
        # without anybody stealing it; it is not granted before that expiry.
        with lease(dsn, "sweep", ttl=30, wait=ttl + 5) as mine:
            after = status(conn, "sweep")
            assert after is not None and after["holder"] == mine.holder
            assert mine.fence > held["fence"]
            assert after["acquired_at"] >= before["expires_at"]
            assert fenced_write(conn, "sweep", mine.holder, mine.fence)
            assert not fenced_write(conn, "sweep", held["holder"], held["fence"])
    rows = assert_no_double_write(conn)
    assert rows[-1] == (mine.holder, mine.fence)


# Paused holder -----------------------------------------------------------------


def test_a_paused_holder_loses_to_a_new_claim_and_its_late_write_is_rejected(
    dsn: str, conn: Conn
) -> None:
    conn.execute(WRITES)
    ttl = 1.5
    with holders() as started:
        old = Proc("pg", dsn, "report", str(ttl))
        started.append(old)
        first = old.wait_for("held")
        old.wait_for("write", count=3)
        old.signal(signal.SIGSTOP)
        try:
            # Past its ttl, a process that never noticed it was paused.
            wait_until(lambda: not status(conn, "report")["held"], what="the expiry")  # type: ignore[index]
            new = Proc("pg", dsn, "report", "60")
            started.append(new)
            second = new.wait_for("held")
            assert second["fence"] > first["fence"]
            new.wait_for("write", count=3)
        finally:
            old.signal(signal.SIGCONT)
        lost = old.wait_for("lost")
        assert "renewal" in lost["reason"] or "ttl" in lost["reason"], lost
        old.wait_for("on_lost")
        # Its own renewal answers false, and its fenced write is rejected.
        assert old.wait_for("renew")["ok"] is False
        assert old.wait_for("late-write")["ok"] is False
        new.wait_for("write", count=len(new.seen("write")) + 2)
        assert all(e["ok"] for e in new.seen("write"))
    rows = assert_no_double_write(conn)
    theirs = [r for r in rows if r[0] == first["holder"]]
    ours = [r for r in rows if r[0] == second["holder"]]
    assert theirs and ours
    # Every write of the old holder landed before the first of the new one.
    assert rows.index(ours[0]) == len(theirs)
    row = status(conn, "report")
    assert row is not None and (row["holder"], row["fence"]) == (second["holder"], second["fence"])


# Connections cut ----------------------------------------------------------------


def test_the_heartbeat_survives_its_backend_terminated_again_and_again(
    dsn: str, conn: Conn
) -> None:
    lost: list[LeaseLost] = []
    with lease(dsn, "sweep", ttl=1.2, on_lost=lost.append) as held:
        for _ in range(3):
            wait_until(lambda: backends(conn, "pylease-heartbeat"), what="the heartbeat")
            pids = backends(conn, "pylease-heartbeat")
            terminate(conn, pids)
            renewals = held._ticket.renewals
            wait_until(lambda r=renewals: held._ticket.renewals >= r + 2, what="renewals")
            assert set(backends(conn, "pylease-heartbeat")).isdisjoint(pids)
            assert one(conn, "SELECT lease_claim('sweep', '5s', 'intruder')") is None
        held.check()
        row = status(conn, "sweep")
        assert row is not None and row["held"] and row["fence"] == held.fence
    assert lost == []


def test_a_waiter_whose_listen_connection_is_cut_still_acquires_by_polling(
    dsn: str, conn: Conn
) -> None:
    result: dict[str, Any] = {}
    ready = threading.Event()

    def wait() -> None:
        ready.set()
        try:
            with lease(dsn, "sweep", ttl=30, wait=60) as held:
                result["fence"] = held.fence
        except Exception as exc:
            result["error"] = exc

    with lease(dsn, "sweep", ttl=300) as first:
        waiter = threading.Thread(target=wait)
        waiter.start()
        ready.wait()
        wait_until(lambda: backends(conn, "pylease-listen"), what="the waiter to LISTEN")
        cut = backends(conn, "pylease-listen")
        terminate(conn, cut)
        wait_until(
            lambda: not set(cut) & set(backends(conn, "pylease-listen")), what="the LISTEN to end"
        )
        time.sleep(0.5)  # the waiter notices its listener is gone on its next wake-up
    # Released far before the 300 s expiry: the polling fallback, or the listener the
    # process opens again with backoff, must hand the lease over.
    waiter.join(45)
    assert not waiter.is_alive()
    assert result.get("fence", 0) > first.fence, result
    # The process's shared listener closes soon after its last waiter has left.
    wait_until(lambda: backends(conn, "pylease-listen") == [], what="the listener to close")


def test_a_terminated_claimers_connection_leaves_the_lease_to_expire(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    with psycopg.connect(dsn, autocommit=True) as mine, lease(mine, "sweep", ttl=1) as held:
        terminate(conn, [mine.info.backend_pid])
        # Renewals run on a connection of their own: the lease stays ours.
        renewals = held._ticket.renewals
        wait_until(lambda: held._ticket.renewals >= renewals + 2, what="renewals")
        held.check()
        # The release could not go out on the dead connection; the heartbeat stopped.
    wait_until(lambda: not status(conn, "sweep")["held"], what="the expiry")  # type: ignore[index]
    assert one(conn, "SELECT lease_claim('sweep', '5s', 'next')") == held.fence + 1


# A paused `pylease run` --------------------------------------------------------

CHILD = """
import signal, sys, time
out = open(sys.argv[1], "a", buffering=1)
signal.signal(signal.SIGTERM, lambda *_: (out.write("SIGTERM\\n"), sys.exit(0)))
out.write("ready\\n")
while True:
    time.sleep(0.05)
"""


def test_a_paused_pylease_run_stops_its_command_and_exits_75(
    dsn: str, conn: Conn, tmp_path: Any
) -> None:
    """The supervisor, paused past its ttl, learns on waking that the lease is gone.

    Its command kept running meanwhile (SIGSTOP reached only the supervisor): that
    is what fences are for. Once awake, past the lease's local expiry, it kills the
    command at once (SIGKILL: no grace period once somebody else may hold the lease)
    and says so.
    """
    out = tmp_path / "child.log"
    run = subprocess.Popen(
        [
            *(sys.executable, "-m", "pylease", "run", "job", "--ttl", "1.5s", "--dsn", dsn),
            *("--", sys.executable, "-c", CHILD, str(out)),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: out.exists() and "ready" in out.read_text(), what="the command")
        first = status(conn, "job")
        assert first is not None and first["held"]
        run.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: not status(conn, "job")["held"], what="the expiry")  # type: ignore[index]
            fence = one(conn, "SELECT lease_claim('job', '1 min', 'next')")
            assert fence == first["fence"] + 1
        finally:
            run.send_signal(signal.SIGCONT)
        _, err = run.communicate(timeout=60)
        assert run.returncode == 75, err
        assert "lease 'job' was lost" in err
        assert out.read_text().splitlines() == ["ready"]  # killed, not asked to stop
        row = status(conn, "job")
        assert row is not None and (row["holder"], row["fence"], row["held"]) == (
            "next",
            fence,
            True,
        )
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
