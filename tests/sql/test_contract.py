"""The SQL API of CONTRACT section 1, behaviour by behaviour, through raw SQL.

Expiry is real (TTLs under a second, then polling the database's clock); the age
that ``older_than`` looks at is set by ageing the row, never by sleeping long.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors

Conn = psycopg.Connection[Any]

HOUR = timedelta(hours=1)
SHORT = timedelta(milliseconds=300)


def one(conn: Conn, query: Any, params: Any = ()) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def claim(conn: Conn, name: str, ttl: timedelta, holder: str) -> int | None:
    result: int | None = one(conn, "SELECT lease_claim(%s, %s, %s)", (name, ttl, holder))
    return result


def steal(
    conn: Conn, name: str, ttl: timedelta, holder: str, older_than: timedelta | None = None
) -> int | None:
    if older_than is None:
        result: int | None = one(conn, "SELECT lease_steal(%s, %s, %s)", (name, ttl, holder))
    else:
        result = one(conn, "SELECT lease_steal(%s, %s, %s, %s)", (name, ttl, holder, older_than))
    return result


def renew(conn: Conn, name: str, holder: str, ttl: timedelta | None = None) -> bool:
    return bool(one(conn, "SELECT lease_renew(%s, %s, %s)", (name, holder, ttl)))


def release(conn: Conn, name: str, holder: str, min_hold: timedelta | None = None) -> bool:
    return bool(one(conn, "SELECT lease_release(%s, %s, %s)", (name, holder, min_hold)))


def holds(conn: Conn, name: str, holder: str, fence: int) -> bool:
    return bool(one(conn, "SELECT lease_holds(%s, %s, %s)", (name, holder, fence)))


def row(conn: Conn, name: str) -> dict[str, Any]:
    """The table row itself (the tests run as a superuser)."""
    cur = conn.execute("SELECT * FROM pylease_leases WHERE name = %s", (name,))
    values = cur.fetchone()
    assert values is not None, f"no row for {name!r}"
    assert cur.description is not None
    return {col.name: value for col, value in zip(cur.description, values, strict=True)}


def table(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT * FROM pylease_leases ORDER BY name").fetchall()


def status(conn: Conn, name: str | None = None) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT * FROM lease_status(%s)", (name,)).fetchall()


def wait_expired(conn: Conn, name: str, limit: float = 10.0) -> None:
    """Poll the database's clock until the lease's expires_at has passed."""
    deadline = time.monotonic() + limit
    while not one(
        conn, "SELECT expires_at <= clock_timestamp() FROM pylease_leases WHERE name = %s", (name,)
    ):
        assert time.monotonic() < deadline, f"lease {name!r} never expired"
        time.sleep(0.02)


def age(conn: Conn, name: str, by: timedelta) -> None:
    """Move a lease's claim and renewal times into the past, keeping its expiry."""
    conn.execute(
        "UPDATE pylease_leases SET acquired_at = acquired_at - %s, renewed_at = renewed_at - %s"
        " WHERE name = %s",
        (by, by, name),
    )


# -- signatures ---------------------------------------------------------------

