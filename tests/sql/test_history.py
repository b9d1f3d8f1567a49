"""Contract revision 2 operations in SQL: lease_status's state and ttl, the counters,
the history and its pylease.history setting, pruning (CONTRACT section 1; issue 15).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors

from tests.sql.test_contract import claim, one, release, renew, steal, wait_expired

Conn = psycopg.Connection[Any]

HOUR = timedelta(hours=1)
SHORT = timedelta(milliseconds=300)


def history(conn: Conn, *args: Any) -> list[tuple[Any, ...]]:
    """(event, holder, fence, previous_holder) of lease_history(*args), newest first."""
    marks = ", ".join(["%s"] * len(args))
    rows = conn.execute(
        f"SELECT event, holder, fence, previous_holder FROM lease_history({marks})",  # type: ignore[arg-type]
        args,
    ).fetchall()
    return rows


def counters(conn: Conn, name: str | None = None) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT * FROM lease_counters(%s)", (name,)).fetchall()


def states(conn: Conn) -> list[tuple[str, str, timedelta]]:
    return conn.execute("SELECT name, state, ttl FROM lease_status()").fetchall()


# -- state and ttl ----------------------------------------------------------------


def test_each_state_of_lease_status(conn: Conn) -> None:
    claim(conn, "held", HOUR, "a")
    claim(conn, "resting", HOUR, "a")
    release(conn, "resting", "a", HOUR)
    claim(conn, "released", HOUR, "a")
    release(conn, "released", "a")
    claim(conn, "expired", SHORT, "a")
    wait_expired(conn, "expired")
    assert states(conn) == [
        ("expired", "expired", SHORT),
        ("held", "held", HOUR),
        ("released", "released", HOUR),
        ("resting", "resting", HOUR),
    ]
    # held agrees with state: only 'held' is held.
    rows = conn.execute("SELECT state, held FROM lease_status() ORDER BY 1").fetchall()
    assert rows == [("expired", False), ("held", True), ("released", False), ("resting", False)]
    # A resting name is not claimable; a released or expired one is.
    assert claim(conn, "resting", HOUR, "b") is None
    assert claim(conn, "released", HOUR, "b") == 2
    assert claim(conn, "expired", HOUR, "b") == 2


def test_ttl_is_the_last_one_granted(conn: Conn) -> None:
    claim(conn, "a", HOUR, "me")
    renew(conn, "a", "me", timedelta(minutes=5))
    assert one(conn, "SELECT ttl FROM lease_status('a')") == timedelta(minutes=5)


# -- the scripted sequence (issue 15) -------------------------------------------------


def script(conn: Conn) -> None:
    """claim, renew, release, claim, expire and take over, steal, min_hold release."""
    assert claim(conn, "job", HOUR, "h1") == 1
    assert renew(conn, "job", "h1") is True
    assert claim(conn, "job", HOUR, "h1") == 1  # idempotent: records nothing
    assert claim(conn, "job", HOUR, "h2") is None  # busy: records nothing
    assert release(conn, "job", "h1") is True
    assert claim(conn, "job", SHORT, "h2") == 2
    wait_expired(conn, "job")
    assert claim(conn, "job", HOUR, "h3") == 3
    assert steal(conn, "job", HOUR, "h4") == 4
    assert release(conn, "job", "h4", HOUR) is True
    assert one(conn, "SELECT state FROM lease_status('job')") == "resting"


ALL = [
    ("released", "h4", 4, None),
    ("stolen", "h4", 4, "h3"),
    ("taken_over", "h3", 3, "h2"),
    ("claimed", "h2", 2, "h1"),
    ("released", "h1", 1, None),
    ("claimed", "h1", 1, None),
]
RARE = [e for e in ALL if e[0] in ("taken_over", "stolen")]


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        pytest.param("all", ALL, id="all"),
        pytest.param(None, RARE, id="unset"),
        pytest.param("", RARE, id="empty"),
        pytest.param("rare", RARE, id="rare"),
        pytest.param("none", [], id="none"),
    ],
)
def test_the_history_setting_records_exactly_its_events(
    conn: Conn, setting: str | None, expected: list[tuple[Any, ...]]
) -> None:
    if setting is not None:
        conn.execute("SELECT set_config('pylease.history', %s, false)", (setting,))
    script(conn)
    assert history(conn) == expected
    assert history(conn, "job") == expected
    assert history(conn, "other") == []
    # The counters do not depend on the setting.
    assert counters(conn) == [("job", 4, 1, 1, 2)]


def test_the_setting_per_database_and_per_role(conn: Conn, dsn: str) -> None:
    dbname = conn.info.dbname
    conn.execute(f"ALTER DATABASE \"{dbname}\" SET pylease.history = 'all'")  # type: ignore[arg-type]
    with psycopg.connect(dsn, autocommit=True) as fresh:
        claim(fresh, "a", HOUR, "me")
        assert history(fresh) == [("claimed", "me", 1, None)]
        fresh.execute("SET pylease.history = 'none'")
        release(fresh, "a", "me")
        assert history(fresh) == [("claimed", "me", 1, None)]


def test_a_bad_setting_is_loud_and_changes_nothing(conn: Conn) -> None:
    claim(conn, "a", HOUR, "me")
    conn.execute("SET pylease.history = 'everything'")
    before = conn.execute("SELECT * FROM pylease_leases").fetchall()
    for call in (
        "SELECT lease_claim('b', interval '1 hour', 'me')",
        "SELECT lease_release('a', 'me')",
        "SELECT lease_steal('a', interval '1 hour', 'you')",
    ):
        with pytest.raises(pg_errors.InvalidParameterValue) as caught:
            conn.execute(call)  # type: ignore[call-overload]
        assert caught.value.diag.column_name == "pylease.history"
        assert "'everything'" in (caught.value.diag.message_primary or "")
    assert conn.execute("SELECT * FROM pylease_leases").fetchall() == before
    # Renewals and busy claims never look at it.
    assert renew(conn, "a", "me") is True
    assert claim(conn, "a", HOUR, "you") is None


def test_counters_count_tenures_not_calls(conn: Conn) -> None:
    claim(conn, "a", HOUR, "me")
    for _ in range(3):
        claim(conn, "a", HOUR, "me")
        renew(conn, "a", "me")
    release(conn, "a", "me")
    release(conn, "a", "me")  # not ours any more: not counted
    steal(conn, "a", HOUR, "you")  # of a free name: a claim
    claim(conn, "b", SHORT, "me")
    wait_expired(conn, "b")
    steal(conn, "b", HOUR, "you")  # of an expired name: a takeover
    steal(conn, "b", HOUR, "them")  # from an unexpired holder: a steal
    assert counters(conn) == [("a", 2, 0, 0, 1), ("b", 3, 1, 1, 0)]
    assert counters(conn, "b") == [("b", 3, 1, 1, 0)]
    assert counters(conn, "zz") == []


def test_a_busy_claim_under_all_records_nothing_and_takes_no_transaction_id(
    conn: Conn, conn2: Conn
) -> None:
    claim(conn, "a", HOUR, "me")
    conn2.execute("SET pylease.history = 'all'")
    with conn2.transaction():
        assert claim(conn2, "a", HOUR, "you") is None
        assert one(conn2, "SELECT pg_current_xact_id_if_assigned()") is None
    assert one(conn, "SELECT count(*) FROM pylease_events") == 0


# -- lease_history's arguments ----------------------------------------------------


@pytest.fixture
def events(conn: Conn) -> Conn:
    """Events written behind the API's back: three at one moment, one an hour earlier."""
    conn.execute(
        """
        INSERT INTO pylease_events (at, name, event, holder, fence, previous_holder) VALUES
            ('2026-01-01 11:00+00', 'a', 'claimed', 'h0', 1, NULL),
            ('2026-01-01 12:00+00', 'a', 'taken_over', 'h1', 2, 'h0'),
            ('2026-01-01 12:00+00', 'b', 'claimed', 'h2', 1, NULL),
            ('2026-01-01 12:00+00', 'a', 'stolen', 'h3', 3, 'h1')
        """
    )
    return conn


