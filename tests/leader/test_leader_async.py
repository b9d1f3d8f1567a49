# The source of tests/leader/test_leader.py: tools/async_to_sync.py writes it from this file.
"""Leader election: ``aleader``, ``arun_as_leader``, ``acurrent_leader``, ``awatch_leader``.

Real PostgreSQL (and SQLite where the waiting differs); no timing assertions: the
order of events on one monotonic clock, and liveness bounds of tens of seconds.
test_leader.py is generated from test_leader_async.py: its candidates, watchers and
work run in threads, the source's in tasks.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pylease import (
    Held,
    LeaseBusy,
    LeaseLost,
    acurrent_leader,
    aleader,
    arun_as_leader,
    awatch_leader,
    current_leader,
    run_as_leader,
)
from pylease import _hub_async as hub
from pylease import _standby_async as standby_module
from pylease._acompat import AEvent, asleep, ato_thread
from pylease._rows import LeaseRow
from tests.support.leader_witness import Election, campaign_rounds, check_witness
from tests.support.leases import AConn, ajoin_workers, asleep_until, astart_worker, await_until

LIVE = 30.0  # seconds: a liveness bound, never a speed
# A term the steal ends, long enough that no stall of a loaded machine (one missed
# renewal) ends it first: the keeper learns of the steal at its next renewal, ttl / 3.
TERM_TTL = 6.0

# The API the candidates of the processes' election use.
if True:  # ASYNC  # noqa: SIM108
    API = "async"
else:
    API = "sync"


def pylease_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pylease", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def psql(dsn: str, query: str) -> str:
    result = subprocess.run(
        ["psql", dsn, "-XAtqc", query], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


async def listeners(aconn: AConn) -> int:
    cur = await aconn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pylease-listen'"
        " AND datname = current_database()"
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def run_out(aconn: AConn, name: str) -> None:
    """End the term of ``name`` by its expiry now, as a crashed leader's would end.

    No release, hence no NOTIFY: only the expiry tells. A test that needs the row seen
    held first claims it for a minute and runs it out here, instead of racing a short
    ttl against how fast a loaded machine reads it.
    """
    await aconn.execute(
        "UPDATE pylease_leases SET expires_at = clock_timestamp() WHERE name = %s", (name,)
    )


# aleader() ----------------------------------------------------------------------


async def test_leaving_the_block_hands_over_to_the_waiting_standby(dsn: str, aconn: AConn) -> None:
    events: list[tuple[str, int]] = []
    first_cm = aleader(dsn, "scheduler", ttl=30)
    first = await first_cm.__aenter__()
    assert isinstance(first, Held) and not first.lost

    async def standby() -> None:
        async with aleader(dsn, "scheduler", ttl=30) as second:
            events.append(("second leads", second.fence))
            row = await acurrent_leader(dsn, "scheduler")
            assert row is not None and row.holder == second.holder

    async def standing_by() -> bool:
        return await listeners(aconn) == 1  # the standby waits on a NOTIFY

    worker = astart_worker(standby)
    assert await await_until(standing_by, LIVE)
    events.append(("first resigns", first.fence))
    await first_cm.__aexit__(None, None, None)
    await ajoin_workers([worker], LIVE)
    assert [e[0] for e in events] == ["first resigns", "second leads"]
    assert events[1][1] > events[0][1]
    # The handover came from the release, long before the 30 s ttl could run out.
    assert await acurrent_leader(dsn, "scheduler") is None


async def test_wait_runs_out_as_lease_busy(dsn: str, aconn: AConn) -> None:
    await aconn.execute("SELECT lease_claim('scheduler', '1 min', 'elsewhere')")
    # A Connection target: the campaign reads the row on it, renewals go elsewhere.
    with pytest.raises(LeaseBusy) as caught:
        async with aleader(aconn, "scheduler", ttl=5, wait=0.2):
            raise AssertionError("elected while another leads")
    assert caught.value.holder == "elsewhere"


async def test_a_dead_leaders_term_runs_out_then_the_standby_leads(dsn: str, aconn: AConn) -> None:
    await aconn.execute("SELECT lease_claim('scheduler', '300 ms', 'crashed')")
    async with aleader(dsn, "scheduler", ttl=5) as term:
        row = await acurrent_leader(aconn, "scheduler")
        assert row is not None and (row.holder, row.fence) == (term.holder, term.fence)
    assert term.fence == 2


async def test_a_block_that_raises_resigns_and_the_error_stands(dsn: str) -> None:
    with pytest.raises(ZeroDivisionError):
        async with aleader(dsn, "scheduler", ttl=5):
            1 / 0  # noqa: B018
    assert await acurrent_leader(dsn, "scheduler") is None


async def test_a_lost_term_ends_the_block(dsn: str, aconn: AConn) -> None:
    with pytest.raises(LeaseLost):
        async with aleader(dsn, "scheduler", ttl=1.5) as term:
            await aconn.execute("SELECT lease_steal('scheduler', '1 min', 'operator')")
            if True:  # ASYNC
                await asleep(LIVE)  # cancelled when the keeper learns of the steal
            else:
                assert await asleep_until(lambda: term.lost, LIVE)
    assert term.lost


async def test_leader_checks_its_arguments_before_any_sql() -> None:
    with pytest.raises(ValueError, match="ttl"):
        aleader("postgresql://nowhere.invalid/x", "s", ttl=0)
    with pytest.raises(ValueError, match="name"):
        aleader("postgresql://nowhere.invalid/x", "", ttl=5)
    with pytest.raises(ValueError, match="wait"):
        aleader("postgresql://nowhere.invalid/x", "s", ttl=5, wait=-1)
    with pytest.raises(ValueError, match="wait"):
        aleader("postgresql://nowhere.invalid/x", "s", ttl=5, wait="soon")
    for forever in (None, math.inf, "forever", timedelta.max, "30s"):
        aleader("postgresql://nowhere.invalid/x", "s", ttl=5, wait=forever)  # no I/O yet
    with pytest.raises(ValueError, match="work"):
        await arun_as_leader("postgresql://nowhere.invalid/x", "s", 5, "not callable")  # type: ignore[arg-type]


async def test_on_sqlite_the_standby_polls_and_leads(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'leases.sqlite3'}"
    order: list[str] = []
    first_cm = aleader(url, "scheduler", ttl=30)
    first = await first_cm.__aenter__()

    async def standby() -> None:
        async with aleader(url, "scheduler", ttl=30) as second:
            order.append(f"second {second.fence}")

    worker = astart_worker(standby)
    await asleep(0.2)  # let it start waiting; the order holds either way
    order.append(f"first {first.fence}")
    await first_cm.__aexit__(None, None, None)
    await ajoin_workers([worker], LIVE)
    assert order == ["first 1", "second 2"]


# acurrent_leader() ----------------------------------------------------------------


async def test_current_leader_is_the_held_row_only(dsn: str, aconn: AConn) -> None:
    assert await acurrent_leader(dsn, "scheduler") is None
    await aconn.execute("SELECT lease_claim('scheduler', '1 min', 'someone')")
    row = await acurrent_leader(aconn, "scheduler")
    assert isinstance(row, LeaseRow) and row.holder == "someone" and row.fence == 1
    await run_out(aconn, "scheduler")
    assert await acurrent_leader(aconn, "scheduler") is None  # expired: nobody leads
    await aconn.execute("SELECT lease_claim('scheduler', '1 min', 'next')")
    await aconn.execute("SELECT lease_release('scheduler', 'next')")
    assert await acurrent_leader(aconn, "scheduler") is None  # released: nobody leads
    await aconn.execute("SELECT lease_claim('scheduler', '1 min', 'rests')")
    await aconn.execute("SELECT lease_release('scheduler', 'rests', '1 hour')")
    assert await acurrent_leader(aconn, "scheduler") is None  # resting (min_hold)


# awatch_leader() -------------------------------------------------------------------


async def test_watch_sees_every_change_in_order_including_a_grant_from_psql(dsn: str) -> None:
    seen: list[tuple[str, int] | None] = []

    async def watch() -> None:
        async for info in awatch_leader(dsn, "scheduler", poll_interval=0.2):
            seen.append(None if info is None else (info.holder, info.fence))
            if info is not None and info.holder == "operator":
                return

    async def until(count: int) -> None:
        assert await asleep_until(lambda: len(seen) >= count, LIVE), seen

    worker = astart_worker(watch)
    await until(1)
    await ato_thread(psql, dsn, "SELECT lease_claim('scheduler', '1 min', 'psql-user')")
    await until(2)  # a grant sends no NOTIFY: the poll saw it
    await ato_thread(psql, dsn, "SELECT lease_release('scheduler', 'psql-user')")  # NOTIFY
    await until(3)
    # The block ends after its term was stolen.
    with pytest.raises(LeaseLost):
        async with aleader(dsn, "scheduler", ttl=3, holder="python") as term:
            await until(4)
            stolen = await ato_thread(
                pylease_cli, "steal", "scheduler", "--ttl", "1m", "--holder", "operator",
                "--dsn", dsn,
            )  # fmt: skip
            assert stolen.returncode == 0, stolen.stderr
            if True:  # ASYNC
                await asleep(LIVE)  # the lost term cancels this
            else:
                assert await asleep_until(lambda: term.lost, LIVE)
    await ajoin_workers([worker], LIVE)
    assert seen == [None, ("psql-user", 1), None, ("python", 2), ("operator", 3)]


async def test_watch_sees_an_expiry_as_nobody_leading(dsn: str, aconn: AConn) -> None:
    await aconn.execute("SELECT lease_claim('scheduler', '1 min', 'gone')")
    watch = awatch_leader(aconn, "scheduler")
    try:
        first = await anext(watch)
        assert first is not None and first.holder == "gone"
        await run_out(aconn, "scheduler")  # the watcher reads the row again within its poll
        assert await anext(watch) is None
    finally:
        await watch.aclose()


async def test_watching_a_leader_that_renews_reads_its_row_about_once_a_poll(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[float] = []
    read = standby_module.AsyncWatch.read

    async def counted(self: standby_module.AsyncWatch) -> LeaseRow | None:
        reads.append(time.monotonic())
        return await read(self)

    monkeypatch.setattr(standby_module.AsyncWatch, "read", counted)
    seen: list[LeaseRow | None] = []

    async def watch() -> None:
        async for info in awatch_leader(dsn, "scheduler"):  # the default 1 s poll
            seen.append(info)
            if info is None:
                return

    async with aleader(dsn, "scheduler", ttl=1, holder="healthy") as term:
        watcher = astart_worker(watch)
        assert await asleep_until(lambda: len(seen) == 1, LIVE)
        start = time.monotonic()
        await asleep(3.0)  # three times the ttl: the first row seen expired long ago
        term.check()
        during = [t for t in reads if t >= start]
    # Leaving the block released the term: the watcher sees nobody and ends.
    await ajoin_workers([watcher], LIVE)
    # A read per poll and per expiry it knows: a handful, not one per 10 ms backoff.
    assert len(during) <= 12, len(during)
    assert seen[0] is not None and seen[0].holder == "healthy" and seen[-1] is None


# arun_as_leader() -------------------------------------------------------------------


class Recorder:
    """Every callback and work call, in order (in the async source, coroutine functions
    and a plain one: both are fine)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int | None]] = []

    async def new(self, info: LeaseRow | None) -> None:
        self.calls.append(("new", None if info is None else info.fence))

    async def started(self, term: Held) -> None:
        self.calls.append(("started", term.fence))

    def stopped(self, term: Held) -> None:
        self.calls.append(("stopped", term.fence))


