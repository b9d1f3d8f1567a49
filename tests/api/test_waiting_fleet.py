"""Many waiters: one shared listener, one claim per release, arrival order in a process.

The waiters of a process share one LISTEN connection per database and queue per
name (pylease/_hub_async.py); these tests count what that saves on a real
server (connections in pg_stat_activity, lease_claim calls in pg_stat_user_functions)
and check what it must keep (arrival order, the fallback when the listener is lost).
Async twins in test_waiting_fleet_async.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from pylease import _hub, lease
from pylease._resources import data_dir
from tests.support.leases import (
    backends,
    claim,
    function_calls,
    terminate,
    track_functions,
    wait_until,
)

Conn = psycopg.Connection[Any]

BOUND = 60.0  # every wait: far longer than any of these tests should take


def pylease_connections(conn: Conn) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE 'pylease%'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def release(conn: Conn, name: str, holder: str = "other") -> None:
    row = conn.execute("SELECT lease_release(%s, %s)", (name, holder)).fetchone()
    assert row is not None and row[0] is True


def waiters(dsn: str, name: str, count: int) -> tuple[list[threading.Thread], list[Any]]:
    """Start ``count`` threads waiting for ``name``; each appends its fence or error."""
    results: list[Any] = []

    def worker() -> None:
        try:
            with lease(dsn, name, ttl=60, wait=BOUND) as held:
                results.append(held.fence)
        except BaseException as exc:
            results.append(exc)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads, results


def join(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(BOUND)
    assert not any(t.is_alive() for t in threads)


@contextmanager
def peak_of(measure: Callable[[], int]) -> Iterator[list[int]]:
    """Sample ``measure()`` in a thread while the block runs; the list holds the peak."""
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], measure())
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        stop.set()
        sampler.join(10)


def test_two_hundred_waiters_in_one_process_use_two_connections(
    dsn: str, conn: Conn, conn2: Conn
) -> None:
    claim(conn, "job", ttl="60s")
    with peak_of(lambda: pylease_connections(conn2)) as peak:
        threads, results = waiters(dsn, "job", 200)
        assert wait_until(lambda: _hub.waiters("job") == 200, BOUND)
        # One listener, and one connection for every claim, status and renewal.
        assert sorted(set(backends(conn, "pylease-listen"))) == backends(conn, "pylease-listen")
        assert len(backends(conn, "pylease-listen")) == 1
        release(conn, "job")
        join(threads)
    assert [r for r in results if not isinstance(r, int)] == []
    assert len(set(results)) == 200
    assert 1 <= peak[0] <= 2, peak[0]


def test_a_release_costs_one_claim_per_waiting_process(dsn: str, conn: Conn) -> None:
    # Counted from connections opened from now on: pylease's own, not `conn`.
    track_functions(conn)
    claim(conn, "job", ttl="60s")
    threads, results = waiters(dsn, "job", 30)
    assert wait_until(lambda: _hub.waiters("job") == 30, BOUND)
    release(conn, "job")
    join(threads)
    assert [r for r in results if not isinstance(r, int)] == []
    # pylease's connection ends with its last lease, and its statistics are flushed then.
    assert wait_until(lambda: not backends(conn, "pylease-heartbeat"), BOUND)
    assert wait_until(lambda: function_calls(conn, "lease_claim") >= 30, BOUND)
    claims = function_calls(conn, "lease_claim")
    # Each waiter's first, busy claim, the first waiter's claim once LISTENing, then one
    # claim per grant: about 2 per grant, where every release woke every thread before.
    assert claims <= 2.5 * 30, claims


def test_waiters_of_one_name_are_granted_in_arrival_order(dsn: str, conn: Conn) -> None:
    claim(conn, "job", ttl="60s")
    order: list[int] = []
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            with lease(dsn, "job", ttl=60, wait=BOUND):
                order.append(index)
        except BaseException as exc:
            errors.append(exc)

    threads = []
    for index in range(12):
        thread = threading.Thread(target=worker, args=(index,), daemon=True)
        thread.start()
        threads.append(thread)
        # The next one arrives once this one is queued.
        assert wait_until(lambda: _hub.waiters("job") == len(threads), BOUND)
    release(conn, "job")
    join(threads)
    assert errors == []
    assert order == list(range(12))


def test_waiters_get_the_lease_when_their_listener_is_lost(dsn: str, conn: Conn) -> None:
    claim(conn, "job", ttl="60s")
    threads, results = waiters(dsn, "job", 20)
    assert wait_until(lambda: _hub.waiters("job") == 20, BOUND)
    assert wait_until(lambda: backends(conn, "pylease-listen"))
    first = backends(conn, "pylease-listen")
    terminate(conn, first)
    # The listener comes back while they wait (LISTEN again, with backoff)...
    assert wait_until(lambda: set(backends(conn, "pylease-listen")) - set(first), BOUND)
    # ... and is lost again, the lease released at once: its NOTIFY may reach nobody;
    # a claim made by polling, or when the listener is back, finds the lease free.
    terminate(conn, backends(conn, "pylease-listen"))
    release(conn, "job")
    join(threads)
    assert [r for r in results if not isinstance(r, int)] == []
    assert len(set(results)) == 20


WAITING_PROCESS = """
import os, sys
from pylease import lease
with lease(sys.argv[1], "job", ttl=60, wait=60) as held:
    print(os.getpid(), held.fence, flush=True)
