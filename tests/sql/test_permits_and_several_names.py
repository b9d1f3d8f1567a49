"""Permits and several names at once on PostgreSQL: races scripted on two sessions,
what a busy claim costs, fences, and claims of overlapping names that never deadlock.

Where one session must block, it runs in a thread; the test proves it is blocked (its
backend waits on a lock in pg_stat_activity) before letting the other go on. Where a
session must not block, its answer comes while the other's transaction is still open.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.support.sessions import blocking_conn, one, wait_blocked

Conn = psycopg.Connection[Any]
Connect = Callable[..., Conn]

HOUR = timedelta(hours=1)
SHORT = timedelta(milliseconds=300)
BOUND = 30.0  # seconds: the most a scripted step may take before the test fails


def permits(conn: Conn, name: str, holder: str, max_permits: int, n: int = 1) -> dict[int, int]:
    rows = conn.execute(
        "SELECT slot, fence FROM permit_claim(%s, %s, %s, %s, %s)",
        (name, max_permits, HOUR, holder, n),
    ).fetchall()
    return dict(rows)


def claim_all(conn: Conn, names: list[str], holder: str) -> dict[str, int]:
    rows = conn.execute(
        "SELECT name, fence FROM lease_claim_all(%s, %s, %s)", (names, HOUR, holder)
    ).fetchall()
    return dict(rows)


def holders(conn: Conn, name: str) -> list[str]:
    return [
        r[0]
        for r in conn.execute(
            "SELECT holder FROM permit_status(%s) WHERE held ORDER BY holder", (name,)
        )
    ]


def expire_slots(conn: Conn, name: str) -> None:
    """Make every slot of a semaphore expire now (a no-key update, as a renewal is)."""
    conn.execute(
        "UPDATE pylease_permits SET expires_at = clock_timestamp() - interval '1 second'"
        " WHERE name = %s AND fence > 0",
        (name,),
    )


@pytest.fixture
def background() -> Iterator[Callable[..., Future[Any]]]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        yield pool.submit


# -- what a busy claim costs --------------------------------------------------


def test_a_busy_permit_claim_and_a_busy_claim_all_take_no_transaction_id(
    conn: Conn, conn2: Conn
) -> None:
    assert len(permits(conn, "exports", "a", 3, 2)) == 2
    assert one(conn, "SELECT lease_claim('b', %s, 'a')", (HOUR,)) == 1
    with conn2.transaction():
        # One slot is free, two are asked for.
        assert permits(conn2, "exports", "z", 3, 2) == {}
        assert permits(conn2, "exports", "y", 3, 3) == {}
        assert claim_all(conn2, ["a", "b", "c"], "z") == {}
        # No xid: nothing written, no row locked (a row lock needs one).
        assert one(conn2, "SELECT pg_current_xact_id_if_assigned()") is None
    with conn2.transaction():
        assert claim_all(conn2, ["c", "d"], "z") == {"c": 1, "d": 1}
        assert one(conn2, "SELECT pg_current_xact_id_if_assigned()") is not None


@pytest.mark.parametrize("kind", ["permit_claim", "lease_claim_all"])
def test_a_busy_claim_writes_no_wal(conn: Conn, conn2: Conn, kind: str) -> None:
    assert len(permits(conn, "exports", "a", 3, 2)) == 2
    assert one(conn, "SELECT lease_claim('b', %s, 'a')", (HOUR,)) == 1

    def busy() -> None:
        if kind == "permit_claim":
            # One slot is free, two are asked for.
            assert permits(conn2, "exports", "z", 3, 2) == {}
        else:
            assert claim_all(conn2, ["a", "b", "c"], "z") == {}

    busy()  # plan and cache once
    # The insert position is cluster-wide: other sessions and background writers move
    # it too. One attempt during which it stood still is proof enough.
    attempts = []
    for _ in range(50):
        before = one(conn2, "SELECT pg_current_wal_insert_lsn()")
        busy()
        after = one(conn2, "SELECT pg_current_wal_insert_lsn()")
        attempts.append((before, after))
        if before == after:
            return
        time.sleep(0.05)
    pytest.fail(f"the WAL insert position moved around every busy claim: {attempts}")


def test_a_granted_permit_does_write_wal(conn2: Conn) -> None:
    """The probe above can see a write: a grant always moves the position."""
    before = one(conn2, "SELECT pg_current_wal_insert_lsn()")
    assert permits(conn2, "exports", "z", 3) != {}
    assert one(conn2, "SELECT pg_current_wal_insert_lsn()") > before


# -- races on the last free slot ---------------------------------------------------


def test_two_claimers_of_the_last_free_slot_one_wins_and_the_other_never_waits(
    conn: Conn, connect: Connect
) -> None:
    assert len(permits(conn, "exports", "old", 2)) == 1
    first, second = connect(), blocking_conn(connect)
    with first.transaction():
        won = permits(first, "exports", "first", 2)
        assert len(won) == 1
        # The second claimer saw the slot free, finds it locked, skips it: busy at
        # once, while the first's transaction is still open.
        assert permits(second, "exports", "second", 2) == {}
    assert holders(conn, "exports") == ["first", "old"]
    assert permits(second, "exports", "second", 2) == {}


def test_a_claimer_skipping_a_rolled_back_grant_gets_the_slot_next_time(
    conn: Conn, connect: Connect
) -> None:
    assert len(permits(conn, "exports", "old", 2)) == 1
    first, second = connect(), connect()
    with first.transaction():
        assert len(permits(first, "exports", "first", 2)) == 1
        assert permits(second, "exports", "second", 2) == {}
        raise psycopg.Rollback  # leaves the block, rolled back
    assert len(permits(second, "exports", "second", 2)) == 1
    assert holders(conn, "exports") == ["old", "second"]


def test_claimers_of_free_slots_take_different_slots_without_waiting(
    conn: Conn, connect: Connect
) -> None:
    """Every claimer starts where a hash of its holder points and skips locked slots:
    four open grants on four free slots, none waiting for another."""
    assert len(permits(conn, "exports", "maker", 4)) == 1
    assert one(conn, "SELECT permit_release('exports', 'maker')") is True
    sessions = [connect() for _ in range(4)]
    transactions = [s.transaction() for s in sessions]
    granted: dict[int, int] = {}
    try:
        for number, (session, tx) in enumerate(zip(sessions, transactions, strict=True)):
            tx.__enter__()
            got = permits(session, "exports", f"h{number}", 4)
            assert len(got) == 1 and not set(got) & set(granted)
            granted.update(got)
    finally:
        for tx in transactions:
            tx.__exit__(None, None, None)
    assert sorted(granted) == [0, 1, 2, 3]
    assert permits(conn, "exports", "late", 4) == {}


def test_holders_start_at_different_slots(conn: Conn) -> None:
    """On an empty semaphore, the slot a claim takes depends on its holder."""
    first_slots = set()
    for number in range(40):
        holder = f"holder-{number}"
        got = permits(conn, "spread", holder, 8)
        first_slots.update(got)
        assert one(conn, "SELECT permit_release('spread', %s)", (holder,)) is True
    assert len(first_slots) > 1


def test_a_release_in_flight_leaves_the_slot_busy_until_it_commits(
    conn: Conn, connect: Connect
) -> None:
    assert len(permits(conn, "exports", "holder", 1)) == 1
    releaser, claimer = connect(), connect()
    with releaser.transaction():
        assert one(releaser, "SELECT permit_release('exports', 'holder')") is True
        assert permits(claimer, "exports", "next", 1) == {}
    assert permits(claimer, "exports", "next", 1) == {0: 2}


def test_a_renewal_of_an_expired_slot_waits_for_the_claim_taking_it_then_fails(
    conn: Conn, connect: Connect, background: Callable[..., Future[Any]]
) -> None:
    assert permits(conn, "exports", "late", 1) == {0: 1}
    expire_slots(conn, "exports")
    claimer, keeper = connect(), blocking_conn(connect)
    with claimer.transaction():
        assert permits(claimer, "exports", "next", 1) == {0: 2}
        renewal = background(one, keeper, "SELECT permit_renew('exports', 'late')")
        wait_blocked(conn, keeper)
        assert not renewal.done()
    assert renewal.result(timeout=BOUND) is False
    assert holders(conn, "exports") == ["next"]


def test_a_renewal_that_commits_first_keeps_the_slot(conn: Conn, connect: Connect) -> None:
    assert permits(conn, "exports", "late", 1) == {0: 1}
    expire_slots(conn, "exports")
    keeper, claimer = connect(), connect()
    with keeper.transaction():
        assert one(keeper, "SELECT permit_renew('exports', 'late')") is True
        # The claimer read the slot as expired; locked by the renewal, it is skipped.
        assert permits(claimer, "exports", "next", 1) == {}
    assert permits(claimer, "exports", "next", 1) == {}
    assert holders(conn, "exports") == ["late"]


# -- a limit changed while slots are held ------------------------------------------


def test_a_lowered_limit_drains_and_a_claim_started_before_it_keeps_the_old_one(
    conn: Conn, connect: Connect
) -> None:
    assert len(permits(conn, "exports", "h1", 3)) == 1
    operator, claimer = connect(), connect()
    with operator.transaction():
        operator.execute("SELECT permit_set_max('exports', 1)")
        # Not committed: a claim now still sees the old limit, and is not held up.
        assert len(permits(claimer, "exports", "h2", 3)) == 1
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="limit 1"):
        permits(claimer, "exports", "h3", 3)
    # Two hold a semaphore of one: no grant until both are gone.
    assert permits(claimer, "exports", "h3", 1) == {}
    assert one(conn, "SELECT permit_release('exports', 'h1')") is True
    assert permits(claimer, "exports", "h3", 1) == {}
    assert one(conn, "SELECT permit_release('exports', 'h2')") is True
    assert list(permits(claimer, "exports", "h3", 1)) == [0]
    assert holders(conn, "exports") == ["h3"]


def test_a_limit_changed_while_a_claim_waits_for_nothing(conn: Conn, connect: Connect) -> None:
    """permit_set_max locks the semaphore's row; claims read it without a lock."""
    assert len(permits(conn, "exports", "h1", 2)) == 1
    operator, claimer = connect(), connect()
    claimer.execute("SET lock_timeout = '1s'")
    with operator.transaction():
        operator.execute("SELECT permit_set_max('exports', 4)")
        assert len(permits(claimer, "exports", "h2", 2)) == 1
        assert one(claimer, "SELECT permit_renew('exports', 'h1')") is True


