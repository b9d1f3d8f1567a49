"""The whole Python API on SQLite: lease with its heartbeat, waiting, run_exclusive,
keep_fresh and alease, on a ``sqlite:///`` URL and on a ``sqlite3.Connection``."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from pylease import (
    ConfigurationError,
    LeaseBusy,
    LeaseLost,
    Outcome,
    alease,
    keep_fresh,
    lease,
    run_exclusive,
)
from pylease.sqlite import SqliteBackend, connect

LONG = timedelta(seconds=30)
BOUND = 20.0


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "leases.sqlite3"
    connect(path).close()
    return path


@pytest.fixture
def other(db: Path) -> Iterator[SqliteBackend]:
    """Another process's view of the same file: its own connection."""
    conn = connect(db)
    try:
        yield SqliteBackend(conn)
    finally:
        conn.close()


@pytest.fixture(params=["url", "connection"])
def target(request: pytest.FixtureRequest, db: Path) -> Iterator[Any]:
    if request.param == "url":
        yield f"sqlite:///{db}"
        return
    conn = connect(db)
    try:
        yield conn
    finally:
        conn.close()


def test_the_heartbeat_keeps_a_1s_lease_for_3s(target: Any, other: SqliteBackend) -> None:
    with lease(target, "job", ttl=1) as held:
        assert held.name == "job" and held.fence == 1
        for _ in range(6):
            time.sleep(0.5)
            held.check()
            assert other.claim("job", LONG, "intruder") is None
        assert not held.lost
        assert other.holds("job", held.holder, held.fence)
    # Released on exit: the next claim gets the next fence at once.
    assert other.claim("job", LONG, "next") == 2


def test_busy_is_loud_in_lease(target: Any, other: SqliteBackend) -> None:
    assert other.claim("job", LONG, "owner") == 1
    with pytest.raises(LeaseBusy) as info, lease(target, "job", ttl=30):
        pytest.fail("the body of a busy lease ran")
    assert info.value.name == "job"


def test_wait_polls_until_the_lease_is_released(target: Any, other: SqliteBackend) -> None:
    assert other.claim("job", LONG, "owner") == 1
    got: list[int] = []
    released = threading.Event()

    def waiter() -> None:
        with lease(target, "job", ttl=30, wait=BOUND) as held:
            assert released.is_set()
            got.append(held.fence)

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.3)
    assert not got
    released.set()
    assert other.release("job", "owner")
    thread.join(BOUND)
    assert got == [2]


def test_run_exclusive_busy_is_silent(target: Any, other: SqliteBackend) -> None:
    calls: list[int] = []

    def work() -> str:
        calls.append(1)
        return "swept"

    assert other.claim("job", LONG, "owner") == 1
    assert run_exclusive(target, "job", 30, work) == Outcome(False, None)
    assert calls == []
    assert other.release("job", "owner")
    assert run_exclusive(target, "job", 30, work) == Outcome(True, "swept")
    assert calls == [1]
    [row] = other.status("job")
    assert row.fence == 2 and not row.held


def test_run_exclusive_is_loud_about_everything_else(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        run_exclusive(f"sqlite:///{tmp_path}/missing/x.sqlite3", "job", 30, lambda: None)
    with pytest.raises(ZeroDivisionError):
        run_exclusive(f"sqlite:///{tmp_path}/x.sqlite3", "job", 30, lambda: 1 / 0)


def test_keep_fresh_keeps_someone_elses_lease_and_never_releases(
    target: Any, other: SqliteBackend
) -> None:
    assert other.claim("job", timedelta(seconds=1), "owner") == 1
    with keep_fresh(target, "job", "owner"):
        for _ in range(5):
            time.sleep(0.5)
            assert other.claim("job", LONG, "intruder") is None
    [row] = other.status("job")
    assert (row.holder, row.fence, row.held) == ("owner", 1, True)
    with pytest.raises(LeaseLost), keep_fresh(target, "job", "not-the-owner"):
        pytest.fail("keep_fresh entered for a holder that does not hold the lease")


def test_a_lease_lost_to_a_steal_is_reported(target: Any, other: SqliteBackend) -> None:
    lost: list[LeaseLost] = []
    with pytest.raises(LeaseLost), lease(target, "job", ttl=0.6, on_lost=lost.append) as held:
        assert other.steal("job", LONG, "thief") == 2
        deadline = time.monotonic() + BOUND
        # held.lost may turn true first, from the ttl running out; on_lost comes
        # from the heartbeat, once its renewal is refused.
        while not (held.lost and lost) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held.lost
    assert lost and lost[0].name == "job"
    assert other.status("job")[0].holder == "thief"


async def test_alease_keeps_a_1s_lease_with_its_heartbeat(
    target: Any, other: SqliteBackend
) -> None:
    async with alease(target, "job", ttl=1) as held:
        assert held.fence == 1
        for _ in range(4):
            await asyncio.sleep(0.5)
            held.check()
            assert await asyncio.to_thread(other.claim, "job", LONG, "intruder") is None
    assert other.claim("job", LONG, "next") == 2