async def test_work_that_returns_ends_its_term_and_the_next_term_is_larger(dsn: str) -> None:
    rec = Recorder()
    stop = AEvent()
    fences: list[int] = []

    async def work(term: Held) -> None:
        rec.calls.append(("work", term.fence))
        fences.append(term.fence)
        row = await acurrent_leader(dsn, "scheduler")
        assert row is not None and row.fence == term.fence
        if len(fences) == 3:
            stop.set()

    await arun_as_leader(
        dsn, "scheduler", 5, work, stop=stop,
        on_new_leader=rec.new, on_started_leading=rec.started, on_stopped_leading=rec.stopped,
    )  # fmt: skip
    assert fences == sorted(set(fences)) and len(fences) == 3
    expected: list[tuple[str, int | None]] = []
    for fence in fences:
        # Each resignation is a change of leader too (nobody leads), told once the term
        # ended (contract 5.4: every change, none skipped).
        expected += [
            ("new", fence), ("started", fence), ("work", fence), ("stopped", fence), ("new", None)
        ]  # fmt: skip
    assert rec.calls == expected
    assert await acurrent_leader(dsn, "scheduler") is None  # stop resigned


async def test_work_that_raises_resigns_tells_and_re_raises(dsn: str) -> None:
    rec = Recorder()

    async def work(term: Held) -> None:
        rec.calls.append(("work", term.fence))
        raise RuntimeError("the scheduler crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        await arun_as_leader(
            dsn, "scheduler", 5, work,
            on_new_leader=rec.new, on_started_leading=rec.started, on_stopped_leading=rec.stopped,
        )  # fmt: skip
    assert rec.calls == [("new", 1), ("started", 1), ("work", 1), ("stopped", 1)]
    assert await acurrent_leader(dsn, "scheduler") is None


