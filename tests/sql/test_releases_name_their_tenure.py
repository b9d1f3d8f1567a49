"""Releases of permits and of several names that name their tenure, scripted on two
sessions, and the blocks that send them (issue 24, sibling of issue 21 item 17;
migration 0014).

A holder the caller chose (``permit(..., holder="h")``, ``leases(..., holder="h")``,
the command line's ``--holder``) may hold the same semaphore or names again: in the
next block, or in another process using that holder, once the earlier tenure expired.
A release of the earlier tenure that arrives late (its statement abandoned by the
client, run later by the server) used to match the holder alone and freed the later
tenure, so that another claimer was granted it while the later block believed.
``permit_release(name, holder, slot, fence)`` and ``lease_release_all(names, holder,
fences)`` free only the tenure they name; the earlier signatures still match the
holder alone, as the contract says.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors

import pylease._tenure
from pylease import LeaseLost, leases, permit
from pylease._resources import data_dir
from pylease.postgres import PostgresBackend
from tests.support.sessions import blocking_conn, one, wait_blocked

Conn = psycopg.Connection[Any]
Connect = Callable[..., Conn]

HOUR = timedelta(hours=1)
BLINK = timedelta(milliseconds=20)
PERMITS = "SELECT slot, fence FROM permit_claim_new('sem', %s, %s, 'h', %s)"
NAMES = "SELECT name, fence FROM lease_claim_all_new('{a,b}', %s, 'h')"


def past(seconds: float = 0.1) -> None:
    """Sleep past a short expiry (the database's clock decides; a margin of 5x)."""
    time.sleep(seconds)


@pytest.fixture
def background() -> Iterator[Callable[..., Future[Any]]]:
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit


def permit_tenures(
    conn: Conn, conn2: Conn, permits: int = 1
) -> tuple[dict[int, int], dict[int, int]]:
    """The holder's first tenure of permits, expired; its second, granted on the other
    session: slot -> fence of each."""
    first = dict(conn.execute(PERMITS, (2, BLINK, permits)).fetchall())
    past()
    second = dict(conn2.execute(PERMITS, (2, HOUR, permits)).fetchall())
    assert first and second
    return first, second


def name_tenures(conn: Conn, conn2: Conn) -> tuple[dict[str, int], dict[str, int]]:
    """The holder's first tenure of names a and b, expired; its second, on the other
    session: name -> fence of each."""
    first = dict(conn.execute(NAMES, (BLINK,)).fetchall())
    past()
    second = dict(conn2.execute(NAMES, (HOUR,)).fetchall())
    assert set(first) == set(second) == {"a", "b"}
    assert all(second[n] > first[n] for n in first)
    return first, second


def held_slots(conn: Conn) -> list[tuple[int, str, int]]:
    return conn.execute(
        "SELECT slot, holder, fence FROM permit_status('sem') WHERE held ORDER BY slot"
    ).fetchall()


def held_names(conn: Conn) -> list[tuple[str, str, int]]:
    return conn.execute(
        "SELECT name, holder, fence FROM lease_status() WHERE held ORDER BY name"
    ).fetchall()


# -- permits -----------------------------------------------------------------------


def test_a_late_release_of_an_earlier_tenure_of_permits_frees_nothing(
    conn: Conn, conn2: Conn
) -> None:
    first, second = permit_tenures(conn, conn2)
    ((slot, fence),) = first.items()
    later = [(s, "h", f) for s, f in second.items()]
    assert one(conn, "SELECT permit_release('sem', 'h', %s, %s)", (slot, fence)) is False
    assert held_slots(conn) == later
    # A semaphore of 2: the other permit is free, but no third holder gets two.
    assert conn.execute("SELECT * FROM permit_claim('sem', 2, '1 hour', 'x', 2)").fetchall() == []
    # The second tenure's own release is one.
    ((slot2, fence2),) = second.items()
    assert one(conn, "SELECT permit_release('sem', 'h', %s, %s)", (slot2, fence2)) is True
    assert held_slots(conn) == []


def test_the_earlier_permit_release_still_matches_the_holder_alone(conn: Conn, conn2: Conn) -> None:
    """The gap the new signature closes: the two-argument form frees the later tenure."""
    permit_tenures(conn, conn2)
    assert one(conn, "SELECT permit_release('sem', 'h')") is True
    assert held_slots(conn) == []
    permit_tenures(conn, conn2)
    assert one(conn, "SELECT permit_release('sem', 'h', NULL, NULL)") is True
    assert held_slots(conn) == []


def test_a_release_naming_one_slot_frees_the_whole_tenure(conn: Conn) -> None:
    granted = dict(conn.execute(PERMITS, (3, HOUR, 2)).fetchall())
    slot, fence = max(granted.items())
    assert one(conn, "SELECT permit_release('sem', 'h', %s, %s)", (slot, fence + 1)) is False
    assert len(held_slots(conn)) == 2
    assert one(conn, "SELECT permit_release('sem', 'h', %s, %s)", (slot, fence)) is True
    assert held_slots(conn) == []


def test_a_permit_release_in_flight_across_a_new_tenure_of_its_holder_frees_nothing(
    conn: Conn, conn2: Conn, connect: Connect, background: Callable[..., Future[Any]]
) -> None:
    """The first tenure's release is sent; before it runs, the slot expired and the
    holder's other process is granted it again: the release waits for that grant's row
    lock, then finds a fence that is not its own."""
    ((slot, fence),) = conn.execute(PERMITS, (1, BLINK, 1)).fetchall()
    past()
    releaser = blocking_conn(connect)
    with conn2.transaction():
        again = conn2.execute(PERMITS, (1, HOUR, 1)).fetchall()
        assert again == [(slot, fence + 1)]
        late = background(
            lambda: one(releaser, "SELECT permit_release('sem', 'h', %s, %s)", (slot, fence))
        )
        wait_blocked(conn, releaser)
    assert late.result(timeout=20) is False
    assert held_slots(conn) == [(slot, "h", fence + 1)]


def test_the_permit_overload_leaves_every_earlier_call_unambiguous(conn: Conn) -> None:
    conn.execute(PERMITS, (1, HOUR, 1))
    assert one(conn, "SELECT permit_release(name => 'sem', holder => 'h')") is True
    ((slot, fence),) = conn.execute(PERMITS, (1, HOUR, 1)).fetchall()
    named = "SELECT permit_release(name => %s, holder => %s, slot => %s, fence => %s)"
    assert one(conn, named, ("sem", "h", slot, fence)) is True
    # Neither slot nor fence has a default: naming one alone matches no function.
    with pytest.raises(pg_errors.UndefinedFunction):
        conn.execute("SELECT permit_release(name => 'sem', holder => 'h', fence => 1)")


# -- several names -----------------------------------------------------------------


def test_a_late_release_of_an_earlier_tenure_of_names_frees_nothing(
    conn: Conn, conn2: Conn
) -> None:
    first, second = name_tenures(conn, conn2)
    late = conn.execute(
        "SELECT * FROM lease_release_all('{a,b}', 'h', %s)", ([first["a"], first["b"]],)
    ).fetchall()
    assert late == [("a", False), ("b", False)]
    assert held_names(conn) == [("a", "h", second["a"]), ("b", "h", second["b"])]
    assert one(conn, "SELECT lease_claim('a', '1 hour', 'x')") is None
    # The second tenure's own release is one; a NULL element matches any tenure.
    own = conn.execute(
        "SELECT * FROM lease_release_all('{b,a}', 'h', %s)", ([None, second["a"]],)
    ).fetchall()
    assert own == [("b", True), ("a", True)]
    assert held_names(conn) == []


def test_the_earlier_release_all_still_matches_the_holder_alone(conn: Conn, conn2: Conn) -> None:
    name_tenures(conn, conn2)
    assert conn.execute("SELECT * FROM lease_release_all('{a,b}', 'h')").fetchall() == [
        ("a", True),
        ("b", True),
    ]
    name_tenures(conn, conn2)
    assert conn.execute("SELECT * FROM lease_release_all('{a,b}', 'h', NULL)").fetchall() == [
        ("a", True),
        ("b", True),
    ]


def test_a_release_of_names_in_flight_across_a_new_tenure_of_its_holder_frees_nothing(
    conn: Conn, conn2: Conn, connect: Connect, background: Callable[..., Future[Any]]
) -> None:
    first = dict(conn.execute(NAMES, (BLINK,)).fetchall())
    past()
    releaser = blocking_conn(connect)
    with conn2.transaction():
        second = dict(conn2.execute(NAMES, (HOUR,)).fetchall())
        late = background(
            lambda: releaser.execute(
                "SELECT * FROM lease_release_all('{a,b}', 'h', %s)", ([first["a"], first["b"]],)
            ).fetchall()
        )
        wait_blocked(conn, releaser)
    assert late.result(timeout=20) == [("a", False), ("b", False)]
    assert held_names(conn) == [("a", "h", second["a"]), ("b", "h", second["b"])]


def test_fences_must_match_the_names(conn: Conn) -> None:
    with pytest.raises(pg_errors.InvalidParameterValue) as raised:
        conn.execute("SELECT * FROM lease_release_all('{a,b}', 'h', '{1}')")
    assert raised.value.diag.column_name == "fences"


# -- the blocks that send them ------------------------------------------------------


def test_a_late_release_of_permit_block_one_leaves_block_two_of_the_same_holder_held(
    dsn: str, conn2: Conn
) -> None:
    with permit(dsn, "sem", max_permits=1, ttl=60, holder="H", heartbeat=False) as first:
        pass
    with permit(dsn, "sem", max_permits=1, ttl=60, holder="H", heartbeat=False) as second:
        # Block 1's release, as its block sends it, arriving after block 2's claim.
        ((slot, fence),) = first.slots.items()
        assert PostgresBackend(conn2).permit_release("sem", "H", slot, fence) is False
        second.check()
        assert conn2.execute("SELECT * FROM permit_claim('sem', 1, '1 hour', 'x')").fetchall() == []
        assert held_slots(conn2) == [(s, "H", f) for s, f in second.slots.items()]


def test_leaving_a_permit_block_never_releases_a_later_tenure_of_its_holder(
    dsn: str, conn2: Conn
) -> None:
    with (
        pytest.raises(LeaseLost),
        permit(dsn, "sem", max_permits=1, ttl=0.2, holder="H", heartbeat=False) as held,
    ):
        # The block's tenure expires; another process using the same holder is granted
        # a new one before this block's release arrives.
        past(0.4)
        later = dict(conn2.execute("SELECT * FROM permit_claim_new('sem', 1, '1 hour', 'H')"))
        assert later == {s: f + 1 for s, f in held.slots.items()}
    assert held_slots(conn2) == [(s, "H", f) for s, f in later.items()]
    assert conn2.execute("SELECT * FROM permit_claim('sem', 1, '1 hour', 'x')").fetchall() == []


def test_leaving_a_block_of_names_never_releases_a_later_tenure_of_its_holder(
    dsn: str, conn2: Conn
) -> None:
    with (
        pytest.raises(LeaseLost),
        leases(dsn, ["a", "b"], ttl=0.2, holder="H", heartbeat=False) as held,
    ):
        past(0.4)
        later = dict(conn2.execute("SELECT * FROM lease_claim_all_new('{a,b}', '1 hour', 'H')"))
        assert all(later[n] == f + 1 for n, f in held.fences.items())
    assert held_names(conn2) == [("a", "H", later["a"]), ("b", "H", later["b"])]
    assert one(conn2, "SELECT lease_claim('b', '1 hour', 'x')") is None


def test_blocks_still_release_on_a_schema_before_0014_and_say_so_once(
    dsn: str, conn2: Conn, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pylease._tenure, "_told_unfenced", False)
    rollback = data_dir("migrations", "postgres") / "pylease-0014-fenced-releases.rollback.sql"
    conn2.execute(rollback.read_text())  # type: ignore[call-overload]
    caplog.set_level(logging.WARNING, logger="pylease")
    for _ in range(2):
        with permit(dsn, "sem", max_permits=1, ttl=60, holder="H", heartbeat=False):
            pass
        assert held_slots(conn2) == []
        with leases(dsn, ["a", "b"], ttl=60, holder="H", heartbeat=False):
            pass
        assert held_names(conn2) == []
    said = [r for r in caplog.records if "releases permits and several names" in r.message]
    assert len(said) == 1