# -- revoke and fenced writes ------------------------------------------------------

FENCED_WRITE = "UPDATE report SET note = %s WHERE id = 1 AND permit_holds('exports', %s, %s)"


@pytest.fixture
def report(conn: Conn) -> Conn:
    conn.execute("CREATE TABLE report (id int PRIMARY KEY, note text)")
    conn.execute("INSERT INTO report VALUES (1, 'none')")
    return conn


def test_a_slot_under_a_fenced_transaction_is_skipped_until_it_commits(
    report: Conn, connect: Connect
) -> None:
    conn = report
    assert permits(conn, "exports", "alice", 1) == {0: 1}
    writer, claimer = connect(), connect()
    with writer.transaction():
        assert writer.execute(FENCED_WRITE, ("fenced", "alice", 1)).rowcount == 1
        # Expired (a no-key update passes the writer's lock) and revoked: both pass too.
        expire_slots(conn, "exports")
        assert one(conn, "SELECT permit_revoke('exports', 'alice')") is True
        # The grant would change the fence the writer's transaction relies on: skipped.
        assert permits(claimer, "exports", "bob", 1) == {}
    assert permits(claimer, "exports", "bob", 1) == {0: 2}
    assert writer.execute(FENCED_WRITE, ("stale", "alice", 1)).rowcount == 0
    assert one(conn, "SELECT note FROM report") == "fenced"
    # A revoke of an expired holder is no steal.
    assert conn.execute("SELECT steals FROM lease_counters('exports')").fetchone() == (0,)