SIGNATURES = {
    "lease_claim": ("name text, ttl interval, holder text", "bigint"),
    "lease_claim_new": ("name text, ttl interval, holder text", "bigint"),
    "lease_renew": ("name text, holder text, ttl interval DEFAULT NULL::interval", "boolean"),
    "lease_renew_many": (
        "names text[], holders text[], ttl interval DEFAULT NULL::interval",
        "TABLE(name text, renewed boolean)",
    ),
    "lease_renew_each": (
        "names text[], holders text[], ttls interval[]",
        "TABLE(name text, renewed boolean, expires_at timestamp with time zone,"
        " server_time timestamp with time zone)",
    ),
    "lease_release": (
        "name text, holder text, min_hold interval DEFAULT NULL::interval",
        "boolean",
    ),
    "lease_steal": (
        "name text, ttl interval, holder text, older_than interval DEFAULT '00:00:00'::interval",
        "bigint",
    ),
    "lease_holds": ("name text, holder text, fence bigint", "boolean"),
    "lease_status": (
        "name text DEFAULT NULL::text",
        "TABLE(name text, holder text, fence bigint, acquired_at timestamp with time zone,"
        " renewed_at timestamp with time zone, expires_at timestamp with time zone,"
        " held boolean, state text, ttl interval, shared integer, data jsonb,"
        " release_requested_by text)",
    ),
    "lease_counters": (
        "name text DEFAULT NULL::text",
        "TABLE(name text, grants bigint, takeovers bigint, steals bigint, releases bigint)",
    ),
    "lease_history": (
        "name text DEFAULT NULL::text, since timestamp with time zone DEFAULT NULL::timestamp"
        " with time zone, max_rows integer DEFAULT 100",
        "TABLE(at timestamp with time zone, name text, event text, holder text, fence bigint,"
        " previous_holder text, slot integer)",
    ),
    "lease_prune_history": ("older_than interval", "bigint"),
    # 0005: the queue of waiting processes (issue 13).
    "lease_wait": ("name text, waiter text, ttl interval", "boolean"),
    "lease_unwait": ("name text, waiter text, granted boolean DEFAULT false", "boolean"),
    # 0008: permits and several names at once (contract 5.1 and 5.3).
    "lease_claim_all": (
        "names text[], ttl interval, holder text",
        "TABLE(name text, fence bigint)",
    ),
    "lease_release_all": ("names text[], holder text", "TABLE(name text, released boolean)"),
    # 0012: a new tenure of several names (issue 21).
    "lease_claim_all_new": (
        "names text[], ttl interval, holder text",
        "TABLE(name text, fence bigint)",
    ),
    # Names that are gone (contract 5.6).
    "lease_prune": ("idle_for interval", "bigint"),
    # 0013: readers and writers (contract 5.2).
    "lease_claim_shared": ("name text, ttl interval, holder text", "bigint"),
    "lease_holders": (
        "name text DEFAULT NULL::text",
        "TABLE(name text, holder text, mode text, slot integer, fence bigint,"
        " acquired_at timestamp with time zone, renewed_at timestamp with time zone,"
        " expires_at timestamp with time zone)",
    ),
    # 0016: data on a lease, leaders that step down when asked (contract 5.4).
    "lease_set_data": ("name text, holder text, data jsonb", "boolean"),
    "lease_request_release": ("name text, requested_by text", "boolean"),
    # Internal to the watchers of a name (not in the contract).
    "lease_watch": ("name text, watcher text, ttl interval", "boolean"),
    "lease_unwatch": ("name text, watcher text", "boolean"),
}
PERMIT_SIGNATURES = {
    "permit_claim": (
        "name text, max_permits integer, ttl interval, holder text, permits integer DEFAULT 1",
        "TABLE(slot integer, fence bigint)",
    ),
    "permit_renew": ("name text, holder text, ttl interval DEFAULT NULL::interval", "boolean"),
    "permit_release": ("name text, holder text", "boolean"),
    "permit_holds": ("name text, holder text, fence bigint", "boolean"),
    "permit_status": (
        "name text DEFAULT NULL::text",
        "TABLE(name text, max_permits integer, slot integer, holder text, fence bigint,"
        " acquired_at timestamp with time zone, renewed_at timestamp with time zone,"
        " expires_at timestamp with time zone, held boolean, state text, ttl interval)",
    ),
    "permit_set_max": ("name text, max_permits integer", "void"),
    "permit_revoke": ("name text, holder text", "boolean"),
    # 0012: a new tenure of permits (issue 21).
    "permit_claim_new": (
        "name text, max_permits integer, ttl interval, holder text, permits integer DEFAULT 1",
        "TABLE(slot integer, fence bigint)",
    ),
}
GROUP_SIGNATURES = {
    "group_join": ("grp text, member text, ttl interval, data jsonb DEFAULT NULL::jsonb", "bigint"),
    "group_renew": ("grp text, member text, ttl interval DEFAULT NULL::interval", "boolean"),
    "group_leave": ("grp text, member text", "boolean"),
    "group_members": (
        "grp text",
        "TABLE(member text, incarnation bigint, joined_at timestamp with time zone,"
        " renewed_at timestamp with time zone, expires_at timestamp with time zone, data jsonb)",
    ),
    "member_holds": ("grp text, member text, incarnation bigint", "boolean"),
    "group_assignment": ("grp text, partitions integer", "TABLE(part integer, member text)"),
    # 0015: the groups for operators (not in the contract's table; status and metrics).
    "group_status": (
        "grp text DEFAULT NULL::text",
        "TABLE(grp text, members integer, incarnation bigint, expires_at timestamp with time zone)",
    ),
}
# Overloads, beside the signature above: another number of arguments, no DEFAULT
# that would make a shorter call ambiguous.
OVERLOADS = {
    # 0006: the release of one tenure (contract 5.6).
    "lease_release": ("name text, holder text, min_hold interval, fence bigint", "boolean"),
    # 0012: renewals of one tenure (issue 21).
    "lease_renew": ("name text, holder text, ttl interval, fence bigint", "boolean"),
    "lease_renew_many": (
        "names text[], holders text[], ttl interval, fences bigint[]",
        "TABLE(name text, renewed boolean)",
    ),
    # Groups: a renewal and a leave of one incarnation (NULL: whichever is live).
    "group_renew": ("grp text, member text, ttl interval, incarnation bigint", "boolean"),
    "group_leave": ("grp text, member text, incarnation bigint", "boolean"),
    # 0014: releases of one tenure of permits and of several names (issue 24).
    "permit_release": ("name text, holder text, slot integer, fence bigint", "boolean"),
    "lease_release_all": (
        "names text[], holder text, fences bigint[]",
        "TABLE(name text, released boolean)",
    ),
    # 0016: a claim with data (contract 5.4), of a new tenure too; data set in one tenure.
    "lease_claim": ("name text, ttl interval, holder text, data jsonb", "bigint"),
    "lease_claim_new": ("name text, ttl interval, holder text, data jsonb", "bigint"),
    "lease_set_data": ("name text, holder text, data jsonb, fence bigint", "boolean"),
}