if True:  # ASYNC

    async def test_a_stolen_term_cancels_work_and_the_candidate_campaigns_again(
        dsn: str,
    ) -> None:
        rec = Recorder()
        stop = AEvent()
        cancelled: list[int] = []

        async def work(term: Held) -> None:
            rec.calls.append(("work", term.fence))
            if term.fence != 1:
                stop.set()
                return
            try:
                # The keeper may learn of the steal before this returns: cancelled then.
                await ato_thread(
                    pylease_cli, "steal", "scheduler", "--ttl", "1s", "--holder", "operator",
                    "--dsn", dsn,
                )  # fmt: skip
                await asleep(LIVE)
            except BaseException:
                cancelled.append(term.fence)
                raise

        await arun_as_leader(
            dsn, "scheduler", TERM_TTL, work, stop=stop, poll_interval=0.1,
            on_new_leader=rec.new, on_started_leading=rec.started, on_stopped_leading=rec.stopped,
        )  # fmt: skip
        assert cancelled == [1]
        assert rec.calls[:4] == [("new", 1), ("started", 1), ("work", 1), ("stopped", 1)]
        # Then the operator's term (fence 2) and the vacancy after its second ran out,
        # each seen if the candidate looked while it lasted (changes between two looks
        # may be coalesced), this candidate's next term, and its resignation.
        seen = rec.calls[4:-5]
        assert seen in ([], [("new", 2)], [("new", None)], [("new", 2), ("new", None)]), seen
        assert rec.calls[-5:-1] == [("new", 3), ("started", 3), ("work", 3), ("stopped", 3)]
        assert rec.calls[-1] == ("new", None)  # its resignation

    async def test_stop_cancels_work_and_resigns(dsn: str) -> None:
        rec = Recorder()
        stop = AEvent()
        cancelled: list[int] = []

        async def later() -> None:
            await asleep(0.1)
            stop.set()

        async def work(term: Held) -> None:
            rec.calls.append(("work", term.fence))
            astart_worker(later)
            try:
                await asleep(LIVE)
            except BaseException:
                cancelled.append(term.fence)
                raise

        await arun_as_leader(dsn, "scheduler", 5, work, stop=stop,
                             on_started_leading=rec.started,
                             on_stopped_leading=rec.stopped)  # fmt: skip
        assert cancelled == [1]
        assert rec.calls == [("started", 1), ("work", 1), ("stopped", 1)]
        assert await acurrent_leader(dsn, "scheduler") is None

