"""The semaphore and multi-lock scenarios of the peers' own suites, as pylease runs them
(issue 24: Consul's ``lock -n``, Curator's InterProcessSemaphoreV2 and
InterProcessMultiLock, DistributedLock's semaphore), the shared locks of pals and
django-pglocks (issue 25) and the lock data of cirello.io/pglock (issue 26), on both
backends.

Each test names the peer behaviour it stands for, and where pylease's answer differs
from the peer's, the docstring says what pylease promises instead.
"""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pylease
from pylease import InvalidArgument, LeaseBusy, lease, leases, permit
from tests.support.leases import join_workers, start_worker, wait_until

ROOT = Path(__file__).resolve().parents[2]
# Long enough that a waiter woken at once is told apart from one that waited out a ttl.
LONG = 30

HOLD = (
    "import sys, time\n"
    "from pylease import permit\n"
    "with permit(sys.argv[1], 'export', ttl=float(sys.argv[2]), max_permits=2) as held:\n"
    "    print(sorted(held.slots), flush=True)\n"
    "    time.sleep(120)\n"
)


def holding_process(url: str, ttl: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, url, str(ttl)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip(), "the holding process did not report its slot"
    return proc


def test_curator_acquire_several_permits_at_once_or_none(url: str) -> None:
    """Curator ``acquire(qty)``: several leases together; pylease's ``permits=`` is one
    statement, so a claim of more than are free takes none of them."""
    with permit(url, "export", ttl=LONG, max_permits=5, permits=3) as three:
        assert len(three.slots) == 3
        with pytest.raises(LeaseBusy), permit(url, "export", ttl=LONG, max_permits=5, permits=3):
            pass
        with permit(url, "export", ttl=LONG, max_permits=5, permits=2) as two:
            assert set(two.slots).isdisjoint(three.slots)


def test_curator_acquire_with_a_timeout_gives_up_when_none_is_freed(url: str) -> None:
    """Curator ``acquire(time, unit)`` returns null when no lease came in time; pylease's
    ``wait=`` raises LeaseBusy at its bound, holding nothing."""
    with permit(url, "export", ttl=LONG, max_permits=1):
        start = time.monotonic()
        with pytest.raises(LeaseBusy), permit(url, "export", ttl=LONG, max_permits=1, wait=0.5):
            pass
        assert time.monotonic() - start >= 0.5


def test_curator_a_dead_clients_permit_comes_back_when_its_ttl_ends(url: str) -> None:
    """Curator frees a dead client's lease when its ZooKeeper session expires; pylease's
    slot of a SIGKILLed holder is free at its ttl, not before (its holder may still be
    running work the kill did not reach, as far as the database can tell)."""
    ttl = 3.0
    proc = holding_process(url, ttl)
    try:
        with permit(url, "export", ttl=LONG, max_permits=2):
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            killed = time.monotonic()
            with permit(url, "export", ttl=LONG, max_permits=2, wait=LONG) as third:
                waited = time.monotonic() - killed
            assert len(third.slots) == 1
        # The kill came after the last renewal at the latest: the slot was busy until
        # ttl after it, minus the keeper's renewal interval at most.
        assert waited >= ttl / 3 - 0.5
    finally:
        proc.kill()
        proc.wait()


def test_curator_no_orphan_permit_after_the_holder_reconnects(dsn: str) -> None:
    """Curator left an orphan lease node after a reconnect: a holder whose connection
    broke kept a second lease. pylease's keeper renews the slot it was granted, by its
    fence, on a new connection: the holder still holds that slot and no other."""
    with permit(dsn, "export", ttl=3, max_permits=2) as held:
        slots = dict(held.slots)
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            time.sleep(4)  # past the ttl: only renewals on a new connection kept the slot
            held.check()
            assert dict(held.slots) == slots
            rows = admin.execute(
                "SELECT slot FROM permit_status('export') WHERE held AND holder = %s",
                (held.holder,),
            ).fetchall()
            assert [r[0] for r in rows] == list(slots)
        with permit(dsn, "export", ttl=LONG, max_permits=2) as other:
            assert set(other.slots).isdisjoint(slots)


def test_distributedlock_a_different_limit_for_one_semaphore_is_refused(url: str) -> None:
    """DistributedLock calls mismatched limits undefined; pylease refuses them, naming
    the limit the semaphore has, and changes nothing."""
    with permit(url, "export", ttl=LONG, max_permits=2):
        with (
            pytest.raises(InvalidArgument, match="2"),
            permit(url, "export", ttl=LONG, max_permits=3),
        ):
            pass
        with permit(url, "export", ttl=LONG, max_permits=2) as second:
            assert len(second.slots) == 1


def test_consul_lock_n_a_freed_slot_goes_to_a_waiter_at_once(url: str) -> None:
    """Consul's ``lock -n`` retries one hot key, and its handovers lagged seconds: a
    waiter for a slot is granted when one is given back, long before any ttl could
    have ended (PostgreSQL notifies; SQLite's waiters poll, briefly)."""
    granted: dict[str, float] = {}

    def wait_for_a_slot() -> None:
        with permit(url, "export", ttl=LONG, max_permits=2, wait=LONG):
            granted["at"] = time.monotonic()

    with permit(url, "export", ttl=LONG, max_permits=2):
        with permit(url, "export", ttl=LONG, max_permits=2):
            worker = start_worker(wait_for_a_slot)
            time.sleep(0.5)
            assert not granted
        released = time.monotonic()
    join_workers([worker])
    assert granted["at"] - released < LONG / 2


def test_curator_multilock_takes_every_name_or_none(url: str) -> None:
    """Curator's MultiLock acquires its locks one after another and gives back those it
    got when one fails; pylease's claim of several names is one statement: while one
    name is held elsewhere the others are never taken, not even for a moment."""
    with pylease.lease(url, "to", ttl=LONG):
        with pytest.raises(LeaseBusy), leases(url, ["from", "to"], ttl=LONG):
            pass
        assert not pylease.locked(url, "from")
    with leases(url, ["from", "to"], ttl=LONG) as both:
        assert set(both.fences) == {"from", "to"}
        assert pylease.locked(url, "from") and pylease.locked(url, "to")
    assert not pylease.locked(url, "from") and not pylease.locked(url, "to")


def test_curator_multilock_waiters_in_opposite_orders_both_finish(url: str) -> None:
    """Two MultiLocks over the same names in opposite orders can deadlock when each
    takes one name first; pylease orders every claim of several names itself."""
    done: list[str] = []

    def cycle(names: list[str]) -> None:
        for _ in range(10):
            with leases(url, names, ttl=LONG, wait=LONG):
                pass
        done.append(",".join(names))

    workers = [start_worker(cycle, ["a", "b", "c"]), start_worker(cycle, ["c", "b", "a"])]
    join_workers(workers)
    assert sorted(done) == ["a,b,c", "c,b,a"]
    assert wait_until(lambda: not any(pylease.locked(url, n) for n in "abc"))


# Readers and writers: the shared-lock scenarios of pals' and django-pglocks' suites
# (issue 25), whose advisory shared locks are bound to a session.


def test_pals_shared_locks_are_held_together_and_keep_a_writer_out(url: str) -> None:
    """pals ``lock(shared=True)`` twice at once; an exclusive lock of the name fails
    while they are held, and succeeds once both are given back."""
    with lease(url, "catalog", ttl=LONG, shared=True) as one:
        with lease(url, "catalog", ttl=LONG, shared=True) as two:
            assert one.fence == two.fence  # one epoch: the readers' shared tenure
            with pytest.raises(LeaseBusy), lease(url, "catalog", ttl=LONG):
                pass
        with pytest.raises(LeaseBusy), lease(url, "catalog", ttl=LONG):
            pass
    with lease(url, "catalog", ttl=LONG) as writer:
        assert writer.fence > one.fence


def test_django_pglocks_a_shared_lock_fails_without_waiting_while_a_writer_holds(
    url: str,
) -> None:
    """django-pglocks ``advisory_lock(id, shared=True, wait=False)`` returns False while
    an exclusive lock is held; pylease's reader with ``wait=0`` is busy at once, and a
    reader that waits is granted when the writer leaves."""
    granted: dict[str, int] = {}

    def reader() -> None:
        with lease(url, "catalog", ttl=LONG, shared=True, wait=LONG) as held:
            granted["epoch"] = held.fence

    with lease(url, "catalog", ttl=LONG) as writer:
        start = time.monotonic()
        with pytest.raises(LeaseBusy), lease(url, "catalog", ttl=LONG, shared=True):
            pass
        assert time.monotonic() - start < LONG / 2
        worker = start_worker(reader)
        time.sleep(0.5)
        assert not granted
    join_workers([worker])
    assert granted["epoch"] == writer.fence  # a reader's epoch: the last writer's fence


def test_pals_a_collected_reader_gives_its_share_back(url: str) -> None:
    """pals releases a lock its object's collection ends; a reader entered and dropped
    gives its share back, so that a writer is granted at once."""
    share = lease(url, "catalog", ttl=LONG, shared=True)
    share.__enter__()
    del share
    gc.collect()
    assert wait_until(lambda: not pylease.locked(url, "catalog"))
    with lease(url, "catalog", ttl=LONG):
        pass


def test_a_stale_readers_epoch_is_rejected_after_a_writer_was_granted(dsn: str) -> None:
    """A reader's fenced write (lease_holds with its epoch) fails once a writer was
    granted the name: the pglock scenario of a reader that outlived its share."""
    with lease(dsn, "catalog", ttl=LONG, shared=True) as reader:
        epoch = reader.fence
    with lease(dsn, "catalog", ttl=LONG), psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT lease_holds('catalog', %s, %s)", (reader.holder, epoch)
        ).fetchone()
        assert row == (False,)


