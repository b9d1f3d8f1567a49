"""The async twins of test_leader.py: ``aleader``, ``arun_as_leader``, ``awatch_leader``."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
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
)
from pylease._operations import LeaseRow
from tests.leader.test_leader import LIVE, listeners, psql, pylease_cli
from tests.support.leader_witness import Election, campaign_rounds, check_witness

AConn = psycopg.AsyncConnection[Any]


async def until(predicate: Any, timeout: float = LIVE) -> None:
    async def loop() -> None:
        while not predicate():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(loop(), timeout)


# aleader() -------------------------------------------------------------------------


async def test_leaving_the_block_hands_over_to_the_waiting_standby(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    events: list[tuple[str, int]] = []
    first_cm = aleader(dsn, "scheduler", ttl=30)
    first = await first_cm.__aenter__()

    async def standby() -> None:
        async with aleader(dsn, "scheduler", ttl=30) as second:
            events.append(("second leads", second.fence))
            row = await acurrent_leader(dsn, "scheduler")
            assert row is not None and row.holder == second.holder

    task = asyncio.create_task(standby())
    await until(lambda: listeners(conn) == 1)
    events.append(("first resigns", first.fence))
    await first_cm.__aexit__(None, None, None)
    await asyncio.wait_for(task, LIVE)
    assert [e[0] for e in events] == ["first resigns", "second leads"]
    assert events[1][1] > events[0][1]
    assert await acurrent_leader(dsn, "scheduler") is None


async def test_wait_runs_out_as_lease_busy(dsn: str, aconn: AConn) -> None:
    await aconn.execute("SELECT lease_claim('scheduler', '1 min', 'elsewhere')")
    with pytest.raises(LeaseBusy) as caught:
        async with aleader(aconn, "scheduler", ttl=5, wait=0.2):
            raise AssertionError("elected while another leads")
    assert caught.value.holder == "elsewhere"


async def test_a_lost_term_cancels_the_block(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(LeaseLost):
        async with aleader(dsn, "scheduler", ttl=1.5) as term:
            conn.execute("SELECT lease_steal('scheduler', '1 min', 'operator')")
            await asyncio.sleep(LIVE)  # cancelled when the keeper learns of the steal
    assert term.lost


async def test_on_sqlite_the_standby_polls_and_leads(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'leases.sqlite3'}"
    order: list[str] = []
    first_cm = aleader(url, "scheduler", ttl=30)
    first = await first_cm.__aenter__()

    async def standby() -> None:
        async with aleader(url, "scheduler", ttl=30) as second:
            order.append(f"second {second.fence}")

    task = asyncio.create_task(standby())
    await asyncio.sleep(0.2)
    order.append(f"first {first.fence}")
    await first_cm.__aexit__(None, None, None)
    await asyncio.wait_for(task, LIVE)
    assert order == ["first 1", "second 2"]


# acurrent_leader() and awatch_leader() -------------------------------------------------


async def test_current_leader_is_the_held_row_only(dsn: str, aconn: AConn) -> None:
    assert await acurrent_leader(dsn, "scheduler") is None
    await aconn.execute("SELECT lease_claim('scheduler', '1 min', 'someone')")
    row = await acurrent_leader(aconn, "scheduler")
    assert isinstance(row, LeaseRow) and (row.holder, row.fence) == ("someone", 1)
    await aconn.execute("SELECT lease_release('scheduler', 'someone')")
    assert await acurrent_leader(aconn, "scheduler") is None


async def test_watch_sees_every_change_in_order_including_a_grant_from_psql(dsn: str) -> None:
    seen: list[tuple[str, int] | None] = []

    async def watch() -> None:
        async for info in awatch_leader(dsn, "scheduler", poll_interval=0.2):
            seen.append(None if info is None else (info.holder, info.fence))
            if info is not None and info.holder == "operator":
                return

    task = asyncio.create_task(watch())
    await until(lambda: len(seen) >= 1)
    await asyncio.to_thread(psql, dsn, "SELECT lease_claim('scheduler', '1 min', 'psql-user')")
    await until(lambda: len(seen) >= 2)
    await asyncio.to_thread(psql, dsn, "SELECT lease_release('scheduler', 'psql-user')")
    await until(lambda: len(seen) >= 3)
    with pytest.raises(LeaseLost):
        async with aleader(dsn, "scheduler", ttl=3, holder="python"):
            await until(lambda: len(seen) >= 4)
            stolen = await asyncio.to_thread(
                pylease_cli, "steal", "scheduler", "--ttl", "1m", "--holder", "operator",
                "--dsn", dsn,
            )  # fmt: skip
            assert stolen.returncode == 0, stolen.stderr
            await asyncio.sleep(LIVE)  # the lost term cancels this
    await asyncio.wait_for(task, LIVE)
    assert seen == [None, ("psql-user", 1), None, ("python", 2), ("operator", 3)]


# arun_as_leader() -------------------------------------------------------------------


class Recorder:
    """Every callback and work call, in order; the callbacks are coroutine functions."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int | None]] = []

    async def new(self, info: LeaseRow | None) -> None:
        self.calls.append(("new", None if info is None else info.fence))

    async def started(self, term: Held) -> None:
        self.calls.append(("started", term.fence))

    def stopped(self, term: Held) -> None:  # a plain function is fine too
        self.calls.append(("stopped", term.fence))


