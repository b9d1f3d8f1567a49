"""Leader election, sync: ``leader``, ``run_as_leader``, ``current_leader``, ``watch_leader``.

Real PostgreSQL (and SQLite where the waiting differs); no timing assertions: the
order of events on one monotonic clock, and liveness bounds of tens of seconds.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pylease import Held, LeaseBusy, LeaseLost, current_leader, leader, run_as_leader, watch_leader
from pylease._operations import LeaseRow
from tests.support.leader_witness import Election, campaign_rounds, check_witness

LIVE = 30.0  # seconds: a liveness bound, never a speed


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


def wait_until(predicate: Callable[[], object], timeout: float = LIVE) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not within the liveness bound"
        time.sleep(0.01)


def listeners(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pylease-listen'"
        " AND datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


def run_out(conn: psycopg.Connection[Any], name: str) -> None:
    """End the term of ``name`` by its expiry now, as a crashed leader's would end.

    No release, hence no NOTIFY: only the expiry tells. A test that needs the row seen
    held first claims it for a minute and runs it out here, instead of racing a short
    ttl against how fast a loaded machine reads it.
    """
    conn.execute(
        "UPDATE pylease_leases SET expires_at = clock_timestamp() WHERE name = %s", (name,)
    )


@contextlib.contextmanager
def in_thread(target: Callable[[], object]) -> Iterator[threading.Thread]:
    """Run ``target`` in a thread; join it on leaving, and raise what it raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield t
    finally:
        t.join(LIVE)
    assert not t.is_alive(), "thread did not end"
    if errors:
        raise errors[0]


# leader() ----------------------------------------------------------------------