# Lock data: the data scenarios of cirello.io/pglock's suite (issue 26), whose locks keep
# a byte payload on their row.


def test_pglock_a_lock_acquired_with_data_shows_it(url: str) -> None:
    """pglock ``Acquire(name, WithData(...))`` then ``Get(name).Data()``."""
    with lease(url, "pglock-data", ttl=LONG, data={"owner": "a", "n": 1}):
        [row] = pylease.status(url, "pglock-data")
        assert row.data == {"owner": "a", "n": 1}


def test_pglock_the_holder_updates_its_data_while_holding(url: str) -> None:
    """pglock's heartbeat-kept lock whose data the holder replaces; pylease's
    ``held.set_data`` is holder-matched: a lease no longer ours is not written."""
    with lease(url, "pglock-data", ttl=LONG, data="first") as held:
        held.set_data("second")
        assert pylease.status(url, "pglock-data")[0].data == "second"


def test_pglock_a_busy_acquire_reads_the_holders_data(url: str) -> None:
    """pglock ``Acquire`` fails with ErrNotAcquired and ``Get`` tells the holder's data;
    pylease's LeaseBusy carries it."""
    with other_party(url) as other:
        assert other.claim("pglock-data", span(LONG), "elsewhere", {"node": 7}) == 1
        with pytest.raises(LeaseBusy) as busy, lease(url, "pglock-data", ttl=LONG):
            pass
        assert (busy.value.holder, busy.value.data) == ("elsewhere", {"node": 7})