async def test_work_that_returns_ends_its_term_and_the_next_term_is_larger(dsn: str) -> None:
    rec = Recorder()
    stop = asyncio.Event()
    fences: list[int] = []

    async def work(term: Held) -> None:
        rec.calls.append(("work", term.fence))
        fences.append(term.fence)
        if len(fences) == 3:
            stop.set()

    await arun_as_leader(
        dsn, "scheduler", 5, work, stop=stop,
        on_new_leader=rec.new, on_started_leading=rec.started, on_stopped_leading=rec.stopped,
    )  # fmt: skip
    assert fences == sorted(set(fences)) and len(fences) == 3
    expected: list[tuple[str, int | None]] = []
    for fence in fences:
        expected += [("new", fence), ("started", fence), ("work", fence), ("stopped", fence)]
    assert rec.calls == expected
    assert await acurrent_leader(dsn, "scheduler") is None


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


async def test_a_stolen_term_cancels_work_and_the_candidate_campaigns_again(dsn: str) -> None:
    rec = Recorder()
    stop = asyncio.Event()
    cancelled: list[int] = []

    async def work(term: Held) -> None:
        rec.calls.append(("work", term.fence))
        if term.fence != 1:
            stop.set()
            return
        try:
            # The keeper may learn of the steal before this await returns: cancelled then.
            await asyncio.to_thread(
                pylease_cli, "steal", "scheduler", "--ttl", "1s", "--holder", "operator",
                "--dsn", dsn,
            )  # fmt: skip
            await asyncio.sleep(LIVE)
        except asyncio.CancelledError:
            cancelled.append(term.fence)
            raise

    await arun_as_leader(
        dsn, "scheduler", 1.5, work, stop=stop, poll_interval=0.1,
        on_new_leader=rec.new, on_started_leading=rec.started, on_stopped_leading=rec.stopped,
    )  # fmt: skip
    assert cancelled == [1]
    assert rec.calls[:5] == [("new", 1), ("started", 1), ("work", 1), ("stopped", 1), ("new", 2)]
    assert [c for c in rec.calls[5:] if c != ("new", None)] == [
        ("new", 3), ("started", 3), ("work", 3), ("stopped", 3)
    ]  # fmt: skip


async def test_stop_cancels_work_and_resigns(dsn: str) -> None:
    rec = Recorder()
    stop = asyncio.Event()
    cancelled: list[int] = []

    async def work(term: Held) -> None:
        rec.calls.append(("work", term.fence))
        asyncio.get_running_loop().call_later(0.1, stop.set)
        try:
            await asyncio.sleep(LIVE)
        except asyncio.CancelledError:
            cancelled.append(term.fence)
            raise

    await arun_as_leader(dsn, "scheduler", 5, work, stop=stop, on_started_leading=rec.started,
                         on_stopped_leading=rec.stopped)  # fmt: skip
    assert cancelled == [1]
    assert rec.calls == [("started", 1), ("work", 1), ("stopped", 1)]
    assert await acurrent_leader(dsn, "scheduler") is None


async def test_run_as_leader_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'leases.sqlite3'}"
    stop = asyncio.Event()
    fences: list[int] = []

    async def work(term: Held) -> None:
        fences.append(term.fence)
        if len(fences) == 2:
            stop.set()

    await arun_as_leader(url, "scheduler", 5, work, stop=stop)
    assert fences == [1, 2]
    assert await acurrent_leader(url, "scheduler") is None


async def test_sigint_during_work_resigns_and_reaches_the_previous_handler(dsn: str) -> None:
    got: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, _frame: got.append(signum))
    try:

        async def work(term: Held) -> None:
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(LIVE)

        await arun_as_leader(dsn, "scheduler", 5, work)
        assert got == [signal.SIGINT]
        assert await acurrent_leader(dsn, "scheduler") is None
    finally:
        signal.signal(signal.SIGINT, old)


async def test_stop_while_standing_by_ends_without_leading(dsn: str, aconn: AConn) -> None:
    await aconn.execute("SELECT lease_claim('scheduler', '1 min', 'elsewhere')")
    rec = Recorder()
    stop = asyncio.Event()

    async def new(info: LeaseRow | None) -> None:
        await rec.new(info)
        # Stopped while it waits: after it saw another lead, however late that was.
        asyncio.get_running_loop().call_later(0.1, stop.set)

    await arun_as_leader(dsn, "scheduler", 5, lambda term: asyncio.sleep(0), stop=stop,
                         on_new_leader=new, on_started_leading=rec.started)  # fmt: skip
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
            await asyncio.sleep(LIVE)  # cancelled by the shutdown
            raise AssertionError("SIGTERM did not end the term")

        await arun_as_leader(dsn, "scheduler", 5, work, on_started_leading=rec.started,
                             on_stopped_leading=rec.stopped)  # fmt: skip
        assert rec.calls == [("started", 1), ("work", 1), ("stopped", 1)]
        assert got == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is previous
        assert await acurrent_leader(dsn, "scheduler") is None
    finally:
        signal.signal(signal.SIGTERM, old)


# Processes campaigning ----------------------------------------------------------------


def test_async_processes_campaign_at_most_one_believes_it_leads(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    election = Election(dsn, "scheduler", 2.0, tmp_path, "async")
    try:
        actions = list(campaign_rounds(conn, election, 3, rounds=6))
    finally:
        election.stop()
    assert actions == ["resign", "sigterm", "sigkill"] * 2
    assert len(check_witness(election.witness)) >= 6