else:  # sync: as is

    @pytest.mark.parametrize("ending", ["raises LeaseLost", "returns"])
    def test_a_stolen_term_ends_and_the_candidate_campaigns_again(dsn: str, ending: str) -> None:
        rec = Recorder()  # plain functions on this side
        stop = threading.Event()

        def work(term: Held) -> None:
            rec.calls.append(("work", term.fence))
            if term.fence == 1:
                stolen = pylease_cli(
                    "steal", "scheduler", "--ttl", "1s", "--holder", "operator", "--dsn", dsn
                )
                assert stolen.returncode == 0, stolen.stderr
                limit = time.monotonic() + LIVE
                while not term.lost:  # the keeper's next renewal learns it
                    assert time.monotonic() < limit, "the loss was not learnt"
                    time.sleep(0.01)
                if ending == "raises LeaseLost":
                    term.check()  # the term ended, not the program
            else:
                stop.set()

        run_as_leader(
            dsn, "scheduler", TERM_TTL, work, stop=stop, poll_interval=0.1,
            on_new_leader=rec.new, on_started_leading=rec.started, on_stopped_leading=rec.stopped,
        )  # fmt: skip
        assert rec.calls[:4] == [("new", 1), ("started", 1), ("work", 1), ("stopped", 1)]
        # Then the operator's term (fence 2: a steal is a change too, never skipped),
        # the vacancy after its second ran out if the candidate looked while it lasted
        # (an expiry sends nothing), and this candidate's next term, then its resignation.
        seen = rec.calls[4:-5]
        assert seen in ([("new", 2)], [("new", 2), ("new", None)]), seen
        assert rec.calls[-5:] == [
            ("new", 3), ("started", 3), ("work", 3), ("stopped", 3), ("new", None)
        ]  # fmt: skip

    def test_sigint_during_work_resigns_and_raises_keyboard_interrupt(dsn: str) -> None:
        def work(term: Held) -> None:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(LIVE)

        with pytest.raises(KeyboardInterrupt):
            run_as_leader(dsn, "scheduler", 5, work)
        assert current_leader(dsn, "scheduler") is None