def test_a_revoke_of_a_live_holder_makes_the_next_grant_a_steal(conn: Conn) -> None:
    assert permits(conn, "exports", "alice", 1) == {0: 1}
    assert one(conn, "SELECT permit_holds('exports', 'alice', 1)") is True
    assert one(conn, "SELECT permit_revoke('exports', 'alice')") is True
    assert one(conn, "SELECT permit_holds('exports', 'alice', 1)") is False
    assert one(conn, "SELECT permit_renew('exports', 'alice')") is False
    assert permits(conn, "exports", "bob", 1) == {0: 2}
    assert conn.execute(
        "SELECT event, holder, fence, previous_holder, slot FROM lease_history('exports')"
    ).fetchall() == [("stolen", "bob", 2, "alice", 0)]


# -- fences ------------------------------------------------------------------------


def test_every_slot_starts_at_the_floor_of_the_timeline(conn: Conn) -> None:
    timeline = one(conn, "SELECT timeline_id FROM pg_control_checkpoint()")
    floor = ((timeline - 1) << 40) + 1
    assert permits(conn, "exports", "me", 3, 3) == {0: floor, 1: floor, 2: floor}


def test_a_slot_fence_below_the_floor_jumps_to_it_and_one_above_goes_on(conn: Conn) -> None:
    assert permits(conn, "exports", "me", 2, 2) == {0: 1, 1: 1}
    conn.execute(
        "UPDATE pylease_permits SET fence = %s, expires_at = clock_timestamp() - interval '1s'"
        " WHERE slot = 1",
        (1 << 41,),
    )
    assert one(conn, "SELECT permit_release('exports', 'me')") is True
    assert permits(conn, "exports", "you", 2, 2) == {0: 2, 1: (1 << 41) + 1}