def test_every_function_has_the_contract_signature(conn: Conn) -> None:
    found: dict[str, set[tuple[str, str]]] = {}
    for name, args, result in conn.execute(
        "SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid)"
        "  FROM pg_proc AS p WHERE p.pronamespace = 'public'::regnamespace"
        "   AND (p.proname LIKE 'lease\\_%' OR p.proname LIKE 'permit\\_%'"
        "        OR p.proname LIKE 'group\\_%' OR p.proname = 'member_holds')"
    ):
        found.setdefault(name, set()).add((args, result))
    expected = {
        name: {signature}
        for name, signature in {**SIGNATURES, **PERMIT_SIGNATURES, **GROUP_SIGNATURES}.items()
    }
    for name, signature in OVERLOADS.items():
        expected[name].add(signature)
    assert found == expected


# -- claim --------------------------------------------------------------------


def test_claim_grants_a_new_name_and_refuses_another_holder(conn: Conn) -> None:
    assert claim(conn, "sweep", HOUR, "alice") == 1
    assert claim(conn, "sweep", HOUR, "bob") is None
    assert row(conn, "sweep")["holder"] == "alice"


def test_claim_in_named_notation(conn: Conn) -> None:
    fence = one(
        conn,
        "SELECT lease_claim(holder => %s, name => %s, ttl => %s)",
        ("alice", "sweep", HOUR),
    )
    assert fence == 1
    assert row(conn, "sweep")["holder"] == "alice"


def test_claim_accepts_a_name_and_holder_of_200_characters(conn: Conn) -> None:
    name, holder = "n" * 200, "h" * 200
    assert claim(conn, name, HOUR, holder) == 1
    assert holds(conn, name, holder, 1)


def test_claim_times_come_from_the_database_clock(conn: Conn) -> None:
    before = one(conn, "SELECT clock_timestamp()")
    claim(conn, "sweep", HOUR, "alice")
    after = one(conn, "SELECT clock_timestamp()")
    r = row(conn, "sweep")
    assert before <= r["acquired_at"] == r["renewed_at"] <= after
    assert r["expires_at"] == r["renewed_at"] + HOUR
    assert r["ttl"] == HOUR


def test_reclaim_by_the_holder_is_idempotent_and_extends(conn: Conn) -> None:
    fence = claim(conn, "sweep", SHORT, "alice")
    first = row(conn, "sweep")
    again = claim(conn, "sweep", HOUR, "alice")
    second = row(conn, "sweep")
    assert again == fence
    assert second["acquired_at"] == first["acquired_at"]
    assert second["expires_at"] > first["expires_at"]
    assert second["expires_at"] == second["renewed_at"] + HOUR


def test_reclaim_after_expiry_that_nobody_took_keeps_the_fence(conn: Conn) -> None:
    fence = claim(conn, "sweep", SHORT, "alice")
    wait_expired(conn, "sweep")
    assert claim(conn, "sweep", HOUR, "alice") == fence


def test_claim_after_expiry_grants_a_larger_fence(conn: Conn) -> None:
    assert claim(conn, "sweep", SHORT, "alice") == 1
    assert claim(conn, "sweep", SHORT, "bob") is None
    wait_expired(conn, "sweep")
    assert claim(conn, "sweep", HOUR, "bob") == 2
    assert row(conn, "sweep")["holder"] == "bob"


def test_claim_after_release_grants_a_larger_fence_even_to_the_same_holder(conn: Conn) -> None:
    assert claim(conn, "sweep", HOUR, "alice") == 1
    assert release(conn, "sweep", "alice")
    assert claim(conn, "sweep", HOUR, "alice") == 2
    assert release(conn, "sweep", "alice")
    assert claim(conn, "sweep", HOUR, "bob") == 3


