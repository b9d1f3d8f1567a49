# The source of tests/api/test_waiting_fleet.py: tools/async_to_sync.py writes it from this file.
"""Many waiters: one shared listener, one claim per release, arrival order in a process.

The waiters of a process (of an event loop, for tasks) share one LISTEN connection
per database and queue per name (pylease/_hub_async.py); these tests count what that
saves on a real server (connections in pg_stat_activity, lease_claim calls in
pg_stat_user_functions) and check what it must keep (arrival order, the fallback when
the listener is lost). test_waiting_fleet.py is generated from
test_waiting_fleet_async.py (its waiters are threads, the source's tasks); waiting
processes, each an interpreter of its own, are in test_waiting_processes.py.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pylease import _hub_async, alease
from pylease._acompat import AEvent, asleep
from pylease._resources import data_dir
from tests.support.leases import (
    CLAIM_BODY,
    AConn,
    abackends,
    aclaim,
    afunction_calls,
    ajoin_workers,
    asleep_until,
    astart_worker,
    aterminate,
    atrack_functions,
    await_until,
)

BOUND = 60.0  # every wait: far longer than any of these tests should take

WAITING_PROCESS = """
import os, sys
from pylease import lease
with lease(sys.argv[1], "job", ttl=60, wait=60) as held:
    print(os.getpid(), held.fence, flush=True)