def test_per_slot_fences_only_grow_under_contention(dsn: str, conn: Conn) -> None:
    """Eight sessions claim and release one of three slots over and over; every grant is
    recorded (pylease.history = all): per slot, fences strictly increase in the order
    the grants committed, and no slot is granted twice at one fence."""
    database = sql.Identifier(one(conn, "SELECT current_database()"))
    conn.execute(sql.SQL("ALTER DATABASE {} SET pylease.history = 'all'").format(database))
    granted: list[tuple[int, int]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(number: int) -> None:
        rng = random.Random(number)
        try:
            with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as c:
                done = 0
                deadline = time.monotonic() + BOUND
                while done < 25 and time.monotonic() < deadline:
                    holder = f"w{number}-{done}"
                    got = permits(c, "hot", holder, 3)
                    if not got:
                        time.sleep(rng.uniform(0, 0.005))
                        continue
                    with lock:
                        granted.extend(got.items())
                    assert one(c, "SELECT permit_release('hot', %s)", (holder,)) is True
                    done += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND * 2)
    assert not errors, errors
    assert len(granted) == 8 * 25
    events = conn.execute(
        "SELECT slot, fence FROM pylease_events WHERE name = 'hot' AND event = 'claimed'"
        " ORDER BY id"
    ).fetchall()
    assert sorted(events) == sorted(granted)
    for slot in range(3):
        fences = [f for s, f in events if s == slot]
        assert fences == sorted(set(fences)), f"slot {slot}: {fences}"


# -- several names at once ---------------------------------------------------------


def test_claim_all_of_new_names_waits_for_the_other_claim_then_is_busy(
    conn: Conn, connect: Connect, background: Callable[..., Future[Any]]
) -> None:
    first, second = connect(), blocking_conn(connect)
    with first.transaction():
        assert claim_all(first, ["a", "b"], "first") == {"a": 1, "b": 1}
        loser = background(claim_all, second, ["b", "a"], "second")
        wait_blocked(conn, second)
        assert not loser.done()
    assert loser.result(timeout=BOUND) == {}
    assert conn.execute("SELECT name, holder FROM lease_status() ORDER BY name").fetchall() == [
        ("a", "first"),
        ("b", "first"),
    ]