"""


def test_a_release_wakes_one_waiting_process_and_each_is_granted_once(dsn: str, conn: Conn) -> None:
    # Eight processes wait for one name: each queues itself in pylease_waiters, and
    # only the first in line claims on a release, where all eight used to. The order
    # in which processes are granted is not promised; that each is granted, once, is.
    track_functions(conn)
    first = claim(conn, "job", ttl="60s")
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WAITING_PROCESS, dsn],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        for _ in range(8)
    ]

    def queued() -> list[int]:
        rows = conn.execute("SELECT waiter FROM pylease_waiters WHERE name = 'job' ORDER BY id")
        return [int(r[0].split(":")[1]) for r in rows]

    try:
        assert wait_until(lambda: len(queued()) == 8, BOUND)
        line = queued()
        release(conn, "job")
        outputs = [p.communicate(timeout=BOUND)[0] for p in processes]
    finally:
        for process in processes:
            process.kill()
    assert [p.returncode for p in processes] == [0] * 8
    grants = sorted((int(f), int(pid)) for pid, f in (o.split() for o in outputs))
    # Every process that queued was granted once, each with a fence of its own: the
    # eight grants after the first holder's, with nobody else's in between.
    assert sorted(pid for _fence, pid in grants) == sorted(line)
    assert [fence for fence, _pid in grants] == list(range(first + 1, first + 9))
    assert queued() == []
    assert wait_until(lambda: function_calls(conn, "lease_claim") >= 8, BOUND)
    claims = function_calls(conn, "lease_claim")
    # Per process: its first, busy claim and the one that gets the lease.
    assert claims <= 2.5 * 8, claims


def test_waiters_work_on_a_schema_without_the_queue_of_waiting_processes(
    dsn: str, conn: Conn
) -> None:
    # A database still at 0003 (0005 rolled back): waiters share the listener and
    # queue in the process, and every waiting process claims on a release.
    rollback = data_dir("migrations", "postgres") / "pylease-0005-waiters.rollback.sql"
    conn.execute(rollback.read_text())
    claim(conn, "job", ttl="60s")
    threads, results = waiters(dsn, "job", 5)
    assert wait_until(lambda: _hub.waiters("job") == 5, BOUND)
    release(conn, "job")
    join(threads)
    assert [r for r in results if not isinstance(r, int)] == []
    assert len(set(results)) == 5


HAMMERING_PROCESS = """
import sys, threading, time
from pylease import lease
from tests.support.witness import Witness

w, dsn, seconds = Witness(sys.argv[1]), sys.argv[2], float(sys.argv[3])
end = time.monotonic() + seconds
tenures = 0