def test_fences_strictly_increase_across_claim_steal_and_release(conn: Conn) -> None:
    fences = [claim(conn, "sweep", HOUR, "a")]
    fences.append(steal(conn, "sweep", HOUR, "b"))
    assert release(conn, "sweep", "b")
    fences.append(claim(conn, "sweep", SHORT, "c"))
    assert renew(conn, "sweep", "c")
    fences.append(claim(conn, "sweep", SHORT, "c"))  # idempotent: same fence
    wait_expired(conn, "sweep")
    fences.append(claim(conn, "sweep", HOUR, "d"))
    assert release(conn, "sweep", "d")
    fences.append(steal(conn, "sweep", HOUR, "e"))
    fences.append(steal(conn, "sweep", HOUR, "e"))
    assert fences == [1, 2, 3, 3, 4, 5, 6]
    assert [r[2] for r in status(conn, "sweep")] == [6]


def test_fences_are_per_name(conn: Conn) -> None:
    assert claim(conn, "a", HOUR, "x") == 1
    assert steal(conn, "a", HOUR, "y") == 2
    assert claim(conn, "b", HOUR, "x") == 1


# -- renew --------------------------------------------------------------------


def test_renew_extends_by_the_last_ttl_and_keeps_the_fence(conn: Conn) -> None:
    fence = claim(conn, "sweep", HOUR, "alice")
    before = row(conn, "sweep")
    assert renew(conn, "sweep", "alice")
    after = row(conn, "sweep")
    assert after["fence"] == fence
    assert after["renewed_at"] > before["renewed_at"]
    assert after["expires_at"] == after["renewed_at"] + HOUR
    assert after["acquired_at"] == before["acquired_at"]


def test_renew_with_a_ttl_makes_it_the_last_ttl(conn: Conn) -> None:
    claim(conn, "sweep", timedelta(minutes=1), "alice")
    assert renew(conn, "sweep", "alice", timedelta(minutes=2))
    r = row(conn, "sweep")
    assert r["expires_at"] == r["renewed_at"] + timedelta(minutes=2)
    assert renew(conn, "sweep", "alice")
    r = row(conn, "sweep")
    assert r["expires_at"] == r["renewed_at"] + timedelta(minutes=2)


def test_renew_in_named_notation(conn: Conn) -> None:
    claim(conn, "sweep", timedelta(minutes=1), "alice")
    assert one(conn, "SELECT lease_renew(holder => %s, name => %s)", ("alice", "sweep"))
    assert one(
        conn,
        "SELECT lease_renew(ttl => %s, holder => %s, name => %s)",
        (timedelta(minutes=3), "alice", "sweep"),
    )
    r = row(conn, "sweep")
    assert r["expires_at"] == r["renewed_at"] + timedelta(minutes=3)


def test_renew_past_expiry_when_nobody_claimed_it(conn: Conn) -> None:
    fence = claim(conn, "sweep", SHORT, "alice")
    wait_expired(conn, "sweep")
    assert status(conn, "sweep")[0][6] is False
    assert renew(conn, "sweep", "alice", HOUR)
    assert status(conn, "sweep")[0][6] is True
    assert holds(conn, "sweep", "alice", fence)  # type: ignore[arg-type]
    assert claim(conn, "sweep", HOUR, "bob") is None


def test_renew_is_false_for_another_holder_or_an_unknown_name(conn: Conn) -> None:
    claim(conn, "sweep", HOUR, "alice")
    before = table(conn)
    assert not renew(conn, "sweep", "bob")
    assert not renew(conn, "nothing", "alice")
    assert table(conn) == before


def test_renew_is_false_after_release(conn: Conn) -> None:
    claim(conn, "sweep", HOUR, "alice")
    assert release(conn, "sweep", "alice")
    before = table(conn)
    assert not renew(conn, "sweep", "alice")
    assert table(conn) == before


def test_renew_is_false_after_a_steal(conn: Conn) -> None:
    claim(conn, "sweep", HOUR, "alice")
    steal(conn, "sweep", HOUR, "bob")
    assert not renew(conn, "sweep", "alice")
    assert row(conn, "sweep")["holder"] == "bob"


def test_renew_is_false_after_expiry_and_a_claim_by_another(conn: Conn) -> None:
    claim(conn, "sweep", SHORT, "alice")
    wait_expired(conn, "sweep")
    assert claim(conn, "sweep", HOUR, "bob") == 2
    assert not renew(conn, "sweep", "alice")


# -- renew_many ---------------------------------------------------------------


def test_renew_many_reports_each_element_in_order(conn: Conn) -> None:
    claim(conn, "a", HOUR, "me")
    claim(conn, "b", HOUR, "other")
    claim(conn, "c", HOUR, "me")
    claim(conn, "d", HOUR, "me")
    release(conn, "d", "me")
    before = row(conn, "c")
    rows = conn.execute(
        "SELECT * FROM lease_renew_many(%s, %s)",
        (["c", "b", "zz", "a", "d"], ["me", "me", "me", "me", "me"]),
    ).fetchall()
    assert rows == [("c", True), ("b", False), ("zz", False), ("a", True), ("d", False)]
    after = row(conn, "c")
    assert after["renewed_at"] > before["renewed_at"]
    assert after["fence"] == before["fence"]
    assert row(conn, "b")["holder"] == "other"