def test_pglock_a_new_acquire_replaces_the_data(url: str) -> None:
    """pglock ``WithReplaceData``: the next holder's data replaces the last one's; in
    pylease that is every grant's rule, and a grant without data leaves none."""
    with lease(url, "pglock-data", ttl=LONG, data="old"):
        pass
    with lease(url, "pglock-data", ttl=LONG, data="new"):
        assert pylease.status(url, "pglock-data")[0].data == "new"
    with lease(url, "pglock-data", ttl=LONG):
        assert pylease.status(url, "pglock-data")[0].data is None


def test_pglock_keep_on_release_shows_the_last_data_until_the_next_grant(url: str) -> None:
    """pglock ``WithKeepOnRelease``: the row and its data outlive the release. pylease
    keeps every released row: its last holder and data show until the next grant."""
    with lease(url, "pglock-data", ttl=LONG, data={"done": True}):
        pass
    [row] = pylease.status(url, "pglock-data")
    assert (row.state, row.data) == ("released", {"done": True})


def test_pglock_get_all_locks_lists_their_data(url: str) -> None:
    """pglock ``GetAllLocks``: every lock with its data; pylease's ``status()`` (every
    name) and ``lease_holders`` (every current holder)."""
    with (
        lease(url, "pglock-a", ttl=LONG, data=1),
        lease(url, "pglock-b", ttl=LONG, data=[2]),
    ):
        assert [(r.name, r.data) for r in pylease.status(url)] == [
            ("pglock-a", 1),
            ("pglock-b", [2]),
        ]


def other_party(url: str) -> Any:
    """A backend of the other party on a connection of its own (either database)."""
    import contextlib

    from pylease.postgres import PostgresBackend
    from pylease.sqlite import SqliteBackend, connect

    @contextlib.contextmanager
    def opened() -> Any:
        if url.startswith("sqlite:"):
            conn = connect(url.removeprefix("sqlite:///"))
            try:
                yield SqliteBackend(conn)
            finally:
                conn.close()
        else:
            with psycopg.connect(url, autocommit=True) as pconn:
                yield PostgresBackend(pconn)

    return opened()


def span(seconds: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=seconds)