def test_history_is_newest_first_and_ties_go_by_insertion(events: Conn) -> None:
    assert history(events) == [
        ("stolen", "h3", 3, "h1"),
        ("claimed", "h2", 1, None),
        ("taken_over", "h1", 2, "h0"),
        ("claimed", "h0", 1, None),
    ]


def test_history_since_is_inclusive_and_max_rows_limits(events: Conn) -> None:
    noon = "2026-01-01 12:00+00"
    assert [r[1] for r in history(events, None, noon)] == ["h3", "h2", "h1"]
    assert [r[1] for r in history(events, "a", noon)] == ["h3", "h1"]
    assert [r[1] for r in history(events, "a", None, 1)] == ["h3"]
    assert [r[1] for r in history(events, None, None, 10000)] == ["h3", "h2", "h1", "h0"]
    assert history(events, None, "2026-01-01 12:00:00.000001+00") == []


def test_history_uses_an_index_for_one_name_and_for_all(events: Conn) -> None:
    # A handful of rows: forbid the other plans, so that only an index that serves
    # the order can avoid a sort.
    events.execute("SET enable_seqscan = off; SET enable_bitmapscan = off; SET enable_sort = off")
    for where in ("e.name = 'a' AND e.at >= '-infinity'", "e.at >= '-infinity'"):
        plan = "\n".join(
            r[0]
            for r in events.execute(
                f"EXPLAIN SELECT * FROM pylease_events AS e WHERE {where}"  # type: ignore[arg-type]
                " ORDER BY e.at DESC, e.id DESC LIMIT 100"
            )
        )
        assert "Index Scan Backward" in plan and "Sort" not in plan, plan


