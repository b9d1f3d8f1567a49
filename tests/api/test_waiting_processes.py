"""Waiting processes, each an interpreter of its own: the queue of waiting processes.

Several processes wait for one name: each queues itself in ``pylease_waiters``, and on
a release only the first in line claims. Sync only: what is tried is between processes
(the waiters in one process, threads or tasks, are in test_waiting_fleet.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import psycopg

from tests.api.test_waiting_fleet import BOUND, WAITING_PROCESS, release
from tests.support.leases import CLAIM_BODY, claim, function_calls, track_functions, wait_until

Conn = psycopg.Connection[Any]

# Woken by notifications only: a waiter's safety poll (every few seconds) and its read
# of the holder's status a second after its first claim would add claims of their own
# on a loaded machine, where the eight handovers take that long. And none dies here: a
# process behind another claims a release it heard only in case the one ahead died,
# after a grace (0.2 s) that a loaded machine's head may outlast.
NOTIFIED_ONLY = WAITING_PROCESS.replace("wait=60)", "wait=60, poll_interval=60)").replace(
    "from pylease import lease\n",
    "from pylease import lease\nimport pylease._waiting\npylease._waiting.BEHIND_GRACE = 60.0\n"
    "pylease._waiting.STATUS_FRESH = 60.0\n",
)
assert "poll_interval=60" in NOTIFIED_ONLY and "STATUS_FRESH = 60.0" in NOTIFIED_ONLY


def test_a_release_wakes_one_waiting_process_and_each_is_granted_once(dsn: str, conn: Conn) -> None:
    # Eight processes wait for one name: each queues itself in pylease_waiters, and
    # only the first in line claims on a release, where all eight used to. The order
    # in which processes are granted is not promised; that each is granted, once, is.
    track_functions(conn)
    first = claim(conn, "job", ttl="60s")
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", NOTIFIED_ONLY, dsn],
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
    assert wait_until(lambda: function_calls(conn, CLAIM_BODY) >= 8, BOUND)
    claims = function_calls(conn, CLAIM_BODY)
    # Per process: its first, busy claim and the one that gets the lease.
    assert claims <= 2.5 * 8, claims


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