async def test_run_as_leader_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'leases.sqlite3'}"
    stop = AEvent()
    fences: list[int] = []

    async def work(term: Held) -> None:
        fences.append(term.fence)
        if len(fences) == 2:
            stop.set()

    await arun_as_leader(url, "scheduler", 5, work, stop=stop)
    assert fences == [1, 2]
    assert await acurrent_leader(url, "scheduler") is None


async def test_stop_while_standing_by_ends_without_leading(dsn: str, aconn: AConn) -> None:
    await aconn.execute("SELECT lease_claim('scheduler', '1 min', 'elsewhere')")
    rec = Recorder()
    stop = AEvent()

    async def later() -> None:
        await asleep(0.1)
        stop.set()

    async def new(info: LeaseRow | None) -> None:
        await rec.new(info)
        # Stopped while it waits: after it saw another lead, however late that was.
        astart_worker(later)

    async def work(term: Held) -> None:
        pass

    await arun_as_leader(dsn, "scheduler", 5, work, stop=stop, on_new_leader=new,
                         on_started_leading=rec.started)  # fmt: skip
    assert rec.calls == [("new", 1)]


async def test_sigterm_resigns_then_reaches_the_previous_handler(dsn: str) -> None:
    assert threading.current_thread() is threading.main_thread()
    got: list[int] = []

    def previous(signum: int, _frame: object) -> None:
        got.append(signum)

    old = signal.signal(signal.SIGTERM, previous)
    try:
        rec = Recorder()

        async def work(term: Held) -> None:
            rec.calls.append(("work", term.fence))
            os.kill(os.getpid(), signal.SIGTERM)
            await asleep(LIVE)  # the shutdown ends this
            raise AssertionError("SIGTERM did not end the term")

        await arun_as_leader(dsn, "scheduler", 5, work, on_started_leading=rec.started,
                             on_stopped_leading=rec.stopped)  # fmt: skip
        assert rec.calls == [("started", 1), ("work", 1), ("stopped", 1)]
        assert got == [signal.SIGTERM]  # after the resignation, the old handler ran
        assert signal.getsignal(signal.SIGTERM) is previous
        assert await acurrent_leader(dsn, "scheduler") is None
    finally:
        signal.signal(signal.SIGTERM, old)