def test_renew_many_with_a_ttl_and_in_named_notation(conn: Conn) -> None:
    claim(conn, "a", timedelta(minutes=1), "me")
    claim(conn, "b", SHORT, "you")
    wait_expired(conn, "b")
    rows = conn.execute(
        "SELECT name, renewed FROM lease_renew_many(ttl => %s, holders => %s, names => %s)",
        (timedelta(minutes=7), ["me", "you"], ["a", "b"]),
    ).fetchall()
    assert rows == [("a", True), ("b", True)]
    for name in ("a", "b"):
        r = row(conn, name)
        assert r["expires_at"] == r["renewed_at"] + timedelta(minutes=7)


def test_renew_many_of_nothing_is_nothing(conn: Conn) -> None:
    rows = conn.execute("SELECT * FROM lease_renew_many('{}'::text[], '{}'::text[])").fetchall()
    assert rows == []


# -- release ------------------------------------------------------------------


def test_release_frees_the_name(conn: Conn) -> None:
    claim(conn, "sweep", HOUR, "alice")
    assert release(conn, "sweep", "alice")
    assert status(conn, "sweep")[0][6] is False
    assert not release(conn, "sweep", "alice")
    assert claim(conn, "sweep", HOUR, "bob") == 2


def test_release_never_frees_another_holders_lease(conn: Conn) -> None:
    claim(conn, "sweep", HOUR, "alice")
    before = table(conn)
    assert not release(conn, "sweep", "bob")
    assert not release(conn, "nothing", "bob")
    assert table(conn) == before
    assert claim(conn, "sweep", HOUR, "bob") is None


def test_release_of_an_expired_lease_nobody_took_counts_as_held(conn: Conn) -> None:
    claim(conn, "sweep", SHORT, "alice")
    wait_expired(conn, "sweep")
    assert release(conn, "sweep", "alice")
    assert row(conn, "sweep")["released"] is True


def test_release_after_another_took_the_expired_lease_is_false(conn: Conn) -> None:
    claim(conn, "sweep", SHORT, "alice")
    wait_expired(conn, "sweep")
    assert claim(conn, "sweep", HOUR, "bob") == 2
    before = table(conn)
    assert not release(conn, "sweep", "alice")
    assert table(conn) == before


def test_release_with_min_hold_keeps_the_name_unavailable(conn: Conn) -> None:
    claim(conn, "sweep", HOUR, "alice")
    assert one(
        conn,
        "SELECT lease_release(name => %s, holder => %s, min_hold => %s)",
        ("sweep", "alice", HOUR),
    )
    r = row(conn, "sweep")
    assert r["released"] is True
    assert r["expires_at"] == r["acquired_at"] + HOUR
    assert status(conn, "sweep")[0][6] is False  # not held ...
    assert claim(conn, "sweep", HOUR, "bob") is None  # ... yet not available
    assert claim(conn, "sweep", HOUR, "alice") is None  # not even to its last holder
    assert not renew(conn, "sweep", "alice")


def test_release_with_a_min_hold_already_served_frees_at_once(conn: Conn) -> None:
    claim(conn, "sweep", HOUR, "alice")
    age(conn, "sweep", timedelta(minutes=10))
    assert release(conn, "sweep", "alice", timedelta(minutes=5))
    assert claim(conn, "sweep", HOUR, "bob") == 2


def test_release_with_a_short_min_hold_frees_after_it(conn: Conn) -> None:
    claim(conn, "sweep", HOUR, "alice")
    assert release(conn, "sweep", "alice", SHORT)
    assert claim(conn, "sweep", HOUR, "bob") is None
    wait_expired(conn, "sweep")
    assert claim(conn, "sweep", HOUR, "bob") == 2


def _notifications_until(listener: Conn, marker: str) -> list[str]:
    """Payloads on channel pylease up to and including ``marker``, in commit order."""
    seen: list[str] = []
    deadline = time.monotonic() + 10
    while marker not in seen:
        assert time.monotonic() < deadline, f"no notification {marker!r}; saw {seen}"
        for notify in listener.notifies(timeout=0.5, stop_after=1):
            assert notify.channel == "pylease"
            seen.append(notify.payload)
    return seen


def test_a_freeing_release_notifies_with_the_name(conn: Conn, conn2: Conn) -> None:
    conn2.execute("LISTEN pylease")
    claim(conn, "sweep job", HOUR, "alice")
    assert release(conn, "sweep job", "alice")
    assert _notifications_until(conn2, "sweep job") == ["sweep job"]