@pytest.mark.parametrize("bad", [0, -1, 10001, None])
def test_history_refuses_max_rows_out_of_range(events: Conn, bad: int | None) -> None:
    with pytest.raises(pg_errors.InvalidParameterValue) as caught:
        history(events, None, None, bad)
    assert caught.value.diag.column_name == "max_rows"
    assert (caught.value.diag.message_primary or "").startswith("pylease: max_rows ")


@pytest.mark.parametrize("bad", ["", "x" * 201])
def test_history_and_counters_refuse_a_bad_name(events: Conn, bad: str) -> None:
    for call in ("SELECT * FROM lease_history(%s)", "SELECT * FROM lease_counters(%s)"):
        with pytest.raises(pg_errors.InvalidParameterValue) as caught:
            events.execute(call, (bad,))  # type: ignore[call-overload]
        assert caught.value.diag.column_name == "name"


# -- pruning ----------------------------------------------------------------------


def test_prune_removes_exactly_the_older_events(events: Conn) -> None:
    conn = events
    claim(conn, "c", HOUR, "now")
    steal(conn, "c", HOUR, "thief")  # a recent event
    age = one(conn, "SELECT clock_timestamp() - timestamptz '2026-01-01 11:30+00'")
    assert one(conn, "SELECT lease_prune_history(%s)", (age,)) == 1
    assert [r[1] for r in history(conn)] == ["thief", "h3", "h2", "h1"]
    assert one(conn, "SELECT lease_prune_history(interval '1 hour')") == 3
    assert history(conn) == [("stolen", "thief", 2, "now")]
    assert one(conn, "SELECT lease_prune_history(interval '1 hour')") == 0
    # Counters are never pruned.
    assert counters(conn, "c") == [("c", 2, 0, 1, 0)]


@pytest.mark.parametrize("bad", [timedelta(seconds=-1), None, timedelta(days=367)])
def test_prune_refuses_a_bad_older_than(events: Conn, bad: timedelta | None) -> None:
    with pytest.raises(pg_errors.InvalidParameterValue) as caught:
        events.execute("SELECT lease_prune_history(%s)", (bad,))
    assert caught.value.diag.column_name == "older_than"
    assert one(events, "SELECT count(*) FROM pylease_events") == 4
