"""Data on a lease and leaders that step down when asked, through the Python API
(contract 5.4), on PostgreSQL and SQLite: ``data=``, ``held.set_data``,
``LeaseBusy.data``, ``on_release_requested`` and ``held.release_requested``, and the
leader's side of it (``leader(data=...)``, ``run_as_leader`` stepping down).

The other party acts through a backend on a connection of its own. Bounds are
liveness bounds of a loaded machine, never speeds.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from pylease import (
    InvalidArgument,
    LeaseBusy,
    LeaseLost,
    SchemaMissing,
    alease,
    current_leader,
    exclusive,
    leader,
    lease,
    run_as_leader,
)
from pylease._held import Held
from tests.support.safety_kit import Db

NAME = "scheduler"
ADDRESS = {"address": "10.0.0.7:8080", "version": "2.4.1"}
BOUND = 30.0


def wait_until(predicate: Any, what: str) -> None:
    limit = time.monotonic() + BOUND
    while not predicate():
        assert time.monotonic() < limit, f"{what}: not within {BOUND}s"
        time.sleep(0.01)


def test_a_lease_publishes_data_and_set_data_replaces_it(db: Db) -> None:
    other = db.backend()
    with lease(db.url, NAME, ttl=30, data=ADDRESS) as held:
        [row] = other.status(NAME)
        assert (row.holder, row.data) == (held.holder, ADDRESS)
        held.set_data({"version": "2.5"})
        assert other.status(NAME)[0].data == {"version": "2.5"}
    # The next tenure starts without it.
    with lease(db.url, NAME, ttl=30):
        assert other.status(NAME)[0].data is None


def test_a_busy_claimer_reads_what_the_holder_published(db: Db) -> None:
    other = db.backend()
    assert other.claim(NAME, _ttl(30), "elsewhere", ADDRESS) == 1
    with pytest.raises(LeaseBusy) as busy, lease(db.url, NAME, ttl=30):
        pass
    assert (busy.value.holder, busy.value.data) == ("elsewhere", ADDRESS)
    with pytest.raises(LeaseBusy) as waited, lease(db.url, NAME, ttl=30, wait=0.2):
        pass
    assert (waited.value.holder, waited.value.data) == ("elsewhere", ADDRESS)
    again = pickle.loads(pickle.dumps(busy.value))
    assert (again.data, again.holder, str(again)) == (ADDRESS, "elsewhere", str(busy.value))


def test_bad_data_is_refused_before_any_sql(db: Db) -> None:
    with pytest.raises(InvalidArgument) as bad:
        lease(db.url, NAME, ttl=30, data={"x": object()})
    assert bad.value.parameter == "data"
    with pytest.raises(InvalidArgument) as big:
        lease(db.url, NAME, ttl=30, data="x" * 8191)
    assert big.value.parameter == "data"
    with pytest.raises(InvalidArgument) as shared:
        lease(db.url, NAME, ttl=30, shared=True, data=ADDRESS)
    assert shared.value.parameter == "data"
    with lease(db.url, NAME, ttl=30) as held, pytest.raises(InvalidArgument):
        held.set_data("x" * 8191)
    assert db.backend().status(NAME)[0].data is None


def test_set_data_of_a_lost_lease_raises_lease_lost(db: Db) -> None:
    other = db.backend()
    with pytest.raises(LeaseLost), lease(db.url, NAME, ttl=30) as held:
        assert other.steal(NAME, _ttl(30), "operator") == 2
        with pytest.raises(LeaseLost):
            held.set_data(ADDRESS)
    assert other.status(NAME)[0].data is None


def _ttl(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def test_a_request_reaches_the_holder_through_its_renewal(db: Db) -> None:
    other = db.backend()
    told: list[Held] = []
    with lease(db.url, NAME, ttl=1.5, on_release_requested=told.append) as held:
        assert not held.release_requested and held.release_requested_by is None
        assert other.request_release(NAME, "deploy-42")
        wait_until(lambda: held.release_requested, "the request was not learnt")
        assert held.release_requested_by == "deploy-42"
        wait_until(lambda: told, "on_release_requested was not called")
        assert told == [held]
        held.check()  # asked, not lost: the holder decides when to leave
    [row] = other.status(NAME)
    assert (row.state, row.release_requested_by) == ("released", None)


def test_a_failing_on_release_requested_is_logged_and_the_lease_goes_on(
    db: Db, caplog: pytest.LogCaptureFixture
) -> None:
    other = db.backend()

    def fail(held: Held) -> None:
        raise RuntimeError("the callback broke")

    with lease(db.url, NAME, ttl=1.5, on_release_requested=fail) as held:
        assert other.request_release(NAME, "ops")
        wait_until(
            lambda: "on_release_requested callback" in caplog.text, "the failure was not logged"
        )
        assert held.release_requested and not held.lost


def test_an_async_lease_is_told_with_a_coroutine(db: Db) -> None:
    async def main() -> list[str]:
        other = db.backend()
        told: list[str] = []

        async def on_request(held: Any) -> None:
            told.append(held.release_requested_by)

        async with alease(db.url, NAME, ttl=1.5, on_release_requested=on_request, data=1) as held:
            assert other.status(NAME)[0].data == 1
            await held.set_data(2)
            assert other.status(NAME)[0].data == 2
            assert other.request_release(NAME, "ops")
            limit = time.monotonic() + BOUND
            while not told:
                assert time.monotonic() < limit
                await asyncio.sleep(0.01)
            assert held.release_requested
        return told

    assert asyncio.run(main()) == ["ops"]


def test_exclusive_publishes_data_with_each_call(db: Db) -> None:
    other = db.backend()
    seen: list[Any] = []

    @exclusive(db.url, "report-{day}", ttl=30, data={"job": "report"})
    def report(day: str) -> str:
        seen.append(other.status(f"report-{day}")[0].data)
        return day

    assert report("monday") == "monday"
    assert seen == [{"job": "report"}]


# Leaders ----------------------------------------------------------------------------


def test_a_leader_publishes_where_it_listens(db: Db) -> None:
    with leader(db.url, NAME, ttl=30, data=ADDRESS) as term:
        row = current_leader(db.url, NAME)
        assert row is not None and (row.holder, row.fence, row.data) == (
            term.holder,
            term.fence,
            ADDRESS,
        )
    assert current_leader(db.url, NAME) is None


def test_a_leader_asked_to_step_down_hands_over_to_the_standby_waiting(db: Db) -> None:
    other = db.backend()
    terms: list[tuple[str, int]] = []
    stop = threading.Event()
    first_asked = threading.Event()

    def work(term: Held) -> None:
        terms.append(("a", term.fence))
        if len(terms) > 1:
            stop.set()
            return
        wait_until(lambda: term.release_requested, "the request was not learnt")
        first_asked.set()

    def standby() -> None:
        with leader(db.url, NAME, ttl=1.5, data={"who": "b"}) as term:
            terms.append(("b", term.fence))
            wait_until(lambda: len(terms) > 1, "never")

    campaigner = threading.Thread(
        target=run_as_leader,
        args=(db.url, NAME, 1.5, work),
        kwargs={"stop": stop, "data": {"who": "a"}},
    )
    campaigner.start()
    wait_until(lambda: terms == [("a", 1)], "a did not lead first")
    waiting = threading.Thread(target=standby)
    waiting.start()
    time.sleep(0.3)  # b is waiting by now, or soon: either way it is before a's request
    assert other.request_release(NAME, "deploy")
    waiting.join(BOUND)
    campaigner.join(BOUND)
    assert not waiting.is_alive() and not campaigner.is_alive()
    assert first_asked.is_set()
    # b took over when a stepped down, and a led again only after b, with a new fence.
    assert terms == [("a", 1), ("b", 2), ("a", 3)]


def test_a_leader_asked_to_step_down_with_nobody_waiting_leads_again(db: Db) -> None:
    other = db.backend()
    fences: list[int] = []
    stop = threading.Event()

    def work(term: Held) -> None:
        fences.append(term.fence)
        if len(fences) == 1:
            assert other.request_release(NAME, "ops")
            wait_until(lambda: term.release_requested, "the request was not learnt")
            return
        assert not term.release_requested  # a new tenure, no request
        stop.set()

    run_as_leader(db.url, NAME, 1.5, work, stop=stop)
    assert fences == [1, 2]


# Watchers that miss nothing (PostgreSQL: LISTEN) ------------------------------------


def test_watch_leader_sees_every_change_in_order_none_skipped(dsn: str) -> None:
    """A hundred steals in quick succession, a takeover after a crash and a resignation:
    each one yielded, in order, whatever the watcher read in between."""
    import psycopg

    from pylease import watch_leader
    from pylease.postgres import PostgresBackend

    seen: list[tuple[str | None, int | None]] = []
    ready, done = threading.Event(), threading.Event()

    def watch() -> None:
        for info in watch_leader(dsn, NAME):
            seen.append((None, None) if info is None else (info.holder, info.fence))
            ready.set()
            if info is not None and info.holder == "survivor":
                done.set()
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert ready.wait(BOUND)
    with psycopg.connect(dsn, autocommit=True) as conn:
        other = PostgresBackend(conn)
        for i in range(1, 101):
            assert other.steal(NAME, _ttl(30), f"h{i}") == i
        assert other.release(NAME, "h100")
        assert other.claim(NAME, _ttl(0.2), "crashed") == 101
        time.sleep(0.4)  # its ttl ran out without a release: it died
        assert other.claim(NAME, _ttl(30), "survivor") == 102
        assert done.wait(BOUND), seen
    granted = [(f"h{i}", i) for i in range(1, 101)]
    # Nobody led at first; a crashed leader's expiry is seen only if the row was read
    # while nobody led (an expiry sends nothing), its takeover always.
    assert seen[:101] == [(None, None), *granted]
    assert seen[101:] in (
        [(None, None), ("crashed", 101), ("survivor", 102)],
        [(None, None), ("crashed", 101), (None, None), ("survivor", 102)],
    ), seen[101:]


def test_on_a_schema_before_0016_leases_without_data_still_work(conn: Any, dsn: str) -> None:
    """A claim without data is the 3-argument lease_claim, so this pylease keeps its
    leases on a schema not yet migrated; one with data says the schema is older."""
    root = Path(__file__).resolve().parents[2]
    undo = root / "migrations" / "postgres" / "pylease-0016-data.rollback.sql"
    conn.execute(undo.read_text(encoding="utf-8"))
    with lease(dsn, NAME, ttl=1.5) as held:
        time.sleep(3 * 1.5)  # kept past its ttl: the keeper's renewal works there too
        assert held.fence == 1 and not held.lost
    with (
        pytest.raises(SchemaMissing, match="older than this pylease") as failed,
        lease(dsn, NAME, ttl=30, data=ADDRESS),
    ):
        pass
    assert "lease_claim" in str(failed.value)