def test_no_notification_unless_the_release_frees_the_name(conn: Conn, conn2: Conn) -> None:
    conn2.execute("LISTEN pylease")
    claim(conn, "kept", HOUR, "alice")
    claim(conn, "marker", HOUR, "alice")
    assert not release(conn, "kept", "bob")  # not ours: nothing freed
    assert release(conn, "kept", "alice", HOUR)  # min_hold keeps it unavailable
    assert not release(conn, "kept", "alice")  # already released
    assert one(conn, "SELECT lease_renew('kept', 'alice')") is False
    assert release(conn, "marker", "alice")
    # Notifications arrive in commit order: had any earlier call sent one, it would show.
    assert _notifications_until(conn2, "marker") == ["marker"]


# -- steal --------------------------------------------------------------------


def test_steal_takes_a_held_lease_with_a_new_fence(conn: Conn) -> None:
    assert claim(conn, "sweep", HOUR, "alice") == 1
    assert steal(conn, "sweep", timedelta(minutes=2), "bob") == 2
    r = row(conn, "sweep")
    assert (r["holder"], r["fence"], r["released"]) == ("bob", 2, False)
    assert r["expires_at"] == r["acquired_at"] + timedelta(minutes=2)
    assert not holds(conn, "sweep", "alice", 1)
    assert holds(conn, "sweep", "bob", 2)
    assert claim(conn, "sweep", HOUR, "alice") is None


def test_steal_from_oneself_gives_a_new_fence(conn: Conn) -> None:
    assert claim(conn, "sweep", HOUR, "alice") == 1
    assert steal(conn, "sweep", HOUR, "alice") == 2
    assert not holds(conn, "sweep", "alice", 1)


def test_steal_respects_older_than(conn: Conn) -> None:
    claim(conn, "sweep", HOUR, "alice")
    before = table(conn)
    assert steal(conn, "sweep", HOUR, "bob", timedelta(minutes=30)) is None
    assert table(conn) == before
    age(conn, "sweep", timedelta(minutes=45))
    assert (
        one(
            conn,
            "SELECT lease_steal(name => %s, ttl => %s, holder => %s, older_than => %s)",
            ("sweep", HOUR, "bob", timedelta(minutes=30)),
        )
        == 2
    )
    assert row(conn, "sweep")["holder"] == "bob"


def test_a_renewal_resets_the_age_steal_looks_at(conn: Conn) -> None:
    claim(conn, "sweep", HOUR, "alice")
    age(conn, "sweep", timedelta(minutes=45))
    assert renew(conn, "sweep", "alice")
    assert steal(conn, "sweep", HOUR, "bob", timedelta(minutes=30)) is None
    assert row(conn, "sweep")["holder"] == "alice"


def test_steal_with_older_than_takes_an_expired_lease(conn: Conn) -> None:
    claim(conn, "sweep", SHORT, "alice")
    wait_expired(conn, "sweep")
    assert steal(conn, "sweep", HOUR, "bob", timedelta(days=30)) == 2


def test_steal_on_a_free_name_acts_as_claim(conn: Conn) -> None:
    assert steal(conn, "fresh", HOUR, "bob", timedelta(days=1)) == 1
    assert holds(conn, "fresh", "bob", 1)
    claim(conn, "sweep", HOUR, "alice")
    release(conn, "sweep", "alice")
    assert steal(conn, "sweep", HOUR, "bob", timedelta(days=1)) == 2


# -- holds --------------------------------------------------------------------


def test_holds_is_true_only_for_the_holder_with_its_fence(conn: Conn) -> None:
    claim(conn, "sweep", HOUR, "alice")
    assert holds(conn, "sweep", "alice", 1)
    assert not holds(conn, "sweep", "alice", 2)
    assert not holds(conn, "sweep", "alice", 0)
    assert not holds(conn, "sweep", "bob", 1)
    assert not holds(conn, "other", "alice", 1)
    assert one(
        conn, "SELECT lease_holds(fence => %s, holder => %s, name => %s)", (1, "alice", "sweep")
    )


def test_holds_is_false_once_expired_or_released(conn: Conn) -> None:
    claim(conn, "short", SHORT, "alice")
    wait_expired(conn, "short")
    assert not holds(conn, "short", "alice", 1)
    claim(conn, "sweep", HOUR, "alice")
    release(conn, "sweep", "alice", HOUR)
    assert not holds(conn, "sweep", "alice", 1)


# -- status -------------------------------------------------------------------


