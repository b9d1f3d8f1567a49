"""What migration 0023 leaves out of the paths of names that do not need it, and what it
must keep (issues 24, 25 and 26; contract 5.1, 5.2 and 5.4).

- Migration 0023 marked the names readers hold (shared_seen, which 0024 drops again:
  a first reader's mark was an update of the lease row, and two first readers waited for
  one commit); readers keep their writer out on a name used either way first.
- The watched trigger's WHEN tests only the row's mark; the function tells a change of
  holder or data from an update that changed neither (a retried claim).
- A permit claim, its wrapper now inlined into the caller's statement, still raises
  when a slot is out of fences and writes history as the setting says.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors

from pylease._resources import data_dir
from tests.sql.test_races import Connect, background

__all__ = ["background"]  # a fixture, used by name

Conn = psycopg.Connection[Any]
Submit = Callable[..., Future[Any]]

LEAN = "pylease-0023-lean-paths"
MAX_FENCE = 2**63 - 1
CLAIM = "SELECT lease_claim('doc', '1 hour', %s)"
SHARE = "SELECT lease_claim_shared('doc', '1 hour', %s)"
PERMIT = "SELECT slot, fence FROM permit_claim('sem', 2, '1 hour', %s, %s)"


def one(conn: Conn, query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()  # type: ignore[call-overload]
    assert row is not None
    return row[0]


def seen(conn: Conn, name: str = "doc") -> bool:
    return bool(one(conn, "SELECT shared_seen FROM pylease_leases WHERE name = %s", (name,)))


# -- readers' shares --------------------------------------------------------------


@pytest.mark.parametrize("first", ["a reader", "a writer"])
def test_a_read_name_keeps_its_writer_out_while_a_reader_holds(conn: Conn, first: str) -> None:
    if first == "a writer":
        assert one(conn, CLAIM, ("old",)) == 1
        assert one(conn, "SELECT lease_release('doc', 'old')") is True
    epoch = one(conn, SHARE, ("r1",))
    assert one(conn, SHARE, ("r2",)) == epoch
    assert one(conn, CLAIM, ("w",)) is None
    assert one(conn, "SELECT lease_release('doc', 'r1')") is True
    assert one(conn, CLAIM, ("w",)) is None  # r2 still reads
    # r2 dies: once its share expired, the writer is granted and the shares of the
    # name go with the grant.
    conn.execute("UPDATE pylease_shared SET expires_at = clock_timestamp() WHERE holder = 'r2'")
    assert one(conn, CLAIM, ("w",)) == epoch + 1
    assert one(conn, "SELECT count(*) FROM pylease_shared WHERE name = 'doc'") == 0
    # Readers may come back after the writer.
    assert one(conn, "SELECT lease_release('doc', 'w')") is True
    assert one(conn, SHARE, ("r3",)) == epoch + 1
    assert one(conn, CLAIM, ("w",)) is None


def test_two_first_readers_of_a_written_name_neither_write_its_row_nor_wait(
    conn: Conn, connect: Connect
) -> None:
    """Contract 5.2: a shared claim never updates the name's lease row and never waits for
    another reader, also when both are the first readers a name used exclusively has."""
    assert one(conn, CLAIM, ("old",)) == 1
    assert one(conn, "SELECT lease_release('doc', 'old')") is True
    version = one(conn, "SELECT xmin::text FROM pylease_leases WHERE name = 'doc'")
    first, second = connect(), connect()
    # A wait would fail the claim (busy once lock_timeout ran out), not hang the test.
    second.execute("SET lock_timeout = '1s'")
    with first.transaction():
        assert one(first, SHARE, ("r1",)) == 1
        assert one(second, SHARE, ("r2",)) == 1
        assert one(first, "SELECT pg_current_xact_id_if_assigned() IS NOT NULL") is True
    holders = conn.execute("SELECT holder FROM lease_holders('doc') ORDER BY holder").fetchall()
    assert holders == [("r1",), ("r2",)]
    # Neither reader made a new version of the row.
    assert one(conn, "SELECT xmin::text FROM pylease_leases WHERE name = 'doc'") == version


def test_the_migration_marks_the_names_that_readers_hold(empty_dsn: str) -> None:
    """A database with a reader before this migration: after it, a writer is still refused
    beside that reader."""
    folder = data_dir("migrations", "postgres")
    files = sorted(p for p in folder.glob("pylease-*.sql") if not p.name.endswith(".rollback.sql"))
    before = [p for p in files if p.stem < LEAN]
    [lean] = [p for p in files if p.stem == LEAN]
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        for path in before:
            with c.transaction():
                c.execute(path.read_bytes())
        assert one(c, SHARE, ("r",)) == 0
        assert one(c, "SELECT lease_claim('solo', '1 hour', 'w')") == 1
        with c.transaction():
            c.execute(lean.read_bytes())
        assert seen(c) is True
        assert seen(c, "solo") is False
        assert one(c, CLAIM, ("w",)) is None
        assert one(c, "SELECT lease_release('doc', 'r')") is True
        assert one(c, CLAIM, ("w",)) == 1


# -- watchers -----------------------------------------------------------------------


def test_a_retried_claim_of_a_watched_name_tells_only_new_data(dsn: str, conn: Conn) -> None:
    conn.execute("SELECT lease_watch('leader', 'w1', '1 min')")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pylease_holders")
        conn.execute("SELECT lease_claim('leader', '1 hour', 'h1', '{\"at\": 1}')")
        conn.execute("SELECT lease_claim('leader', '1 hour', 'h1', '{\"at\": 1}')")  # the same
        conn.execute("SELECT lease_claim('leader', '1 hour', 'h1')")  # keeps the data
        conn.execute("SELECT lease_claim('leader', '1 hour', 'h1', '{\"at\": 2}')")
        got = [json.loads(n.payload) for n in listener.notifies(timeout=2.0, stop_after=3)]
    assert [(n["fence"], n["holder"], n["event"]) for n in got] == [
        (1, "h1", "granted"),
        (1, "h1", "data"),
    ]


# -- permits ------------------------------------------------------------------------


def permits(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT * FROM pylease_permits ORDER BY name, slot").fetchall()


@pytest.mark.parametrize("count", [1, 2])
def test_a_permit_slot_out_of_fences_raises_54000_and_changes_nothing(
    conn: Conn, count: int
) -> None:
    assert len(conn.execute(PERMIT, ("old", 2)).fetchall()) == 2
    assert one(conn, "SELECT permit_release('sem', 'old')") is True
    conn.execute(
        "UPDATE pylease_permits SET fence = %s WHERE name = 'sem' AND slot = 1", (MAX_FENCE,)
    )
    events = one(conn, "SELECT count(*) FROM pylease_events")
    before = permits(conn)
    holder = "new"
    if count == 1:
        # A holder whose hash starts at slot 1 takes it first.
        holder = next(
            h
            for h in (f"h{i}" for i in range(100))
            if one(conn, "SELECT ((hashtext(%s) %% 2) + 2) %% 2", (h,)) == 1
        )
    with pytest.raises(pg_errors.ProgramLimitExceeded) as caught:
        conn.execute(PERMIT, (holder, count))
    assert caught.value.sqlstate == "54000"
    assert "'sem'" in (caught.value.diag.message_primary or "")
    assert "slot 1" in (caught.value.diag.message_primary or "")
    assert permits(conn) == before
    assert one(conn, "SELECT count(*) FROM pylease_events") == events


@pytest.mark.parametrize("history", ["rare", "all", "none"])
def test_permit_history_is_written_as_the_setting_says(conn: Conn, history: str) -> None:
    """One slot and several, claimed, released and taken over (a holder that died)."""
    conn.execute("SELECT set_config('pylease.history', %s, false)", (history,))
    [(slot, fence)] = conn.execute(PERMIT, ("a", 1)).fetchall()
    conn.execute("SELECT permit_release('sem', 'a')")
    both = conn.execute(PERMIT, ("b", 2)).fetchall()
    conn.execute("UPDATE pylease_permits SET expires_at = clock_timestamp() WHERE holder = 'b'")
    time.sleep(0.01)
    [(c_slot, c_fence)] = conn.execute(PERMIT, ("c", 1)).fetchall()
    rows = conn.execute(
        "SELECT event, holder, previous_holder, slot, fence FROM pylease_events ORDER BY id"
    ).fetchall()
    takeover = ("taken_over", "c", "b", c_slot, c_fence)
    recorded = {
        "all": [
            ("claimed", "a", None, slot, fence),
            ("released", "a", None, slot, fence),
            # The previous holder of a slot, as a lease's: a's, released.
            *[("claimed", "b", "a" if s == slot else None, s, f) for s, f in both],
            takeover,
        ],
        "rare": [takeover],
        "none": [],
    }[history]
    assert rows == recorded