def hammer() -> None:
    global tenures
    while time.monotonic() < end:
        with lease(dsn, "hammered", ttl=5, wait=30, heartbeat=False) as held:
            w.grant("hammered", held.holder, held.fence)
            for _ in range(3):
                w.sample(held)
                time.sleep(0.002)
            tenures += 1


threads = [threading.Thread(target=hammer) for _ in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(tenures)
"""


def test_processes_and_threads_hammering_one_name_through_the_waiting_path_never_overlap(
    dsn: str, tmp_path: Any
) -> None:
    # Four processes of three threads each: the in-process queue, the queue of waiting
    # processes and their one-statement claims, all under the belief witness.
    from tests.support.witness import Witness

    w = Witness(tmp_path / "witness.jsonl")
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", HAMMERING_PROCESS, str(w.path), dsn, "3"],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        for _ in range(4)
    ]
    try:
        outputs = [p.communicate(timeout=BOUND)[0] for p in processes]
    finally:
        for process in processes:
            process.kill()
    assert [p.returncode for p in processes] == [0] * 4
    tenures = sum(int(o) for o in outputs)
    grants = w.grants("hammered")
    assert len(grants) == tenures > 4 * 3
    w.assert_sound()  # no belief of one holder after a grant to another
    fences = [g.fields["fence"] for g in sorted(grants, key=lambda g: g.t)]
    assert fences == sorted(fences) and len(set(fences)) == len(fences)


def test_a_dead_process_first_in_line_does_not_hold_up_the_next_one(dsn: str, conn: Conn) -> None:
    # A process queued first in pylease_waiters dies (its entry lives on until it
    # expires, 30 s later). The next process, which leaves releases to the one ahead,
    # claims the release itself after a short grace, not at its poll (here 60 s) nor
    # once the dead entry expired.
    claim(conn, "job", ttl="60s")
    first = subprocess.Popen(
        [sys.executable, "-c", WAITING_PROCESS, dsn],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        queued = "SELECT count(*) FROM pylease_waiters WHERE name = 'job'"
        assert wait_until(lambda: conn.execute(queued).fetchone() == (1,), BOUND)
        results: list[Any] = []

        def second() -> None:
            try:
                with lease(dsn, "job", ttl=60, wait=BOUND, poll_interval=60) as held:
                    results.append(held.fence)
            except BaseException as exc:
                results.append(exc)

        thread = threading.Thread(target=second, daemon=True)
        thread.start()
        assert wait_until(lambda: conn.execute(queued).fetchone() == (2,), BOUND)
    finally:
        first.kill()
        first.wait()
    # The second process refreshes its entry a third of its ttl after queueing, and
    # would claim then: the grant must come before, by the grace after the release.
    refresh = conn.execute(
        "SELECT expires_at - interval '20 s' FROM pylease_waiters WHERE name = 'job'"
        " ORDER BY id DESC LIMIT 1"
    ).fetchone()
    release(conn, "job")
    thread.join(BOUND)
    assert results and isinstance(results[0], int), results
    row = conn.execute("SELECT acquired_at FROM lease_status('job')").fetchone()
    assert refresh is not None and row is not None and row[0] < refresh[0]


def test_a_waiter_of_a_warm_process_wakes_at_the_expiry_of_a_holder_that_died(
    dsn: str, conn: Conn
) -> None:
    # The process's listener is up from an earlier wait and has heard nothing since; a
    # holder then dies without releasing. The waiter reads the holder's expiry soon after
    # its first, plain claim and claims at it, not at its poll interval (here 60 s).
    claim(conn, "warm", ttl="60s")
    threads, _ = waiters(dsn, "warm", 1)
    assert wait_until(lambda: _hub.waiters("warm") == 1, BOUND)
    release(conn, "warm")
    join(threads)
    conn.execute("SELECT lease_claim('job', '1 s', 'dies')")  # and never renews
    start = time.monotonic()
    with lease(dsn, "job", ttl=60, wait=45, poll_interval=60) as held:
        waited = time.monotonic() - start
        assert held.fence == 2
    # At the expiry (a second), not when the process refreshes its place in the queue of
    # waiting processes (10 s) nor at its poll (60 s): a liveness bound short of both.
    assert waited < 8, waited