def test_status_lists_every_name_ever_claimed(conn: Conn) -> None:
    assert status(conn) == []
    claim(conn, "b", HOUR, "bob")
    claim(conn, "a", HOUR, "alice")
    claim(conn, "c", SHORT, "carol")
    claim(conn, "d", HOUR, "dave")
    release(conn, "d", "dave")
    wait_expired(conn, "c")
    rows = conn.execute("SELECT name, holder, fence, held FROM lease_status()").fetchall()
    assert rows == [
        ("a", "alice", 1, True),
        ("b", "bob", 1, True),
        ("c", "carol", 1, False),
        ("d", "dave", 1, False),
    ]


def test_status_of_one_name(conn: Conn) -> None:
    claim(conn, "a", HOUR, "alice")
    claim(conn, "b", HOUR, "bob")
    [(name, holder, fence, acquired, renewed, expires, held, state, ttl, shared, data, asked)] = (
        conn.execute("SELECT * FROM lease_status(name => %s)", ("b",)).fetchall()
    )
    r = row(conn, "b")
    assert (name, holder, fence, held, state, ttl) == ("b", "bob", 1, True, "held", HOUR)
    assert (shared, data, asked) == (0, None, None)
    assert (acquired, renewed, expires) == (r["acquired_at"], r["renewed_at"], r["expires_at"])
    assert status(conn, "unknown") == []


def test_status_columns(conn: Conn) -> None:
    claim(conn, "a", HOUR, "alice")
    cur = conn.execute("SELECT * FROM lease_status()")
    assert cur.description is not None
    assert [c.name for c in cur.description] == [
        "name",
        "holder",
        "fence",
        "acquired_at",
        "renewed_at",
        "expires_at",
        "held",
        "state",
        "ttl",
        "shared",
        "data",
        "release_requested_by",
    ]


# -- bad input ----------------------------------------------------------------

LONG = "x" * 201
BAD_KEYS = [
    pytest.param(None, id="NULL"),
    pytest.param("", id="empty"),
    pytest.param(LONG, id="201"),
]
BAD_TTLS = [
    pytest.param(timedelta(0), id="zero"),
    pytest.param(timedelta(microseconds=-1), id="negative"),
    pytest.param(timedelta(days=366, microseconds=1), id="over-366-days"),
]
NEGATIVE = timedelta(seconds=-1)

CLAIM = "lease_claim(%s, %s, %s)"
RENEW = "lease_renew(%s, %s, %s)"
RENEW_MANY = "lease_renew_many(%s::text[], %s::text[], %s)"
RENEW_EACH = "lease_renew_each(%s::text[], %s::text[], %s::interval[])"
RELEASE = "lease_release(%s, %s, %s)"
STEAL = "lease_steal(%s, %s, %s, %s)"
HOLDS = "lease_holds(%s, %s, %s)"
STATUS = "lease_status(%s)"

# (call, arguments, the parameter its message names); "job" is alice's lease.
CALLS: list[Any] = []
for p in BAD_KEYS:
    (key,), k = p.values, p.id
    CALLS += [
        pytest.param(CLAIM, (key, HOUR, "alice"), "name", id=f"claim-name-{k}"),
        pytest.param(CLAIM, ("job", HOUR, key), "holder", id=f"claim-holder-{k}"),
        pytest.param(RENEW, (key, "alice", None), "name", id=f"renew-name-{k}"),
        pytest.param(RENEW, ("job", key, None), "holder", id=f"renew-holder-{k}"),
        pytest.param(RENEW_MANY, ([key], ["alice"], None), "names", id=f"renew_many-names-{k}"),
        pytest.param(RENEW_MANY, (["job"], [key], None), "holders", id=f"renew_many-holders-{k}"),
        pytest.param(RENEW_EACH, ([key], ["alice"], [None]), "names", id=f"renew_each-names-{k}"),
        pytest.param(RENEW_EACH, (["job"], [key], [None]), "holders", id=f"renew_each-holders-{k}"),
        pytest.param(RELEASE, (key, "alice", None), "name", id=f"release-name-{k}"),
        pytest.param(RELEASE, ("job", key, None), "holder", id=f"release-holder-{k}"),
        pytest.param(STEAL, (key, HOUR, "bob", timedelta(0)), "name", id=f"steal-name-{k}"),
        pytest.param(STEAL, ("job", HOUR, key, timedelta(0)), "holder", id=f"steal-holder-{k}"),
        pytest.param(HOLDS, (key, "alice", 1), "name", id=f"holds-name-{k}"),
        pytest.param(HOLDS, ("job", key, 1), "holder", id=f"holds-holder-{k}"),
    ]
    if key is not None:  # lease_status(NULL) lists every name
        CALLS.append(pytest.param(STATUS, (key,), "name", id=f"status-name-{k}"))
