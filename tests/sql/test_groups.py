"""Groups (contract 5.5): the assignment as documented, its properties, and the races of
membership on PostgreSQL scripted on two sessions.

The assignment is written here once more, in Python, from its description in
docs/sql.md (``assignment`` below); both backends must give exactly what it gives, and
the properties the contract promises are checked on it with hypothesis. The scenarios
that hold on both backends are in tests/sql/test_conformance.py.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pylease.sqlite import SqliteBackend, connect
from tests.sql.test_permits_and_several_names import BOUND, blocking_conn, one, wait_blocked

Conn = psycopg.Connection[Any]
Connect = Callable[..., Conn]

HOUR = timedelta(hours=1)
SHORT = timedelta(milliseconds=300)
PAST_SHORT = 0.45

# -- the assignment, as docs/sql.md describes it -----------------------------------

_M32 = 0xFFFFFFFF


def _fnv(h: int, data: bytes) -> int:
    for byte in data:
        h = ((h ^ byte) * 16777619) & _M32
    return h


def score(member: str, part: int) -> int:
    h = _fnv(_fnv(2166136261, member.encode()), part.to_bytes(4, "big"))
    h ^= h >> 16
    h = (h * 0x21F0AAAD) & _M32
    h ^= h >> 15
    h = (h * 0x735A2D97) & _M32
    return h ^ (h >> 15)


def assignment(members: list[str], partitions: int) -> dict[int, str]:
    """Bounded-load rendezvous hashing: the pairs by score, highest first (then member
    bytes, then partition); a pair places its partition while it has no member and its
    member has fewer than q, or q while fewer than r members have q + 1."""
    ordered = sorted(set(members), key=str.encode)
    if not ordered:
        return {}
    q, r = divmod(partitions, len(ordered))
    pairs = sorted(
        ((score(m, p), i, p) for i, m in enumerate(ordered) for p in range(partitions)),
        key=lambda pair: (-pair[0], pair[1], pair[2]),
    )
    owner: dict[int, str] = {}
    load = [0] * len(ordered)
    extra = 0
    for _score, i, p in pairs:
        if p not in owner and load[i] < q + (extra < r):
            extra += load[i] == q
            load[i] += 1
            owner[p] = ordered[i]
    return dict(sorted(owner.items()))


def moved(before: dict[int, str], after: dict[int, str]) -> int:
    return sum(before[p] != after[p] for p in before)


NAMES = st.text(alphabet="abcxyz-_0é€\U0001f600", min_size=1, max_size=8)
MEMBER_SETS = st.lists(NAMES, min_size=1, max_size=20, unique=True)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(members=MEMBER_SETS, partitions=st.integers(1, 128), joiner=NAMES, seed=st.integers())
def test_the_assignment_is_balanced_deterministic_and_moves_little_on_a_join(
    members: list[str], partitions: int, joiner: str, seed: int
) -> None:
    if joiner in members:
        return
    before = assignment(members, partitions)
    # Every partition has one of the members; each member floor or ceil of its share.
    assert sorted(before) == list(range(partitions))
    assert set(before.values()) <= set(members)
    loads = Counter(before.values())
    share = partitions / len(members)
    assert all(math.floor(share) <= loads[m] <= math.ceil(share) for m in members), loads
    # A pure function of the set of members.
    shuffled = [*members, *members[:3]]
    random.Random(seed).shuffle(shuffled)
    assert assignment(shuffled, partitions) == before
    # A join moves about partitions/members: at most about twice that while every
    # member has 8 or more, and never more than about sqrt(partitions) beyond.
    after = assignment([*members, joiner], partitions)
    count = moved(before, after)
    most = 2 * math.ceil(share)
    if len(members) <= 8 and share >= 8:
        assert count <= most + 2, (count, most)
    assert count <= most + 2 * math.sqrt(partitions), (count, most)
    # The joiner's partitions are the only ones it gained; a leave is the same move back.
    assert moved(after, before) == count


def test_a_leave_moves_only_the_partitions_of_the_member_who_left() -> None:
    """With partitions to spare per member, what the others held stays theirs."""
    before = assignment(["a", "b", "c"], 8)
    after = assignment(["a", "c"], 8)
    assert {p for p in before if before[p] != after[p]} == {p for p in before if before[p] == "b"}


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(members=MEMBER_SETS, partitions=st.integers(1, 80))
def test_both_backends_compute_the_documented_assignment(
    conn: Conn, tmp_path: Path, members: list[str], partitions: int
) -> None:
    expected = assignment(members, partitions)
    rows = conn.execute(
        "SELECT part, member FROM pylease_assignment(%s, %s)", (members, partitions)
    ).fetchall()
    assert dict(rows) == expected
    lite = connect(tmp_path / f"{abs(hash((tuple(members), partitions)))}.sqlite3")
    try:
        backend = SqliteBackend(lite)
        for member in members:
            assert backend.group_join("g", member, HOUR) is not None
        assert backend.group_assignment("g", partitions) == expected
    finally:
        lite.close()


@pytest.mark.parametrize(("members", "partitions"), [(5, 64), (20, 1024)])
def test_large_assignments_agree(conn: Conn, tmp_path: Path, members: int, partitions: int) -> None:
    names = [f"worker-{n}" for n in range(members)]
    expected = assignment(names, partitions)
    for name in names:
        assert one(conn, "SELECT group_join('g', %s, %s)", (name, HOUR)) is not None
    rows = conn.execute("SELECT part, member FROM group_assignment('g', %s)", (partitions,))
    assert dict(rows.fetchall()) == expected
    lite = connect(tmp_path / "large.sqlite3")
    try:
        backend = SqliteBackend(lite)
        for name in names:
            assert backend.group_join("g", name, HOUR) is not None
        assert backend.group_assignment("g", partitions) == expected
    finally:
        lite.close()


# -- membership on PostgreSQL ------------------------------------------------------


def join(conn: Conn, member: str, grp: str = "g", ttl: timedelta = HOUR) -> Any:
    return one(conn, "SELECT group_join(%s, %s, %s)", (grp, member, ttl))


def members(conn: Conn, grp: str = "g") -> list[tuple[str, int]]:
    return [
        tuple(r) for r in conn.execute("SELECT member, incarnation FROM group_members(%s)", (grp,))
    ]


def rows(conn: Conn) -> list[tuple[str, int]]:
    """Every member row, gone ones too."""
    return [
        tuple(r)
        for r in conn.execute("SELECT member, incarnation FROM pylease_members ORDER BY member")
    ]


@pytest.fixture
def background() -> Iterator[Callable[..., Future[Any]]]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield pool.submit


def test_a_busy_join_takes_no_transaction_id_and_writes_no_wal(conn: Conn, conn2: Conn) -> None:
    assert join(conn, "a") == 1
    with conn2.transaction():
        assert join(conn2, "a") is None
        assert one(conn2, "SELECT pg_current_xact_id_if_assigned()") is None
    attempts = []
    for _ in range(50):
        before = one(conn2, "SELECT pg_current_wal_insert_lsn()")
        assert join(conn2, "a") is None
        after = one(conn2, "SELECT pg_current_wal_insert_lsn()")
        attempts.append((before, after))
        if before == after:
            break
    else:
        pytest.fail(f"the WAL insert position moved around every busy join: {attempts}")
    before = one(conn2, "SELECT pg_current_wal_insert_lsn()")
    assert join(conn2, "b") == 2
    assert one(conn2, "SELECT pg_current_wal_insert_lsn()") > before


def heard(listener: Conn, sender: Conn) -> list[str]:
    """The payloads of the pylease notifications sent before now: ``sender`` sends a
    last one, and notifications of one session arrive in the order of its commits."""
    sender.execute("NOTIFY pylease, 'marker'")
    payloads = []
    for notify in listener.notifies(timeout=BOUND):
        if notify.payload == "marker":
            return payloads
        payloads.append(notify.payload)
    pytest.fail(f"the marker never came; heard {payloads}")


def test_joins_and_leaves_notify_the_group_renewals_and_busy_joins_do_not(
    conn: Conn, conn2: Conn
) -> None:
    conn2.execute("LISTEN pylease")
    assert join(conn, "a") == 1
    assert heard(conn2, conn) == ["g"]
    assert join(conn, "a") is None
    assert one(conn, "SELECT group_renew('g', 'a')") is True
    assert one(conn, "SELECT group_leave('g', 'nobody')") is False
    assert heard(conn2, conn) == []
    assert one(conn, "SELECT group_leave('g', 'a')") is True
    assert join(conn, "b") == 2
    assert heard(conn2, conn) == ["g", "g"]


@pytest.mark.parametrize("first", ["commits", "rolls back"])
def test_a_join_of_a_name_being_joined_waits_and_then_is_busy_or_joins(
    conn: Conn, connect: Connect, background: Callable[..., Future[Any]], first: str
) -> None:
    joiner, second = connect(), blocking_conn(connect)
    with joiner.transaction():
        assert join(joiner, "a") == 1
        late = background(join, second, "a")
        wait_blocked(conn, second)
        assert not late.done()
        if first == "rolls back":
            raise psycopg.Rollback
    assert late.result(timeout=BOUND) == (None if first == "commits" else 1)
    assert members(conn) == [("a", 1)]


def test_joins_of_one_group_take_turns_and_incarnations_follow_the_commits(
    conn: Conn, connect: Connect, background: Callable[..., Future[Any]]
) -> None:
    first, second = connect(), blocking_conn(connect)
    with first.transaction():
        assert join(first, "a") == 1
        other = background(join, second, "b")
        wait_blocked(conn, second)
        # Another group is not held up.
        assert join(conn, "a", grp="h") == 1
    assert other.result(timeout=BOUND) == 2
    assert members(conn) == [("a", 1), ("b", 2)]


def test_renewals_and_leaves_never_wait_for_a_join(conn: Conn, connect: Connect) -> None:
    assert join(conn, "a") == 1
    joiner, keeper = connect(), connect()
    keeper.execute("SET lock_timeout = '1s'")
    with joiner.transaction():
        assert join(joiner, "b") == 2
        assert one(keeper, "SELECT group_renew('g', 'a', %s)", (HOUR,)) is True
        assert one(keeper, "SELECT group_leave('g', 'a')") is True


FENCED_WRITE = "UPDATE report SET note = %s WHERE id = 1 AND member_holds('g', %s, %s)"


@pytest.fixture
def report(conn: Conn) -> Conn:
    conn.execute("CREATE TABLE report (id int PRIMARY KEY, note text)")
    conn.execute("INSERT INTO report VALUES (1, 'none')")
    return conn


def test_a_write_fenced_by_membership_holds_off_the_next_join_of_the_name(
    report: Conn, connect: Connect
) -> None:
    conn = report
    assert join(conn, "a", ttl=SHORT) == 1
    writer, joiner = connect(), connect()
    with writer.transaction():
        assert writer.execute(FENCED_WRITE, ("fenced", "a", 1)).rowcount == 1
        # Renewing and leaving pass the writer's lock...
        assert one(joiner, "SELECT group_renew('g', 'a')") is True
        assert one(joiner, "SELECT group_leave('g', 'a')") is True
        # ...a new incarnation does not: after lock_timeout (2 s) the join is busy.
        assert join(joiner, "a") is None
        assert members(conn) == []
    assert join(joiner, "a") == 2
    assert writer.execute(FENCED_WRITE, ("stale", "a", 1)).rowcount == 0
    assert writer.execute(FENCED_WRITE, ("fresh", "a", 2)).rowcount == 1
    assert one(conn, "SELECT note FROM report") == "fresh"


def test_a_join_deletes_the_rows_of_gone_members_but_not_one_a_fenced_write_holds(
    report: Conn, connect: Connect
) -> None:
    conn = report
    assert join(conn, "a") == 1
    assert join(conn, "b", ttl=SHORT) == 2
    assert join(conn, "c") == 3
    assert one(conn, "SELECT group_leave('g', 'a')") is True
    writer = connect()
    with writer.transaction():
        assert writer.execute(FENCED_WRITE, ("fenced", "c", 3)).rowcount == 1
        assert one(conn, "SELECT group_leave('g', 'c')") is True
        time.sleep(PAST_SHORT)
        assert rows(conn) == [("a", 1), ("b", 2), ("c", 3)]
        # Gone: a left, b expired, c left under the writer's lock (skipped, not waited for).
        assert join(conn, "d") == 4
        assert rows(conn) == [("c", 3), ("d", 4)]
    assert join(conn, "e") == 5
    assert rows(conn) == [("d", 4), ("e", 5)]
    # The incarnations of deleted rows are never issued again.
    assert join(conn, "a") == 6


def test_incarnations_start_at_the_floor_of_the_timeline(conn: Conn) -> None:
    timeline = one(
        conn, "SELECT ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint"
    )
    assert join(conn, "a") == max(1, ((timeline - 1) << 40) + 1)


def test_a_leave_alone_commits_without_the_flush(conn: Conn) -> None:
    """A leave lost in a crash only keeps the member until its expiry."""
    conn.execute("SET synchronous_commit = on")
    with conn.transaction():
        assert join(conn, "a") == 1
        assert one(conn, "SELECT group_renew('g', 'a')") is True
        assert one(conn, "SELECT group_leave('g', 'a')") is True
        # The caller wrote first (the join): its writes keep their flush.
        assert one(conn, "SHOW synchronous_commit") == "on"
    assert join(conn, "b") == 2
    with conn.transaction():
        assert one(conn, "SELECT group_leave('g', 'b')") is True
        assert one(conn, "SHOW synchronous_commit") == "off"
    assert one(conn, "SHOW synchronous_commit") == "on"


def test_the_assignment_is_of_the_live_members(conn: Conn) -> None:
    assert join(conn, "a") == 1
    assert join(conn, "b", ttl=SHORT) == 2
    assert join(conn, "c") == 3
    assert one(conn, "SELECT group_leave('g', 'c')") is True
    time.sleep(PAST_SHORT)
    got = dict(conn.execute("SELECT part, member FROM group_assignment('g', 16)").fetchall())
    assert got == assignment(["a"], 16)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("SELECT group_join(NULL, 'a', '1h')", "grp must not be NULL"),
        ("SELECT group_join(repeat('g', 191), 'a', '1h')", "grp must be at most 190 characters"),
        ("SELECT group_join('g', '', '1h')", "member must not be empty"),
        ("SELECT group_join('g', 'a', NULL)", "ttl must not be NULL"),
        ("SELECT group_join('g', 'a', '367 days')", "ttl must be at most 366 days"),
        (
            "SELECT group_join('g', 'a', '1h', to_jsonb(repeat('x', 8191)))",
            "data must be at most 8192 characters as JSON text",
        ),
        ("SELECT group_renew('g', 'a', '-1s')", "ttl must be positive"),
        (
            "SELECT group_renew('g', repeat('m', 201), NULL, 1)",
            "member must be at most 200 characters",
        ),
        ("SELECT group_leave('', 'a')", "grp must not be empty"),
        ("SELECT group_leave('g', NULL, 1)", "member must not be NULL"),
        ("SELECT * FROM group_members(NULL)", "grp must not be NULL"),
        ("SELECT member_holds('g', 'a', NULL)", "incarnation must not be NULL"),
        ("SELECT * FROM group_assignment('g', 0)", "partitions must be at least 1"),
        ("SELECT * FROM group_assignment('g', 1025)", "partitions must be at most 1024"),
        ("SELECT * FROM group_assignment('', 1)", "grp must not be empty"),
    ],
)
def test_bad_input_raises_22023_naming_the_parameter_and_changes_nothing(
    conn: Conn, call: str, message: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        conn.execute(call)  # type: ignore[call-overload]
    assert caught.value.diag.message_primary == f"pylease: {message}"
    assert caught.value.diag.column_name == message.split(" ", 1)[0]
    assert conn.execute("SELECT count(*) FROM pylease_groups").fetchone() == (0,)


def test_a_join_in_a_read_only_transaction_says_so(conn: Conn) -> None:
    with conn.transaction():
        conn.execute("SET TRANSACTION READ ONLY")
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction, match="read-write"):
            join(conn, "a")
