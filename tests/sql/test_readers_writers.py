"""Readers and writers on PostgreSQL (contract 5.2), scripted on two sessions.

A reader's claim never updates the name's lease row: it locks it FOR KEY SHARE, which
every exclusive grant (a new fence, a key column) conflicts with. These scripts hold
one session's statement open in a transaction and prove (pg_stat_activity) that the
other waits, then let the first commit: the waiter must then see what committed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pylease._resources import data_dir
from tests.sql.test_races import (
    HOUR,
    SHORT,
    Connect,
    background,
    blocking_conn,
    one,
    wait_blocked,
    wait_expired,
)

__all__ = ["background"]  # a fixture, used by name

Conn = psycopg.Connection[Any]
Submit = Callable[..., Future[Any]]

CLAIM = "SELECT lease_claim('doc', %s, %s)"
SHARE = "SELECT lease_claim_shared('doc', %s, %s)"


def holders(conn: Conn) -> list[tuple[str, str, int]]:
    return conn.execute("SELECT holder, mode, fence FROM lease_holders('doc')").fetchall()


def wait_share_expired(conn: Conn, holder: str, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while one(
        conn,
        "SELECT expires_at > clock_timestamp() FROM pylease_shared"
        " WHERE name = 'doc' AND holder = %s",
        (holder,),
    ):
        assert time.monotonic() < deadline, f"the share of {holder!r} never expired"
        time.sleep(0.02)


@pytest.fixture(params=["first claimed by the reader", "released by a writer"])
def doc(request: pytest.FixtureRequest, conn: Conn) -> int:
    """The name 'doc', new or released by a writer: the epoch a reader gets."""
    if request.param == "first claimed by the reader":
        return 0
    assert one(conn, CLAIM, (HOUR, "old")) == 1
    assert one(conn, "SELECT lease_release('doc', 'old')") is True
    return 1


# -- a reader and a writer at once ------------------------------------------------


def test_a_writer_that_waited_for_a_readers_claim_finds_it(
    doc: int, conn: Conn, connect: Connect, background: Submit
) -> None:
    reader, writer = connect(), blocking_conn(connect)
    with reader.transaction():
        assert one(reader, SHARE, (HOUR, "r")) == doc
        # The writer saw no reader yet (uncommitted): it must wait for the reader's lock...
        claim = background(one, writer, CLAIM, (HOUR, "w"))
        wait_blocked(conn, writer)
        assert not claim.done()
    # ... and then see the reader: busy, not granted beside it.
    assert claim.result(timeout=30) is None
    assert holders(conn) == [("r", "shared", doc)]


def test_a_readers_claim_that_waited_for_a_writers_grant_is_busy(
    doc: int, conn: Conn, connect: Connect, background: Submit
) -> None:
    writer, reader = connect(), blocking_conn(connect)
    with writer.transaction():
        assert one(writer, CLAIM, (HOUR, "w")) == doc + 1
        share = background(one, reader, SHARE, (HOUR, "r"))
        wait_blocked(conn, reader)
    assert share.result(timeout=30) is None
    assert holders(conn) == [("w", "exclusive", doc + 1)]


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT lease_claim_new('doc', '1 hour', 'w')",
        "SELECT lease_steal('doc', '1 hour', 'w')",
        "SELECT count(*) FROM lease_claim_all(ARRAY['doc', 'x'], '1 hour', 'w')",
    ],
    ids=["claim_new", "steal", "claim_all"],
)
def test_every_exclusive_grant_that_waited_for_a_readers_claim_finds_it(
    statement: str, conn: Conn, connect: Connect, background: Submit
) -> None:
    assert one(conn, CLAIM, (HOUR, "old")) == 1
    assert one(conn, "SELECT lease_release('doc', 'old')") is True
    reader, writer = connect(), blocking_conn(connect)
    with reader.transaction():
        assert one(reader, SHARE, (HOUR, "r")) == 1
        grant = background(one, writer, statement)
        wait_blocked(conn, writer)
    assert grant.result(timeout=30) in (None, 0)
    assert holders(conn) == [("r", "shared", 1)]


def test_a_grant_that_deadlocks_with_a_fenced_transaction_turning_reader_is_busy(
    conn: Conn, connect: Connect, background: Submit
) -> None:
    """A fenced transaction (its row lock) that then claims the name as a reader waits for
    the grant's advisory lock while the grant waits for its row: PostgreSQL cancels the
    grant, which waited first, and the writer hears busy, not an error."""
    assert one(conn, CLAIM, (timedelta(seconds=2), "old")) == 1
    fenced, writer = connect(), blocking_conn(connect)
    with fenced.transaction():
        assert one(fenced, "SELECT lease_holds('doc', 'old', 1)") is True
        wait_expired(conn, "doc")
        claim = background(one, writer, CLAIM, (HOUR, "w"))
        wait_blocked(conn, writer)
        # The reader takes over from the expired writer once the grant gave up.
        assert one(fenced, SHARE, (HOUR, "r")) == 1
    assert claim.result(timeout=30) is None
    assert holders(conn) == [("r", "shared", 1)]


def test_readers_never_wait_for_each_other(conn: Conn, connect: Connect) -> None:
    first, second = connect(), connect()
    second.execute("SET lock_timeout = '1s'")  # a wait would fail the test, not hang it
    assert one(first, SHARE, (HOUR, "r1")) == 0
    with first.transaction():
        # Another reader's claim, renewal and fenced check held open...
        assert one(first, SHARE, (HOUR, "r1")) == 0
        assert one(first, "SELECT lease_renew('doc', 'r1')") is True
        assert one(first, "SELECT lease_holds('doc', 'r1', 0)") is True
        # ... and a reader claims, renews, checks and leaves meanwhile.
        assert one(second, SHARE, (HOUR, "r2")) == 0
        assert one(second, "SELECT lease_renew('doc', 'r2')") is True
        assert one(second, "SELECT lease_holds('doc', 'r2', 0)") is True
        assert one(second, "SELECT lease_release('doc', 'r2')") is True
        assert one(second, SHARE, (HOUR, "r3")) == 0
    assert [h for h, _, _ in holders(conn)] == ["r1", "r3"]


def test_a_readers_claim_that_started_before_the_names_first_claim_is_not_busy(
    conn: Conn, connect: Connect, background: Submit
) -> None:
    """The name's row made by a reader's first claim holds nothing, though it expires
    at that claim's start: a reader whose claim started earlier and reads it afterwards
    is granted, not busy (no writer holds or waits). The earlier claim is held at its
    first read (a table it reads, locked) while the other claims and commits; the claim
    gives up such a wait after its lock_timeout (2 s), and a loaded machine may take
    that long, so the script runs again on a new name until it ran to its end."""
    observer, early = connect(), connect()
    claim_on = "SELECT lease_claim_shared(%s, '1 hour', %s)"
    for attempt in range(5):
        name = f"first-{attempt}"
        with conn.transaction():
            conn.execute("LOCK TABLE pylease_waiters IN ACCESS EXCLUSIVE MODE")
            claim = background(one, early, claim_on, (name, "early"))
            wait_blocked(observer, early)
            assert one(conn, claim_on, (name, "first")) == 0
        try:
            epoch = claim.result(timeout=30)
        except psycopg.errors.LockNotAvailable:
            continue
        assert epoch == 0
        found = conn.execute("SELECT holder FROM lease_holders(%s) ORDER BY 1", (name,))
        assert [h for (h,) in found] == ["early", "first"]
        return
    pytest.fail("the earlier claim never waited through the script (the machine is slow)")


# -- renewals ---------------------------------------------------------------------


def test_a_writer_that_waited_for_a_readers_renewal_finds_the_reader(
    conn: Conn, connect: Connect, background: Submit
) -> None:
    assert one(conn, SHARE, (SHORT, "r")) == 0
    wait_share_expired(conn, "r")
    renewer, writer = connect(), blocking_conn(connect)
    with renewer.transaction():
        # Expired, but no writer was granted since: the renewal holds the share again.
        assert one(renewer, "SELECT lease_renew('doc', 'r', '1 hour')") is True
        claim = background(one, writer, CLAIM, (HOUR, "w"))
        wait_blocked(conn, writer)
    assert claim.result(timeout=30) is None
    assert holders(conn) == [("r", "shared", 0)]


def test_a_readers_renewal_that_waited_for_a_writers_grant_fails(
    conn: Conn, connect: Connect, background: Submit
) -> None:
    assert one(conn, SHARE, (SHORT, "r")) == 0
    wait_share_expired(conn, "r")
    writer, renewer = connect(), blocking_conn(connect)
    with writer.transaction():
        assert one(writer, CLAIM, (HOUR, "w")) == 1
        renewal = background(one, renewer, "SELECT lease_renew('doc', 'r', '1 hour')")
        wait_blocked(conn, renewer)
    assert renewal.result(timeout=30) is False
    # The keeper's statement and renew_many agree.
    assert conn.execute(
        "SELECT renewed FROM pylease_renew_held(ARRAY['shared'], ARRAY['doc'], ARRAY['r'],"
        " ARRAY[NULL]::interval[])"
    ).fetchall() == [(False,)]
    assert conn.execute(
        "SELECT renewed FROM lease_renew_many(ARRAY['doc'], ARRAY['r'])"
    ).fetchall() == [(False,)]


def test_a_dead_writers_late_renewal_never_joins_the_readers(conn: Conn) -> None:
    assert one(conn, CLAIM, (SHORT, "w")) == 1
    wait_expired(conn, "doc")
    # The writer died: the reader takes the name over, with the writer's fence as epoch.
    assert one(conn, SHARE, (HOUR, "r")) == 1
    assert one(conn, "SELECT lease_renew('doc', 'w', '1 hour')") is False
    assert one(conn, CLAIM, (HOUR, "w")) is None
    assert conn.execute(
        "SELECT event, holder, fence, previous_holder FROM lease_history('doc')"
    ).fetchall() == [("taken_over", "r", 1, "w")]


def test_a_readers_takeover_that_waited_for_the_writers_renewal_is_busy(
    conn: Conn, connect: Connect, background: Submit
) -> None:
    assert one(conn, CLAIM, (SHORT, "w")) == 1
    wait_expired(conn, "doc")
    renewer, reader = connect(), blocking_conn(connect)
    with renewer.transaction():
        # The writer's late renewal, still ours: nobody was granted since its expiry.
        assert one(renewer, "SELECT lease_renew('doc', 'w', '1 hour')") is True
        share = background(one, reader, SHARE, (HOUR, "r"))
        wait_blocked(conn, reader)
    assert share.result(timeout=30) is None
    assert holders(conn) == [("w", "exclusive", 1)]


# -- fenced writes ------------------------------------------------------------------


@pytest.fixture
def report(conn: Conn) -> Conn:
    conn.execute("CREATE TABLE report (fence bigint, note text)")
    return conn


FENCED_WRITE = "INSERT INTO report (fence, note) SELECT %s, %s WHERE lease_holds('doc', %s, %s)"


def test_a_stale_readers_fenced_write_is_rejected_after_a_writer_was_granted(
    report: Conn,
) -> None:
    conn = report
    epoch = one(conn, SHARE, (SHORT, "r"))
    assert conn.execute(FENCED_WRITE, (epoch, "read", "r", epoch)).rowcount == 1
    wait_share_expired(conn, "r")
    assert one(conn, CLAIM, (HOUR, "w")) == 1
    assert conn.execute(FENCED_WRITE, (epoch, "stale", "r", epoch)).rowcount == 0
    assert conn.execute(FENCED_WRITE, (1, "written", "w", 1)).rowcount == 1
    assert [n for (n,) in conn.execute("SELECT note FROM report ORDER BY note")] == [
        "read",
        "written",
    ]


def test_a_readers_fenced_transaction_holds_off_a_writers_grant(
    report: Conn, connect: Connect, background: Submit
) -> None:
    conn = report
    assert one(conn, SHARE, (timedelta(seconds=1), "r")) == 0
    fenced, writer = connect(), connect()
    writer.execute("SET statement_timeout = '20s'")
    with fenced.transaction():
        assert fenced.execute(FENCED_WRITE, (0, "first", "r", 0)).rowcount == 1
        wait_share_expired(conn, "r")
        # Expired, so a writer may be granted: after the fenced transaction, not during.
        claim = background(one, writer, CLAIM, (HOUR, "w"))
        wait_blocked(conn, writer)
        assert holders(conn) == []
        assert fenced.execute(FENCED_WRITE, (0, "late", "r", 0)).rowcount == 0
    assert claim.result(timeout=30) == 1
    assert [n for (n,) in conn.execute("SELECT note FROM report")] == ["first"]


# -- writer preference ------------------------------------------------------------


def test_a_waiting_writer_holds_new_readers_off(conn: Conn) -> None:
    assert one(conn, SHARE, (HOUR, "r1")) == 0
    assert one(conn, "SELECT lease_wait('doc', 'writer-process', '1 hour')") is True
    assert one(conn, SHARE, (HOUR, "r2")) is None
    # A reader already in keeps its share: its claim again is no new claim.
    assert one(conn, SHARE, (HOUR, "r1")) == 0
    assert one(conn, "SELECT lease_renew('doc', 'r1')") is True
    # The writer leaves the queue without the lease: readers come in again.
    assert one(conn, "SELECT lease_unwait('doc', 'writer-process', false)") is True
    assert one(conn, SHARE, (HOUR, "r2")) == 0


def test_a_dead_waiting_writer_stops_holding_readers_off_when_its_entry_expires(
    conn: Conn,
) -> None:
    assert one(conn, "SELECT lease_wait('doc', 'dead-process', %s)", (SHORT,)) is True
    assert one(conn, SHARE, (HOUR, "r")) is None
    time.sleep(0.45)
    assert one(conn, SHARE, (HOUR, "r")) == 0


def test_busy_claims_of_readers_and_writers_take_no_transaction_id(conn: Conn, conn2: Conn) -> None:
    assert one(conn, CLAIM, (HOUR, "w")) == 1
    assert one(conn, "SELECT lease_claim_shared('queued', '1 hour', 'r1')") == 0
    assert one(conn, "SELECT lease_wait('queued', 'writer-process', '1 hour')") is True
    assert one(conn, "SELECT lease_claim('read', '1 hour', 'old')") == 1
    assert one(conn, "SELECT lease_release('read', 'old')") is True
    assert one(conn, "SELECT lease_claim_shared('read', '1 hour', 'r1')") == 1
    with conn2.transaction():
        # A reader kept out by a writer, or by a writer in line ...
        assert one(conn2, SHARE, (HOUR, "r")) is None
        assert one(conn2, "SELECT lease_claim_shared('queued', '1 hour', 'r2')") is None
        # ... and a writer kept out by a reader: no row written, none locked.
        for claim in ("lease_claim", "lease_claim_new", "lease_steal"):
            assert one(conn2, f"SELECT {claim}('read', '1 hour', 'w2')") is None  # type: ignore[arg-type]
        assert one(conn2, "SELECT pg_current_xact_id_if_assigned()") is None


# -- waking the waiters -------------------------------------------------------------


def heard(listener: Conn, within: float = 0.5) -> list[str]:
    return [n.payload for n in listener.notifies(timeout=within) if n.channel == "pylease"]


def test_the_last_reader_to_leave_wakes_the_waiters(conn: Conn, connect: Connect) -> None:
    listener = connect()
    listener.execute("LISTEN pylease")
    assert one(conn, SHARE, (HOUR, "r1")) == 0
    assert one(conn, SHARE, (HOUR, "r2")) == 0
    assert one(conn, "SELECT lease_release('doc', 'r1')") is True
    assert heard(listener) == []
    assert one(conn, "SELECT lease_release('doc', 'r2')") is True
    assert heard(listener) == ["doc"]


def test_while_a_writer_waits_every_reader_that_leaves_wakes_it(
    conn: Conn, connect: Connect
) -> None:
    listener = connect()
    listener.execute("LISTEN pylease")
    assert one(conn, SHARE, (HOUR, "r1")) == 0
    assert one(conn, SHARE, (HOUR, "r2")) == 0
    assert one(conn, "SELECT lease_wait('doc', 'writer-process', '1 hour')") is True
    assert one(conn, "SELECT lease_release('doc', 'r1')") is True
    assert heard(listener) == ["doc"]
    # The last waiting writer leaving without the lease wakes the readers it held off.
    assert one(conn, "SELECT lease_unwait('doc', 'writer-process', false)") is True
    assert heard(listener) == ["doc"]


# -- names that are gone -------------------------------------------------------------


def test_prune_skips_a_name_a_reader_is_claiming_and_keeps_one_read_since(
    conn: Conn, connect: Connect
) -> None:
    assert one(conn, SHARE, (SHORT, "r0")) == 0
    wait_share_expired(conn, "r0")
    reader = connect()
    with reader.transaction():
        # The reader's claim holds the name's row until it commits: prune passes it by.
        assert one(reader, SHARE, (HOUR, "r1")) == 0
        assert one(conn, "SELECT lease_prune('0')") == 0
    # Committed: read within the span, the name stays.
    assert one(conn, "SELECT lease_prune('0')") == 0
    assert holders(conn) == [("r1", "shared", 0)]
    assert one(conn, "SELECT lease_release('doc', 'r1')") is True
    assert one(conn, "SELECT lease_prune('0')") == 1
    assert conn.execute("SELECT count(*) FROM pylease_shared").fetchone() == (0,)


# -- renewals that name their tenure: a reader's is its epoch ------------------------

# Each renews the share of 'r' on 'doc' in the tenure %s names, with a ttl of an hour.
NAMED_RENEWALS = {
    "lease_renew": "SELECT lease_renew('doc', 'r', '1 hour', %s)",
    "lease_renew_many": "SELECT renewed FROM lease_renew_many(ARRAY['doc'], ARRAY['r'],"
    " '1 hour', ARRAY[%s]::bigint[])",
    "pylease_renew_held": "SELECT renewed FROM pylease_renew_held(ARRAY['shared'], ARRAY['doc'],"
    " ARRAY['r'], ARRAY['1 hour']::interval[], ARRAY[%s]::bigint[], ARRAY[NULL]::integer[])",
}


def share_expiry(conn: Conn) -> Any:
    return one(conn, "SELECT expires_at FROM pylease_shared WHERE name = 'doc' AND holder = 'r'")


@pytest.mark.parametrize("renewal", sorted(NAMED_RENEWALS))
def test_a_late_renewal_of_a_readers_earlier_epoch_renews_nothing(
    renewal: str, doc: int, conn: Conn
) -> None:
    statement = NAMED_RENEWALS[renewal]
    assert one(conn, SHARE, (SHORT, "r")) == doc
    assert one(conn, statement, (doc,)) is True
    # The reader leaves, a writer comes and goes, and the same reader reads again: a
    # new tenure (epoch) of the same holder.
    assert one(conn, "SELECT lease_release('doc', 'r')") is True
    writer = one(conn, CLAIM, (HOUR, "w"))
    assert writer == doc + 1
    assert one(conn, "SELECT lease_release('doc', 'w')") is True
    assert one(conn, SHARE, (SHORT, "r")) == writer
    before = share_expiry(conn)
    # A renewal sent in the earlier epoch, arriving late, renews nothing...
    assert one(conn, statement, (doc,)) is False
    assert share_expiry(conn) == before
    # ... and one that names the current epoch renews the share (NULL: whatever it is).
    assert one(conn, statement, (writer,)) is True
    assert share_expiry(conn) > before
    assert one(conn, statement, (None,)) is True


def test_the_keepers_statement_renews_a_writer_and_readers_each_in_its_tenure(
    conn: Conn,
) -> None:
    assert one(conn, "SELECT lease_claim('book', %s, 'w')", (HOUR,)) == 1
    assert one(conn, SHARE, (HOUR, "r1")) == 0
    assert one(conn, SHARE, (HOUR, "r2")) == 0
    rows = conn.execute(
        "SELECT name, renewed FROM pylease_renew_held(ARRAY['lease', 'shared', 'shared', 'lease'],"
        " ARRAY['book', 'doc', 'doc', 'book'], ARRAY['w', 'r1', 'r2', 'w'],"
        " ARRAY['1 hour', '1 hour', '1 hour', '1 hour']::interval[],"
        " ARRAY[1, 0, 7, 2]::bigint[], ARRAY[NULL, NULL, NULL, NULL]::integer[])"
    ).fetchall()
    # r2 names an epoch it never had, and the writer's second element a fence it never had.
    assert rows == [("book", True), ("doc", True), ("doc", False), ("book", False)]


# -- a writer whose snapshot predates a reader -------------------------------------

GRANTS = [
    "SELECT lease_claim('doc', '1 hour', 'w')",
    "SELECT lease_claim_new('doc', '1 hour', 'w')",
    "SELECT lease_steal('doc', '1 hour', 'w')",
    "SELECT count(*) FROM lease_claim_all(ARRAY['doc', 'x'], '1 hour', 'w')",
]
GRANT_IDS = ["claim", "claim_new", "steal", "claim_all"]


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
@pytest.mark.parametrize(
    ("readers", "released"),
    [(1, False), (1, True), (2, True)],
    ids=["a reader that made the name", "a reader", "two readers at once"],
)
@pytest.mark.parametrize("statement", GRANTS, ids=GRANT_IDS)
def test_a_writer_whose_snapshot_predates_a_reader_is_never_granted_beside_it(
    statement: str, readers: int, released: bool, isolation: str, conn: Conn, connect: Connect
) -> None:
    """The reader's share is a row the writer's snapshot cannot see: the grant says it
    cannot serialize (40001) rather than grant the name beside a reader. Two readers
    whose claims overlap leave a multixact in the lease row's xmax, one a plain xid. A
    reader that made the name's row meets the writer's insert of it: a row made since
    the snapshot, which every grant answers as a race lost (busy)."""
    epoch = 0
    if released:
        epoch = one(conn, CLAIM, (HOUR, "old"))
        assert one(conn, "SELECT lease_release('doc', 'old')") is True
    writer = connect()
    writer.execute(f"BEGIN ISOLATION LEVEL {isolation}")
    writer.execute("SELECT 1")  # the snapshot is taken now
    sessions = [connect() for _ in range(readers)]
    for i, session in enumerate(sessions):
        session.execute("BEGIN")
        assert one(session, SHARE, (HOUR, f"r{i}")) == epoch
    for session in sessions:
        session.commit()
    if released:
        with pytest.raises(psycopg.errors.SerializationFailure, match="reader may have come"):
            writer.execute(statement)
    else:
        assert one(writer, statement) in (None, 0)
    writer.rollback()
    assert sorted(holders(conn)) == [(f"r{i}", "shared", epoch) for i in range(readers)]


@pytest.mark.parametrize("statement", GRANTS, ids=GRANT_IDS)
def test_a_repeatable_read_writer_that_sees_the_readers_leave_is_granted(
    doc: int, statement: str, conn: Conn, connect: Connect
) -> None:
    """Readers (and a fenced transaction) that committed before the snapshot are seen:
    no serialization failure once they left."""
    for name in ("r0", "r1"):
        assert one(conn, SHARE, (HOUR, name)) == doc
    for name in ("r0", "r1"):
        assert one(conn, "SELECT lease_release('doc', %s, NULL, %s)", (name, doc)) is True
    writer = connect()
    writer.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    assert one(writer, statement) not in (None, 0)
    writer.commit()
    assert [h[:2] for h in holders(conn)] == [("w", "exclusive")]


def test_a_reader_from_before_migration_0024_still_keeps_the_writer_out(empty_dsn: str) -> None:
    """0024 records no sequence mark on the rows it finds (NULL): the first grant of each
    looks for readers, and sees one that claimed before the migration."""
    folder = data_dir("migrations", "postgres")
    files = sorted(p for p in folder.glob("pylease-*.sql") if not p.name.endswith(".rollback.sql"))
    marked = "pylease-0024-readers-write-no-lease-row"
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        for path in (p for p in files if p.stem < marked):
            with c.transaction():
                c.execute(path.read_bytes())
        assert one(c, CLAIM, (HOUR, "old")) == 1
        assert one(c, "SELECT lease_release('doc', 'old')") is True
        assert one(c, SHARE, (HOUR, "r")) == 1
        [upgrade] = [p for p in files if p.stem == marked]
        with c.transaction():
            c.execute(upgrade.read_bytes())
        assert one(c, CLAIM, (HOUR, "w")) is None
        assert holders(c) == [("r", "shared", 1)]
        assert one(c, "SELECT lease_release('doc', 'r')") is True
        assert one(c, CLAIM, (HOUR, "w")) == 2