for p in [*BAD_TTLS, pytest.param(None, id="NULL")]:
    (ttl,), t = p.values, p.id
    CALLS += [
        pytest.param(CLAIM, ("new", ttl, "bob"), "ttl", id=f"claim-ttl-{t}"),
        pytest.param(STEAL, ("job", ttl, "bob", timedelta(0)), "ttl", id=f"steal-ttl-{t}"),
    ]
    if ttl is not None:  # renewing with a NULL ttl means the last granted one
        CALLS += [
            pytest.param(RENEW, ("job", "alice", ttl), "ttl", id=f"renew-ttl-{t}"),
            pytest.param(RENEW_MANY, (["job"], ["alice"], ttl), "ttl", id=f"renew_many-ttl-{t}"),
            pytest.param(
                RENEW_EACH, (["job"], ["alice"], [ttl]), "ttls", id=f"renew_each-ttls-{t}"
            ),
        ]
CALLS += [
    pytest.param(STEAL, ("job", HOUR, "bob", NEGATIVE), "older_than", id="steal-older_than-neg"),
    pytest.param(STEAL, ("job", HOUR, "bob", None), "older_than", id="steal-older_than-NULL"),
    pytest.param(RELEASE, ("job", "alice", NEGATIVE), "min_hold", id="release-min_hold-neg"),
    pytest.param(HOLDS, ("job", "alice", None), "fence", id="holds-fence-NULL"),
    pytest.param(RENEW_MANY, (None, ["alice"], None), "names", id="renew_many-names-NULL-array"),
    pytest.param(RENEW_MANY, (["job"], None, None), "holders", id="renew_many-holders-NULL-array"),
    pytest.param(
        RENEW_MANY, (["job", "job"], ["alice"], None), "holders", id="renew_many-fewer-holders"
    ),
    pytest.param(
        RENEW_MANY, (["job"], ["alice", "alice"], None), "holders", id="renew_many-more-holders"
    ),
    pytest.param(RENEW_EACH, (None, ["alice"], [None]), "names", id="renew_each-names-NULL-array"),
    pytest.param(RENEW_EACH, (["job"], None, [None]), "holders", id="renew_each-holders-NULL"),
    pytest.param(RENEW_EACH, (["job"], ["alice"], None), "ttls", id="renew_each-ttls-NULL-array"),
    pytest.param(RENEW_EACH, (["job"], ["alice"], [None, None]), "ttls", id="renew_each-more-ttls"),
    pytest.param(
        RENEW_EACH, (["job", "job"], ["alice"], [None, None]), "holders", id="renew_each-fewer"
    ),
    pytest.param(
        RENEW_MANY,
        (["job", None], ["alice", "alice"], None),
        "names",
        id="renew_many-names-2nd-NULL",
    ),
    pytest.param(
        RENEW_MANY,
        (["job", "job"], ["alice", ""], None),
        "holders",
        id="renew_many-holders-2nd-empty",
    ),
]


@pytest.fixture(scope="module")
def leases(module_conn: Conn) -> Conn:
    """A database where "job" is alice's and "free" was released; bad calls share it."""
    assert claim(module_conn, "job", HOUR, "alice") == 1
    claim(module_conn, "free", HOUR, "alice")
    release(module_conn, "free", "alice")
    return module_conn


@pytest.mark.parametrize(("call", "args", "parameter"), CALLS)
def test_bad_input_raises_22023_naming_the_parameter_and_changes_nothing(
    leases: Conn, call: str, args: tuple[Any, ...], parameter: str
) -> None:
    conn = leases
    before = table(conn)
    assert [r[0] for r in before] == ["free", "job"]
    with pytest.raises(pg_errors.InvalidParameterValue) as caught:
        conn.execute(f"SELECT * FROM {call}", args)
    assert caught.value.sqlstate == "22023"
    message = caught.value.diag.message_primary or ""
    assert message.startswith(f"pylease: {parameter} "), message
    # The parameter travels in the error's own field too (RAISE ... USING COLUMN).
    assert caught.value.diag.column_name == parameter
    assert table(conn) == before


@pytest.mark.parametrize("ttl", BAD_TTLS)
def test_bad_ttl_on_a_free_name_is_not_busy_and_claims_nothing(conn: Conn, ttl: timedelta) -> None:
    with pytest.raises(pg_errors.InvalidParameterValue):
        claim(conn, "fresh", ttl, "alice")
    assert table(conn) == []


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_name_in_named_notation(conn: Conn, key: str | None) -> None:
    with pytest.raises(pg_errors.InvalidParameterValue, match="name"):
        conn.execute("SELECT lease_claim(name => %s, ttl => %s, holder => 'a')", (key, HOUR))
    assert table(conn) == []


def test_a_ttl_of_exactly_366_days_is_accepted(conn: Conn) -> None:
    assert claim(conn, "year", timedelta(days=366), "alice") == 1
    assert renew(conn, "year", "alice", timedelta(days=366))