"""


async def pylease_connections(aconn: AConn) -> int:
    cur = await aconn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE 'pylease%'"
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def release(aconn: AConn, name: str, holder: str = "other") -> None:
    cur = await aconn.execute("SELECT lease_release(%s, %s)", (name, holder))
    row = await cur.fetchone()
    assert row is not None and row[0] is True


def waiters(dsn: str, name: str, count: int) -> tuple[list[Any], list[Any]]:
    """Start ``count`` waiters for ``name``; each appends its fence or error."""
    results: list[Any] = []

    async def waiter() -> None:
        try:
            async with alease(dsn, name, ttl=60, wait=BOUND) as held:
                results.append(held.fence)
        except BaseException as exc:
            results.append(exc)

    return [astart_worker(waiter) for _ in range(count)], results


def queued(name: str, count: int) -> Callable[[], bool]:
    """Whether ``count`` waiters of this process wait for ``name``, as a predicate."""
    return lambda: _hub_async.waiters(name) == count


@contextlib.asynccontextmanager
async def peak_of(measure: Callable[[], Awaitable[int]]) -> AsyncIterator[list[int]]:
    """Sample ``measure()`` while the block runs; the list holds the peak."""
    peak = [0]
    done = AEvent()

    async def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], await measure())
            await asleep(0.02)

    sampler = astart_worker(sample)
    try:
        yield peak
    finally:
        done.set()
        await ajoin_workers([sampler], BOUND)


async def test_two_hundred_waiters_in_one_process_use_two_connections(
    dsn: str, aconn: AConn, aconn2: AConn
) -> None:
    await aclaim(aconn, "job", ttl="60s")
    async with peak_of(lambda: pylease_connections(aconn2)) as peak:
        workers, results = waiters(dsn, "job", 200)
        assert await asleep_until(queued("job", 200), BOUND)
        # One listener, and one connection for every claim, status and renewal.
        assert len(await abackends(aconn, "pylease-listen")) == 1
        await release(aconn, "job")
        await ajoin_workers(workers, BOUND)
    assert [r for r in results if not isinstance(r, int)] == []
    assert len(set(results)) == 200
    assert 1 <= peak[0] <= 2, peak[0]


async def test_a_release_costs_one_claim_per_waiting_process(dsn: str, aconn: AConn) -> None:
    # Counted from connections opened from now on: pylease's own, not `aconn`.
    await atrack_functions(aconn)
    await aclaim(aconn, "job", ttl="60s")
    workers, results = waiters(dsn, "job", 30)
    assert await asleep_until(queued("job", 30), BOUND)
    await release(aconn, "job")
    await ajoin_workers(workers, BOUND)
    assert [r for r in results if not isinstance(r, int)] == []

    async def source_closed() -> bool:
        return not await abackends(aconn, "pylease-heartbeat")

    async def counted() -> bool:
        return await afunction_calls(aconn, CLAIM_BODY) >= 30

    # pylease's connection ends with its last lease, and its statistics are flushed then.
    assert await await_until(source_closed, BOUND)
    assert await await_until(counted, BOUND)
    claims = await afunction_calls(aconn, CLAIM_BODY)
    # Each waiter's first, busy claim, the first waiter's claim once LISTENing, then one
    # claim per grant: about 2 per grant, where every release woke every waiter before.
    assert claims <= 2.5 * 30, claims


async def test_waiters_of_one_name_are_granted_in_arrival_order(dsn: str, aconn: AConn) -> None:
    await aclaim(aconn, "job", ttl="60s")
    order: list[int] = []

    async def waiter(index: int) -> None:
        async with alease(dsn, "job", ttl=60, wait=BOUND):
            order.append(index)

    workers = []
    for index in range(12):
        workers.append(astart_worker(waiter, index))
        # The next one arrives once this one is queued.
        assert await asleep_until(queued("job", len(workers)), BOUND)
    await release(aconn, "job")
    await ajoin_workers(workers, BOUND)
    assert order == list(range(12))


async def test_waiters_get_the_lease_when_their_listener_is_lost(dsn: str, aconn: AConn) -> None:
    await aclaim(aconn, "job", ttl="60s")
    workers, results = waiters(dsn, "job", 20)
    assert await asleep_until(queued("job", 20), BOUND)

    async def listening() -> bool:
        return bool(await abackends(aconn, "pylease-listen"))

    assert await await_until(listening, BOUND)
    first = await abackends(aconn, "pylease-listen")
    await aterminate(aconn, first)

    async def relistened() -> bool:
        return bool(set(await abackends(aconn, "pylease-listen")) - set(first))

    # The listener comes back while they wait (LISTEN again, with backoff)...
    assert await await_until(relistened, BOUND)
    # ... and is lost again, the lease released at once: its NOTIFY may reach nobody;
    # a claim made by polling, or when the listener is back, finds the lease free.
    await aterminate(aconn, await abackends(aconn, "pylease-listen"))
    await release(aconn, "job")
    await ajoin_workers(workers, BOUND)
    assert [r for r in results if not isinstance(r, int)] == []
    assert len(set(results)) == 20


async def test_waiters_work_on_a_schema_without_the_queue_of_waiting_processes(
    dsn: str, aconn: AConn
) -> None:
    # A database still at 0004 (0005 rolled back): waiters share the listener and
    # queue in the process, and every waiting process claims on a release.
    rollback = data_dir("migrations", "postgres") / "pylease-0005-waiters.rollback.sql"
    await aconn.execute(rollback.read_text())
    await aclaim(aconn, "job", ttl="60s")
    workers, results = waiters(dsn, "job", 5)
    assert await asleep_until(queued("job", 5), BOUND)
    await release(aconn, "job")
    await ajoin_workers(workers, BOUND)
    assert [r for r in results if not isinstance(r, int)] == []
    assert len(set(results)) == 5


async def test_a_dead_process_first_in_line_does_not_hold_up_the_next_one(
    dsn: str, aconn: AConn
) -> None:
    # A process queued first in pylease_waiters dies (its entry lives on until it
    # expires, 30 s later). The next process, which leaves releases to the one ahead,
    # claims the release itself after a short grace, not at its poll (here 60 s) nor
    # once the dead entry expired.
    async def in_line() -> int:
        cur = await aconn.execute("SELECT count(*) FROM pylease_waiters WHERE name = 'job'")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    async def one_in_line() -> bool:
        return await in_line() == 1

    async def two_in_line() -> bool:
        return await in_line() == 2

    await aclaim(aconn, "job", ttl="60s")
    first = subprocess.Popen(
        [sys.executable, "-c", WAITING_PROCESS, dsn],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    results: list[Any] = []

    async def second() -> None:
        async with alease(dsn, "job", ttl=60, wait=BOUND, poll_interval=60) as held:
            results.append(held.fence)

    try:
        assert await await_until(one_in_line, BOUND)
        worker = astart_worker(second)
        assert await await_until(two_in_line, BOUND)
    finally:
        first.kill()
        first.wait()
    # The second process refreshes its entry a third of its ttl after queueing, and
    # would claim then: the grant must come before, by the grace after the release.
    cur = await aconn.execute(
        "SELECT expires_at - interval '20 s' FROM pylease_waiters WHERE name = 'job'"
        " ORDER BY id DESC LIMIT 1"
    )
    refresh = await cur.fetchone()
    await release(aconn, "job")
    await ajoin_workers([worker], BOUND)
    assert results and isinstance(results[0], int), results
    cur = await aconn.execute("SELECT acquired_at FROM lease_status('job')")
    row = await cur.fetchone()
    assert refresh is not None and row is not None and row[0] < refresh[0]


async def test_a_waiter_of_a_warm_process_wakes_at_the_expiry_of_a_holder_that_died(
    dsn: str, aconn: AConn
) -> None:
    # The process's listener is up from an earlier wait and has heard nothing since; a
    # holder then dies without releasing. The waiter reads the holder's expiry soon after
    # its first, plain claim and claims at it, not at its poll interval (here 60 s).
    await aclaim(aconn, "warm", ttl="60s")
    workers, _ = waiters(dsn, "warm", 1)
    assert await asleep_until(queued("warm", 1), BOUND)
    await release(aconn, "warm")
    await ajoin_workers(workers, BOUND)
    await aconn.execute("SELECT lease_claim('job', '1 s', 'dies')")  # and never renews
    start = time.monotonic()
    async with alease(dsn, "job", ttl=60, wait=45, poll_interval=60) as held:
        waited = time.monotonic() - start
        assert held.fence == 2
    # At the expiry (a second), not when the process refreshes its place in the queue of
    # waiting processes (10 s) nor at its poll (60 s): a liveness bound short of both.
    assert waited < 8, waited


async def test_a_waiter_claims_when_a_released_lease_stops_resting(dsn: str, aconn: AConn) -> None:
    # Released with a min_hold, the lease rests (no holder, and no claim granted) until
    # its acquired_at + min_hold, and nothing is notified then. The status that the
    # waiter reads after its busy claims shows no holder: the waiter claims at the rest's
    # end, not when its process refreshes its place in the queue (10 s) nor at its poll.
    await aconn.execute("SELECT lease_claim('job', '60 s', 'other')")
    await aconn.execute("SELECT lease_release('job', 'other', '3 s')")
    start = time.monotonic()
    async with alease(dsn, "job", ttl=60, wait=45, poll_interval=60) as held:
        waited = time.monotonic() - start
        assert held.fence == 2
    assert waited < 8, waited


async def test_a_release_heard_behind_another_process_wakes_only_a_sleep_outlasting_the_grace(
    dsn: str,
) -> None:
    # Behind another process in the queue of waiting processes, a waiter claims a release
    # only a grace after it (in case the process ahead died). A release heard then wakes
    # it only when its sleep would end later than that: otherwise it looks when it wakes,
    # and every process behind is not switched to once per release of a busy name.
    hub = _hub_async.AsyncHub(dsn)  # never started: the test plays the listener
    waiter = _hub_async.AsyncWaiter(hub, "job")
    waiter.db_head, waiter.patience = False, 2.0

    async def hear() -> None:
        await asleep(0.2)
        with _hub_async._mutex:
            waiter.heard()

    for sleep_for, woken in ((0.8, False), (BOUND, True)):
        waiter.release_heard = None
        hearing = astart_worker(hear)
        start = time.monotonic()
        retry = await waiter.sleep(sleep_for)
        slept = time.monotonic() - start
        await ajoin_workers([hearing])
        assert waiter.release_heard is not None and waiter.release_heard - start > 0.1
        # Woken early without a call to claim, or to the end of a sleep within the grace.
        assert retry is not woken and not waiter.called
        assert (slept < sleep_for - 0.3) if woken else (slept >= sleep_for - 0.05), slept