async def test_sigint_during_work_resigns_and_reaches_the_previous_handler(dsn: str) -> None:
    got: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, _frame: got.append(signum))
    try:

        async def work(term: Held) -> None:
            os.kill(os.getpid(), signal.SIGINT)
            await asleep(LIVE)

        await arun_as_leader(dsn, "scheduler", 5, work)
        assert got == [signal.SIGINT]
        assert await acurrent_leader(dsn, "scheduler") is None
    finally:
        signal.signal(signal.SIGINT, old)


# Processes campaigning ----------------------------------------------------------------


@pytest.mark.parametrize("candidates", [2, 3])
def test_processes_campaign_at_most_one_believes_it_leads(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path, candidates: int
) -> None:
    # A ttl that a loaded machine's handover by release cannot outlast (the rounds
    # that resign tell a handover by release from one by expiry).
    election = Election(dsn, "scheduler", 6.0, tmp_path, API)
    try:
        actions = list(campaign_rounds(conn, election, candidates, rounds=6))
    finally:
        election.stop()
    assert actions == ["resign", "sigterm", "sigkill"] * 2
    found = check_witness(election.witness)
    assert len(found) >= 6  # every round's leader believed it led before it was replaced


async def test_waiters_standbys_and_watchers_of_a_process_share_one_listener(
    dsn: str, aconn: AConn
) -> None:
    # A lease waiter, two leader standbys and a watcher of the leader, in one process:
    # one LISTEN connection for all of them, and each is still woken by its release.
    from pylease import alease

    await aconn.execute("SELECT lease_claim('job', '1 min', 'other')")
    await aconn.execute("SELECT lease_claim('scheduler', '1 min', 'other')")
    got: list[str] = []

    def watchers() -> int:
        return sum(len(w) for h in hub._hubs().values() for w in h.watchers.values())

    async def waiter() -> None:
        async with alease(dsn, "job", ttl=60, wait=LIVE):
            got.append("job")

    async def standby() -> None:
        async with aleader(dsn, "scheduler", ttl=60, wait=LIVE):
            got.append("scheduler")
            # A term the watcher cannot miss.
            assert await asleep_until(lambda: "watched" in got, LIVE)

    async def watcher() -> None:
        async for info in awatch_leader(dsn, "scheduler"):
            if info is not None and info.holder != "other":
                got.append("watched")
                return

    workers = [astart_worker(w) for w in (waiter, standby, standby, watcher)]
    try:
        # The standbys wait through the wait engine, as lease waiters do; the watcher of
        # the leader is a watcher of the hub.
        assert await asleep_until(
            lambda: hub.waiters("job") == 1 and hub.waiters("scheduler") == 2, LIVE
        )
        assert await asleep_until(lambda: watchers() == 1, LIVE)
        assert await listeners(aconn) == 1
        await aconn.execute("SELECT lease_release('job', 'other')")
        await aconn.execute("SELECT lease_release('scheduler', 'other')")
    finally:
        await ajoin_workers(workers, LIVE)
    assert sorted(got) == ["job", "scheduler", "scheduler", "watched"]