def test_claim_all_of_free_names_waits_for_the_other_claim_then_is_busy(
    conn: Conn, connect: Connect, background: Callable[..., Future[Any]]
) -> None:
    assert claim_all(conn, ["a", "b", "c"], "old") == {"a": 1, "b": 1, "c": 1}
    assert conn.execute("SELECT * FROM lease_release_all('{a,b,c}', 'old')").fetchall()
    first, second = connect(), blocking_conn(connect)
    with first.transaction():
        assert claim_all(first, ["c", "a"], "first") == {"c": 2, "a": 2}
        loser = background(claim_all, second, ["a", "b", "c"], "second")
        wait_blocked(conn, second)
    assert loser.result(timeout=BOUND) == {}
    # Never a subset: b, which nobody else wanted, was not granted either.
    assert one(conn, "SELECT state FROM lease_status('b')") == "released"


def test_a_claimer_waiting_on_a_rolled_back_claim_all_gets_every_name(
    conn: Conn, connect: Connect, background: Callable[..., Future[Any]]
) -> None:
    first, second = connect(), blocking_conn(connect)
    tx = first.transaction()
    tx.__enter__()
    assert claim_all(first, ["a", "b"], "first") == {"a": 1, "b": 1}
    winner = background(claim_all, second, ["b", "a", "c"], "second")
    wait_blocked(conn, second)
    tx.__exit__(psycopg.Rollback, psycopg.Rollback(), None)
    assert winner.result(timeout=BOUND) == {"b": 1, "a": 1, "c": 1}


def test_a_fenced_transaction_on_one_name_makes_claim_all_busy_and_grants_none(
    conn: Conn, connect: Connect
) -> None:
    conn.execute("CREATE TABLE report (id int PRIMARY KEY, note text)")
    conn.execute("INSERT INTO report VALUES (1, 'none')")
    assert one(conn, "SELECT lease_claim('b', %s, 'alice')", (HOUR,)) == 1
    writer, claimer = connect(), connect()
    with writer.transaction():
        writer.execute("UPDATE report SET note = 'fenced' WHERE lease_holds('b', 'alice', 1)")
        conn.execute(
            "UPDATE pylease_leases SET expires_at = clock_timestamp() - interval '1s'"
            " WHERE name = 'b'"
        )
        # Waits lock_timeout (2 s) for the writer's lock on b, then is busy.
        assert claim_all(claimer, ["a", "b", "c"], "bob") == {}
        assert conn.execute("SELECT name FROM lease_status()").fetchall() == [("b",)]
    assert claim_all(claimer, ["a", "b", "c"], "bob") == {"a": 1, "b": 2, "c": 1}


