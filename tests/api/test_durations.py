"""Durations in the Python API (contract section 2): a timedelta, seconds, or the CLI's
strings, and waits without a deadline (``pylease.FOREVER``, ``math.inf``, ``"forever"``).

The public ``Target`` types are checked by ``make typecheck`` (``mypy --strict`` on
tests/support/typed_targets.py).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import pylease
from pylease import (
    FOREVER,
    InvalidArgument,
    LeaseBusy,
    alease,
    arun_exclusive,
    keep_fresh,
    leader,
    lease,
    run_exclusive,
)
from pylease.postgres import PostgresBackend
from tests.support.leases import DEAD_URL, claim

Conn = psycopg.Connection[Any]

FIVE_MINUTES = [timedelta(minutes=5), 300, 300.0, "5m", "300", "4m60s", " 5M "]
BAD_SPANS = ["5 minutes", "5x", "m5", "1m1h", "", "   ", "-5m", "forever", "inf", "nan", "5m5m"]


def row_ttl(conn: Conn, name: str) -> timedelta:
    row = conn.execute("SELECT ttl FROM lease_status(%s)", (name,)).fetchone()
    assert row is not None
    ttl: timedelta = row[0]
    return ttl


def row_state(conn: Conn, name: str) -> str:
    row = conn.execute("SELECT state FROM lease_status(%s)", (name,)).fetchone()
    assert row is not None
    state: str = row[0]
    return state


@pytest.mark.parametrize("ttl", FIVE_MINUTES, ids=repr)
def test_ttl_spellings(conn: Conn, dsn: str, ttl: Any) -> None:
    with lease(dsn, "job", ttl, heartbeat=False) as held:
        assert held.fence >= 1
        assert row_ttl(conn, "job") == timedelta(minutes=5)


def test_every_duration_option_takes_strings(conn: Conn, dsn: str) -> None:
    claim(conn, "busy", ttl="1h")
    start = time.monotonic()
    with (
        pytest.raises(LeaseBusy) as busy,
        lease(dsn, "busy", "1h30m", wait="250ms", poll_interval="50ms"),
    ):
        pass
    # waited is measured on the monotonic clock: it covers the 250 ms asked for.
    assert busy.value.waited >= 0.25 - 0.01
    assert time.monotonic() - start >= 0.24

    with lease(dsn, "rests", "1h30m", min_hold="1h", heartbeat=False):
        assert row_ttl(conn, "rests") == timedelta(hours=1, minutes=30)
    assert row_state(conn, "rests") == "resting"

    claim(conn, "kept", holder="owner", ttl="1m")
    with keep_fresh(dsn, "kept", "owner", ttl="2m"):
        assert row_ttl(conn, "kept") == timedelta(minutes=2)

    outcome = run_exclusive(dsn, "sweep", "10s", lambda: 42, wait="1s")
    assert outcome == pylease.Outcome(True, 42)


def test_backend_spans_take_strings(conn: Conn) -> None:
    backend = PostgresBackend(conn)
    assert backend.claim("old", "2m", "first") is not None
    assert backend.steal("old", "1m", "thief", "1h") is None  # renewed too recently
    assert backend.steal("old", "1m", "thief", "0s") is not None
    assert row_ttl(conn, "old") == timedelta(minutes=1)
    assert backend.renew("old", "thief", "250ms")
    assert row_ttl(conn, "old") == timedelta(milliseconds=250)


@pytest.mark.parametrize("bad", BAD_SPANS, ids=repr)
def test_bad_ttl_string_raises_before_any_sql(bad: str) -> None:
    # An unreachable database: had any SQL been tried, the error would be another one.
    with pytest.raises(InvalidArgument) as caught, lease(DEAD_URL, "job", bad):
        pass
    assert caught.value.parameter == "ttl"
    assert isinstance(caught.value, ValueError)
    assert "pylease: pylease" not in str(caught.value)


@pytest.mark.parametrize(
    ("option", "bad"),
    [
        ("wait", "sometimes"),
        ("wait", "-1s"),
        ("wait", -math.inf),
        ("wait", math.nan),
        ("min_hold", "1 hour"),
        ("min_hold", "forever"),
        ("poll_interval", "often"),
        ("poll_interval", "0s"),
    ],
    ids=repr,
)
def test_bad_option_string_raises_before_any_sql(option: str, bad: Any) -> None:
    with pytest.raises(InvalidArgument) as caught:
        run_exclusive(DEAD_URL, "job", 10, lambda: None, **{option: bad})
    assert caught.value.parameter == option


def test_bad_keep_fresh_and_leader_strings(dsn: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        keep_fresh(DEAD_URL, "job", "owner", ttl="soon")
    assert caught.value.parameter == "ttl"
    with pytest.raises(InvalidArgument) as caught:
        leader(DEAD_URL, "scheduler", ttl="15s", wait="eventually")
    assert caught.value.parameter == "wait"


def test_the_message_says_how_to_spell_it() -> None:
    with pytest.raises(InvalidArgument, match=r"250ms, 30s, 5m, 1h30m"):
        lease(DEAD_URL, "job", "5 minutes")


def test_forever_is_math_inf() -> None:
    assert math.inf == FOREVER
    assert "FOREVER" in pylease.__all__


def _waiter(dsn: str, name: str, wait: Any, got: list[int], done: threading.Event) -> None:
    try:
        with lease(dsn, name, 10, wait=wait, heartbeat=False) as held:
            got.append(held.fence)
    finally:
        done.set()


@pytest.mark.parametrize("wait", [FOREVER, math.inf, "forever", " Forever ", timedelta.max])
def test_wait_forever_ends_with_a_release(conn: Conn, conn2: Conn, dsn: str, wait: Any) -> None:
    fence = claim(conn, "forever", holder="owner", ttl="1h")
    got: list[int] = []
    done = threading.Event()
    waiter = threading.Thread(target=_waiter, args=(dsn, "forever", wait, got, done), daemon=True)
    waiter.start()
    # No deadline: still waiting (never LeaseBusy) while the owner holds it.
    assert not done.wait(1.5)
    conn2.execute("SELECT lease_release('forever', 'owner')")
    assert done.wait(30), "the waiter did not take the lease after its release"
    assert got and got[0] > fence


def test_leader_wait_forever(conn: Conn, conn2: Conn, dsn: str) -> None:
    claim(conn, "scheduler", holder="old-leader", ttl="1h")
    fences: list[int] = []

    def campaign() -> None:
        with leader(dsn, "scheduler", ttl="15s", wait="forever") as term:
            fences.append(term.fence)

    thread = threading.Thread(target=campaign, daemon=True)
    thread.start()
    thread.join(1.0)
    assert thread.is_alive() and not fences
    conn2.execute("SELECT lease_release('scheduler', 'old-leader')")
    thread.join(30)
    assert fences


# The async API ----------------------------------------------------------------------


@pytest.mark.parametrize("ttl", FIVE_MINUTES, ids=repr)
async def test_async_ttl_spellings(
    aconn: psycopg.AsyncConnection[Any], conn: Conn, ttl: Any
) -> None:
    async with alease(aconn, "job", ttl, heartbeat=False) as held:
        assert held.fence >= 1
        assert row_ttl(conn, "job") == timedelta(minutes=5)


async def test_async_options_take_strings(conn: Conn, dsn: str) -> None:
    claim(conn, "busy", ttl="1h")
    with pytest.raises(LeaseBusy) as busy:
        async with alease(dsn, "busy", "1h30m", wait="250ms", poll_interval="50ms"):
            pass
    assert busy.value.waited >= 0.25 - 0.01

    async with alease(dsn, "rests", "90m", min_hold="1h30m", heartbeat=False):
        pass
    assert row_state(conn, "rests") == "resting"

    async def work() -> str:
        return "done"

    outcome = await arun_exclusive(dsn, "sweep", "10s", work, wait="2s")
    assert outcome == pylease.Outcome(True, "done")


@pytest.mark.parametrize("bad", BAD_SPANS, ids=repr)
async def test_async_bad_ttl_string_raises_before_any_sql(bad: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        async with alease(DEAD_URL, "job", bad):
            pass
    assert caught.value.parameter == "ttl"


async def test_async_bad_wait_string_raises_before_any_sql() -> None:
    async def work() -> None:
        return None

    with pytest.raises(InvalidArgument) as caught:
        await arun_exclusive(DEAD_URL, "job", 10, work, wait="a while")
    assert caught.value.parameter == "wait"


@pytest.mark.parametrize("wait", [FOREVER, "forever"])
async def test_async_wait_forever_ends_with_a_release(
    aconn: psycopg.AsyncConnection[Any], conn: Conn, conn2: Conn, wait: Any
) -> None:
    fence = claim(conn, "forever", holder="owner", ttl="1h")

    async def take() -> int:
        async with alease(aconn, "forever", 10, wait=wait, heartbeat=False) as held:
            return held.fence

    task = asyncio.ensure_future(take())
    done, _ = await asyncio.wait({task}, timeout=1.5)
    assert not done, "a wait without a deadline ended while the owner held the lease"
    await asyncio.to_thread(conn2.execute, "SELECT lease_release('forever', 'owner')")
    assert await asyncio.wait_for(task, 30) > fence


# Types ------------------------------------------------------------------------------


def test_target_aliases_exist_at_run_time() -> None:
    assert pylease.Target is object
    assert pylease.AsyncTarget is object
    assert {"Target", "AsyncTarget", "Duration", "Wait"} <= set(pylease.__all__)