def test_leaving_the_block_hands_over_to_the_waiting_standby(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    events: list[tuple[str, int]] = []
    first_cm = leader(dsn, "scheduler", ttl=30)
    first = first_cm.__enter__()
    assert isinstance(first, Held) and not first.lost

    def standby() -> None:
        with leader(dsn, "scheduler", ttl=30) as second:
            events.append(("second leads", second.fence))
            row = current_leader(dsn, "scheduler")
            assert row is not None and row.holder == second.holder

    with in_thread(standby):
        wait_until(lambda: listeners(conn) == 1)  # the standby waits on a NOTIFY
        events.append(("first resigns", first.fence))
        first_cm.__exit__(None, None, None)
    assert [e[0] for e in events] == ["first resigns", "second leads"]
    assert events[1][1] > events[0][1]
    # The handover came from the release, long before the 30 s ttl could run out.
    assert current_leader(dsn, "scheduler") is None


def test_wait_runs_out_as_lease_busy(dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT lease_claim('scheduler', '1 min', 'elsewhere')")
    # A Connection target: the campaign reads the row on it, renewals go elsewhere.
    with pytest.raises(LeaseBusy) as caught, leader(conn, "scheduler", ttl=5, wait=0.2):
        raise AssertionError("elected while another leads")
    assert caught.value.holder == "elsewhere"


def test_a_dead_leaders_term_runs_out_then_the_standby_leads(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("SELECT lease_claim('scheduler', '300 ms', 'crashed')")
    with leader(dsn, "scheduler", ttl=5) as term:
        row = current_leader(conn, "scheduler")
        assert row is not None and (row.holder, row.fence) == (term.holder, term.fence)
    assert term.fence == 2


def test_a_block_that_raises_resigns_and_the_error_stands(dsn: str) -> None:
    with pytest.raises(ZeroDivisionError), leader(dsn, "scheduler", ttl=5):
        1 / 0  # noqa: B018
    assert current_leader(dsn, "scheduler") is None


def test_leader_checks_its_arguments_before_any_sql() -> None:
    with pytest.raises(ValueError, match="ttl"):
        leader("postgresql://nowhere.invalid/x", "s", ttl=0)
    with pytest.raises(ValueError, match="name"):
        leader("postgresql://nowhere.invalid/x", "", ttl=5)
    with pytest.raises(ValueError, match="wait"):
        leader("postgresql://nowhere.invalid/x", "s", ttl=5, wait=-1)
    with pytest.raises(ValueError, match="wait"):
        leader("postgresql://nowhere.invalid/x", "s", ttl=5, wait="soon")
    for forever in (None, math.inf, "forever", timedelta.max, "30s"):
        leader("postgresql://nowhere.invalid/x", "s", ttl=5, wait=forever)  # no I/O yet
    with pytest.raises(ValueError, match="work"):
        run_as_leader("postgresql://nowhere.invalid/x", "s", 5, "not callable")  # type: ignore[arg-type]


def test_on_sqlite_the_standby_polls_and_leads(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'leases.sqlite3'}"
    order: list[str] = []
    first_cm = leader(url, "scheduler", ttl=30)
    first = first_cm.__enter__()

    def standby() -> None:
        with leader(url, "scheduler", ttl=30) as second:
            order.append(f"second {second.fence}")

    with in_thread(standby):
        time.sleep(0.2)  # let it start waiting; the order holds either way
        order.append(f"first {first.fence}")
        first_cm.__exit__(None, None, None)
    assert order == ["first 1", "second 2"]


# current_leader() ----------------------------------------------------------------


def test_current_leader_is_the_held_row_only(dsn: str, conn: psycopg.Connection[Any]) -> None:
    assert current_leader(dsn, "scheduler") is None
    conn.execute("SELECT lease_claim('scheduler', '1 min', 'someone')")
    row = current_leader(conn, "scheduler")
    assert isinstance(row, LeaseRow) and row.holder == "someone" and row.fence == 1
    run_out(conn, "scheduler")
    assert current_leader(conn, "scheduler") is None  # expired: nobody leads
    conn.execute("SELECT lease_claim('scheduler', '1 min', 'next')")
    conn.execute("SELECT lease_release('scheduler', 'next')")
    assert current_leader(conn, "scheduler") is None  # released: nobody leads
    conn.execute("SELECT lease_claim('scheduler', '1 min', 'rests')")
    conn.execute("SELECT lease_release('scheduler', 'rests', '1 hour')")
    assert current_leader(conn, "scheduler") is None  # resting (min_hold): nobody leads


# watch_leader() -------------------------------------------------------------------


def test_watch_sees_every_change_in_order_including_a_grant_from_psql(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    seen: list[tuple[str, int] | None] = []
    changed = threading.Condition()

    def watch() -> None:
        for info in watch_leader(dsn, "scheduler", poll_interval=0.2):
            with changed:
                seen.append(None if info is None else (info.holder, info.fence))
                changed.notify_all()
            if info is not None and info.holder == "operator":
                return

    def until(count: int) -> None:
        with changed:
            assert changed.wait_for(lambda: len(seen) >= count, LIVE), seen

    with in_thread(watch):
        until(1)
        psql(dsn, "SELECT lease_claim('scheduler', '1 min', 'psql-user')")  # no NOTIFY
        until(2)
        psql(dsn, "SELECT lease_release('scheduler', 'psql-user')")  # NOTIFY
        until(3)
        lost_block = pytest.raises(LeaseLost)  # the block returns after its term was stolen
        with lost_block, leader(dsn, "scheduler", ttl=3, holder="python") as term:
            until(4)
            stolen = pylease_cli(
                "steal", "scheduler", "--ttl", "1m", "--holder", "operator", "--dsn", dsn
            )
            assert stolen.returncode == 0, stolen.stderr
            wait_until(lambda: term.lost)
    assert seen == [
        None,
        ("psql-user", 1),
        None,
        ("python", 2),
        ("operator", 3),
    ]


def test_watch_sees_an_expiry_as_nobody_leading(dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT lease_claim('scheduler', '1 min', 'gone')")
    watch = watch_leader(conn, "scheduler")
    try:
        first = next(watch)
        assert first is not None and first.holder == "gone"
        run_out(conn, "scheduler")  # the watcher reads the row again within its 1 s poll
        assert next(watch) is None
    finally:
        watch.close()


def test_watching_a_leader_that_renews_reads_its_row_about_once_a_poll(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pylease import leadership

    reads: list[float] = []
    read = leadership.Watch.read

    def counted(self: leadership.Watch) -> LeaseRow | None:
        reads.append(time.monotonic())
        return read(self)

    monkeypatch.setattr(leadership.Watch, "read", counted)
    seen: list[LeaseRow | None] = []

    def watch() -> None:
        for info in watch_leader(dsn, "scheduler"):  # the default 1 s poll
            seen.append(info)
            if info is None:
                return

    watcher = threading.Thread(target=watch, daemon=True)
    with leader(dsn, "scheduler", ttl=1, holder="healthy") as term:
        watcher.start()
        wait_until(lambda: len(seen) == 1)
        start = time.monotonic()
        time.sleep(3.0)  # three times the ttl: the first row seen expired long ago
        term.check()
        during = [t for t in reads if t >= start]
    # Leaving the block released the term: the watcher sees nobody and ends.
    watcher.join(LIVE)
    assert not watcher.is_alive()
    # A read per poll and per expiry it knows: a handful, not one per 10 ms backoff.
    assert len(during) <= 12, len(during)
    assert seen[0] is not None and seen[0].holder == "healthy" and seen[-1] is None


# run_as_leader() -------------------------------------------------------------------


class Recorder:
    """Every callback and work call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int | None]] = []

    def new(self, info: LeaseRow | None) -> None:
        self.calls.append(("new", None if info is None else info.fence))

    def started(self, term: Held) -> None:
        self.calls.append(("started", term.fence))

    def stopped(self, term: Held) -> None:
        self.calls.append(("stopped", term.fence))


def test_work_that_returns_ends_its_term_and_the_next_term_is_larger(dsn: str) -> None:
    rec = Recorder()
    stop = threading.Event()
    fences: list[int] = []

    def work(term: Held) -> None:
        rec.calls.append(("work", term.fence))
        fences.append(term.fence)
        row = current_leader(dsn, "scheduler")
        assert row is not None and row.fence == term.fence
        if len(fences) == 3:
            stop.set()

    run_as_leader(
        dsn, "scheduler", 5, work, stop=stop,
        on_new_leader=rec.new, on_started_leading=rec.started, on_stopped_leading=rec.stopped,
    )  # fmt: skip
    assert fences == sorted(set(fences)) and len(fences) == 3
    expected: list[tuple[str, int | None]] = []
    for fence in fences:
        expected += [("new", fence), ("started", fence), ("work", fence), ("stopped", fence)]
    assert rec.calls == expected
    assert current_leader(dsn, "scheduler") is None  # stop resigned


def test_work_that_raises_resigns_tells_and_re_raises(dsn: str) -> None:
    rec = Recorder()

    def work(term: Held) -> None:
        rec.calls.append(("work", term.fence))
        raise RuntimeError("the scheduler crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        run_as_leader(
            dsn, "scheduler", 5, work,
            on_new_leader=rec.new, on_started_leading=rec.started, on_stopped_leading=rec.stopped,
        )  # fmt: skip
    assert rec.calls == [("new", 1), ("started", 1), ("work", 1), ("stopped", 1)]
    assert current_leader(dsn, "scheduler") is None


@pytest.mark.parametrize("ending", ["raises LeaseLost", "returns"])
def test_a_stolen_term_ends_and_the_candidate_campaigns_again(
    dsn: str, conn: psycopg.Connection[Any], ending: str
) -> None:
    rec = Recorder()
    stop = threading.Event()

    def work(term: Held) -> None:
        rec.calls.append(("work", term.fence))
        if term.fence == 1:
            stolen = pylease_cli(
                "steal", "scheduler", "--ttl", "1s", "--holder", "operator", "--dsn", dsn
            )
            assert stolen.returncode == 0, stolen.stderr
            wait_until(lambda: term.lost)  # the keeper's next renewal learns it
            if ending == "raises LeaseLost":
                term.check()  # the term ended, not the program
        else:
            stop.set()

    run_as_leader(
        dsn, "scheduler", 1.5, work, stop=stop, poll_interval=0.1,
        on_new_leader=rec.new, on_started_leading=rec.started, on_stopped_leading=rec.stopped,
    )  # fmt: skip
    assert rec.calls[:4] == [("new", 1), ("started", 1), ("work", 1), ("stopped", 1)]
    # Then the operator's term (fence 2) and the vacancy after its second ran out, each
    # seen if the candidate looked while it lasted (changes between two looks may be
    # coalesced), and this candidate's next term.
    seen = rec.calls[4:-4]
    assert seen in ([], [("new", 2)], [("new", None)], [("new", 2), ("new", None)]), seen
    assert rec.calls[-4:] == [("new", 3), ("started", 3), ("work", 3), ("stopped", 3)]


def test_run_as_leader_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'leases.sqlite3'}"
    stop = threading.Event()
    fences: list[int] = []

    def work(term: Held) -> None:
        fences.append(term.fence)
        if len(fences) == 2:
            stop.set()

    run_as_leader(url, "scheduler", 5, work, stop=stop)
    assert fences == [1, 2]
    assert current_leader(url, "scheduler") is None


def test_stop_while_standing_by_ends_without_leading(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("SELECT lease_claim('scheduler', '1 min', 'elsewhere')")
    rec = Recorder()
    stop = threading.Event()

    def new(info: LeaseRow | None) -> None:
        rec.new(info)
        # Stopped while it waits: after it saw another lead, however late that was.
        threading.Timer(0.1, stop.set).start()

    run_as_leader(dsn, "scheduler", 5, lambda term: None, stop=stop, on_new_leader=new,
                  on_started_leading=rec.started)  # fmt: skip
    assert rec.calls == [("new", 1)]


def test_sigterm_resigns_then_reaches_the_previous_handler(dsn: str) -> None:
    assert threading.current_thread() is threading.main_thread()
    got: list[int] = []

    def previous(signum: int, _frame: object) -> None:
        got.append(signum)

    old = signal.signal(signal.SIGTERM, previous)
    try:
        rec = Recorder()

        def work(term: Held) -> None:
            rec.calls.append(("work", term.fence))
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(LIVE)  # the handler interrupts this
            raise AssertionError("SIGTERM did not end the term")

        run_as_leader(dsn, "scheduler", 5, work, on_started_leading=rec.started,
                      on_stopped_leading=rec.stopped)  # fmt: skip
        assert rec.calls == [("started", 1), ("work", 1), ("stopped", 1)]
        assert got == [signal.SIGTERM]  # after the resignation, the old handler ran
        assert signal.getsignal(signal.SIGTERM) is previous
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert current_leader(dsn, "scheduler") is None
    finally:
        signal.signal(signal.SIGTERM, old)


def test_sigint_during_work_resigns_and_raises_keyboard_interrupt(dsn: str) -> None:
    def work(term: Held) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(LIVE)

    with pytest.raises(KeyboardInterrupt):
        run_as_leader(dsn, "scheduler", 5, work)
    assert current_leader(dsn, "scheduler") is None


# Processes campaigning ----------------------------------------------------------------


@pytest.mark.parametrize("candidates", [2, 3])
def test_processes_campaign_at_most_one_believes_it_leads(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path, candidates: int
) -> None:
    election = Election(dsn, "scheduler", 2.0, tmp_path, "sync")
    try:
        actions = list(campaign_rounds(conn, election, candidates, rounds=6))
    finally:
        election.stop()
    assert actions == ["resign", "sigterm", "sigkill"] * 2
    found = check_witness(election.witness)
    assert len(found) >= 6  # every round's leader believed it led before it was replaced


def test_waiters_standbys_and_watchers_of_a_process_share_one_listener(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    # A lease waiter, two leader standbys and a watcher of the leader, in one process:
    # one LISTEN connection for all of them, and each is still woken by its release.
    from pylease import _hub, lease

    conn.execute("SELECT lease_claim('job', '1 min', 'other')")
    conn.execute("SELECT lease_claim('scheduler', '1 min', 'other')")
    got: list[str] = []

    def watchers() -> int:
        return sum(len(w) for hub in _hub._registry.values() for w in hub.watchers.values())

    def waiter() -> None:
        with lease(dsn, "job", ttl=60, wait=LIVE):
            got.append("job")

    def standby() -> None:
        with leader(dsn, "scheduler", ttl=60, wait=LIVE):
            got.append("scheduler")
            wait_until(lambda: "watched" in got)  # a term the watcher cannot miss

    def watcher() -> None:
        for info in watch_leader(dsn, "scheduler"):
            if info is not None and info.holder != "other":
                got.append("watched")
                return

    with in_thread(waiter), in_thread(standby), in_thread(standby), in_thread(watcher):
        # The standbys wait through the wait engine, as lease waiters do; the watcher of
        # the leader is a watcher of the hub.
        wait_until(lambda: _hub.waiters("job") == 1 and _hub.waiters("scheduler") == 2)
        wait_until(lambda: watchers() == 1)
        assert listeners(conn) == 1
        conn.execute("SELECT lease_release('job', 'other')")
        conn.execute("SELECT lease_release('scheduler', 'other')")
        wait_until(lambda: got.count("scheduler") == 2 and "job" in got and "watched" in got)
    assert sorted(got) == ["job", "scheduler", "scheduler", "watched"]