def _deadlocks(conn: Conn) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(
        one(conn, "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    )


def test_claim_all_of_overlapping_names_in_opposite_orders_never_deadlocks(
    dsn: str, conn: Conn
) -> None:
    """Sessions claim overlapping sets of names, listed in opposite orders, some new
    and some not, and release them; an observer checks in single statements that no
    set is ever seen partly granted. No deadlock is detected by the server."""
    sets = [
        ["a", "b", "c", "d"],
        ["d", "c", "b", "a"],
        ["c", "a"],
        ["b", "d", "e"],
        ["e", "b", "a"],
    ]
    before = _deadlocks(conn)
    stop = threading.Event()
    errors: list[BaseException] = []
    grants = [0] * len(sets)
    seen_partial: list[Any] = []

    def worker(number: int) -> None:
        names = sets[number]
        rng = random.Random(number)
        try:
            with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as c:
                attempt = 0
                while not stop.is_set():
                    attempt += 1
                    holder = f"w{number}-{attempt}"
                    mine = [f"{n}{attempt % 7}" if rng.random() < 0.2 else n for n in names]
                    got = claim_all(c, mine, holder)
                    if got:
                        assert sorted(got) == sorted(mine)
                        grants[number] += 1
                        released = c.execute(
                            "SELECT * FROM lease_release_all(%s, %s)", (mine[::-1], holder)
                        ).fetchall()
                        assert all(r[1] for r in released), released
        except BaseException as exc:
            errors.append(exc)

    def observer() -> None:
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as c:
            while not stop.is_set():
                # Every tenure of a claim_all has one holder for all its names.
                rows = c.execute(
                    "SELECT holder, array_agg(name ORDER BY name) FROM lease_status()"
                    " WHERE held GROUP BY holder"
                ).fetchall()
                for holder, held in rows:
                    number = int(holder[1 : holder.index("-")])
                    if len(held) != len(sets[number]):
                        seen_partial.append((holder, held))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(len(sets))]
    threads.append(threading.Thread(target=observer))
    for t in threads:
        t.start()
    time.sleep(4)
    stop.set()
    for t in threads:
        t.join(BOUND)
    assert not errors, errors
    assert not seen_partial, seen_partial[:5]
    assert all(grants), grants
    # A session's statistics reach the shared counters when it ends (they all ended;
    # the server notices a closed connection shortly after).
    time.sleep(1.0)
    assert _deadlocks(conn) == before


# -- bad input, in SQL: the messages of Python's checks, the parameter named ------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("SELECT * FROM permit_claim('s', 0, '1h', 'h')", "max_permits must be at least 1"),
        ("SELECT * FROM permit_claim('s', 10001, '1h', 'h')", "max_permits must be at most 10000"),
        ("SELECT * FROM permit_claim('s', NULL, '1h', 'h')", "max_permits must not be NULL"),
        ("SELECT * FROM permit_claim('s', 2, '1h', 'h', 3)", "permits must be at most max_permits"),
        ("SELECT * FROM permit_claim('s', 2, '1h', 'h', 0)", "permits must be at least 1"),
        ("SELECT * FROM permit_claim('s', 2, '0s', 'h')", "ttl must be positive"),
        ("SELECT * FROM permit_claim('', 2, '1h', 'h')", "name must not be empty"),
        ("SELECT * FROM permit_claim('s', 2, '1h', '')", "holder must not be empty"),
        ("SELECT permit_renew('s', 'h', '-1s')", "ttl must be positive"),
        ("SELECT permit_release('s', NULL)", "holder must not be NULL"),
        ("SELECT permit_holds('s', 'h', NULL)", "fence must not be NULL"),
        ("SELECT permit_set_max('s', 0)", "max_permits must be at least 1"),
        ("SELECT * FROM lease_claim_all('{}', '1h', 'h')", "names must not be empty"),
        ("SELECT * FROM lease_claim_all(NULL, '1h', 'h')", "names must not be NULL"),
        ("SELECT * FROM lease_claim_all('{a,b,a}', '1h', 'h')", "names must not hold a name twice"),
        (
            "SELECT * FROM lease_claim_all(array_fill('x'::text, ARRAY[1001]), '1h', 'h')",
            "names must hold at most 1000 names",
        ),
        (
            "SELECT * FROM lease_claim_all('{a,\"\"}', '1h', 'h')",
            "names must hold only non-empty texts of at most 200 characters",
        ),
        ("SELECT * FROM lease_claim_all('{a}', '1h', '')", "holder must not be empty"),
        ("SELECT * FROM lease_release_all('{a,a}', 'h')", "names must not hold a name twice"),
    ],
)
def test_bad_input_raises_22023_naming_the_parameter_and_changes_nothing(
    conn: Conn, call: str, message: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        conn.execute(call)  # type: ignore[call-overload]
    assert caught.value.diag.message_primary == f"pylease: {message}"
    assert caught.value.diag.column_name == message.split(" ", 1)[0]
    assert conn.execute("SELECT count(*) FROM pylease_names").fetchone() == (0,)
