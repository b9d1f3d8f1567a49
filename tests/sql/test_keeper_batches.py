"""The keeper's renewal of a batch of every kind (pylease_renew_held; migration 0022).

PostgreSQL renews a batch's leases and members in one statement, and its readers and
semaphores in statements of their own before it; these tests mix every kind in one
batch, with elements that share a name and a holder across kinds, and check that each
element is answered in its place, by its own kind, on both backends.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors

from pylease._backend import Backend
from pylease.postgres import PostgresBackend
from pylease.sqlite import SqliteBackend, connect

Conn = psycopg.Connection[Any]
LONG = timedelta(seconds=30)
DAY = timedelta(days=1)
HELD = (
    "SELECT name, renewed FROM pylease_renew_held(%s::text[], %s::text[], %s::text[],"
    " %s::interval[], %s::bigint[], %s::integer[])"
)


@pytest.fixture(params=["postgres", "sqlite"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "postgres":
        yield PostgresBackend(request.getfixturevalue("conn"))
        return
    conn = connect(tmp_path / "x.sqlite3")
    try:
        yield SqliteBackend(conn)
    finally:
        conn.close()


def test_a_batch_of_every_kind_answers_each_element_in_its_place(backend: Backend) -> None:
    """Leases, a member, a reader and a holder's permits in one batch, a lease and a
    member named twice, and a lost element of each kind: each answer is in its place,
    the step-down request only on the lease it was made for."""
    a = backend.claim("a", LONG, "h1")
    b = backend.claim("b", LONG, "h1")
    incarnation = backend.group_join("g", "h1", LONG)
    epoch = backend.claim_shared("doc", LONG, "r")
    slots = backend.permit_claim("sem", 3, LONG, "h1", 2)
    assert None not in (a, b, incarnation, epoch) and len(slots) == 2
    assert backend.request_release("b", "ops") is True
    slot, fence = min(slots.items())
    batch = [
        ("lease", "a", "h1", DAY, a, None, True),
        ("member", "g", "h1", DAY, incarnation, None, True),
        ("shared", "doc", "r", DAY, epoch, None, True),
        ("permit", "sem", "h1", DAY, fence, slot, True),
        ("lease", "b", "h1", None, b, None, True),
        ("lease", "gone", "h1", DAY, None, None, False),
        ("lease", "a", "h1", None, None, None, True),
        ("member", "g", "h2", DAY, None, None, False),
        ("shared", "doc", "r2", DAY, None, None, False),
        ("member", "g", "h1", None, None, None, True),
        ("permit", "sem", "nobody", DAY, None, None, False),
        ("lease", "b", "h1", DAY, b + 1, None, False),  # b's tenure is b, not b + 1
    ]
    kinds, names, holders, ttls, fences, slot_list, expected = map(list, zip(*batch, strict=True))
    rows = backend.renew_held(kinds, names, holders, ttls, fences, slot_list)
    assert [(r.name, r.renewed) for r in rows] == list(zip(names, expected, strict=True))
    for row, ttl in zip(rows, ttls, strict=True):
        assert (row.expires_at is None) is (row.server_time is None) is (not row.renewed)
        if row.renewed:
            assert row.expires_at is not None and row.server_time is not None
            # Never earlier than the lease's own ttl; a day where it was named with one.
            least = timedelta(hours=23) if ttl == DAY and row.name != "g" else LONG / 2
            assert row.expires_at - row.server_time > least
    asked = [r.release_requested_by for r in rows]
    assert asked == [None] * 4 + ["ops"] + [None] * 7
    # Each kind's row was renewed, and only its holder's.
    [row_a] = backend.status("a")
    assert row_a.ttl == DAY
    [member] = backend.group_members("g")
    assert member.expires_at - member.renewed_at > timedelta(hours=23)
    [share] = [h for h in backend.holders("doc") if h.holder == "r"]
    assert share.expires_at - share.renewed_at > timedelta(hours=23)
    for permit in backend.permit_status("sem"):
        if permit.holder == "h1":
            assert permit.expires_at - permit.renewed_at > timedelta(hours=23)


def test_elements_of_one_name_and_holder_answer_for_their_own_kind(backend: Backend) -> None:
    """A group and a lease may share a name, and a member and a holder a name: a lease
    element never takes a member's answer, nor a member element a lease's."""
    assert backend.claim("x", LONG, "h") is not None  # a lease x, and no group x
    assert backend.group_join("y", "h", LONG) is not None  # a group y, and no lease y
    before = backend.status("x")[0].expires_at
    rows = backend.renew_held(
        ["member", "lease", "lease", "member"],
        ["x", "y", "x", "y"],
        ["h", "h", "h", "h"],
        [DAY, DAY, None, None],
        [None, None, None, None],
        [None, None, None, None],
    )
    assert [(r.name, r.renewed) for r in rows] == [
        ("x", False),
        ("y", False),
        ("x", True),
        ("y", True),
    ]
    # The member element of x renewed no lease: x kept the ttl it was claimed with.
    [row] = backend.status("x")
    assert row.ttl == LONG and row.expires_at >= before
    assert backend.status("y") == []


@pytest.mark.parametrize(
    "kinds",
    [None, ["lease", None], ["lease", "lock"], ["lease"], ["lease", "member", "lease"]],
    ids=["null", "a-null-kind", "unknown", "too-few", "too-many"],
)
def test_kinds_that_are_not_one_known_kind_per_element_renew_nothing(
    conn: Conn, kinds: list[str | None] | None
) -> None:
    """The kinds are tested without a query, as whole arrays: still 22023 naming kinds
    for a NULL array, a NULL or unknown element, or as many as names, and nothing is
    renewed."""
    assert conn.execute("SELECT lease_claim('a', %s, 'h')", (LONG,)).fetchone() == (1,)
    assert conn.execute("SELECT group_join('g', 'h', %s)", (LONG,)).fetchone() is not None
    before = conn.execute("SELECT expires_at FROM lease_status('a')").fetchone()
    params = (kinds, ["a", "g"], ["h", "h"], [DAY, DAY], None, None)
    with pytest.raises(pg_errors.InvalidParameterValue, match="kinds must hold") as info:
        conn.execute(HELD, params)
    assert info.value.diag.column_name == "kinds"
    assert conn.execute("SELECT expires_at FROM lease_status('a')").fetchone() == before
    [expiry] = conn.execute("SELECT expires_at - renewed_at FROM group_members('g')").fetchone()
    assert expiry <= LONG
