"""Data on a lease and leaders that step down when asked (contract 5.4, migration 0016),
on both backends; the watchers' notifications and the privileges on PostgreSQL.

Data belongs to a tenure: every new grant replaces it, so the next tenure never sees
the last one's. A step-down request belongs to the tenure too, and reaches its holder
through the keeper's own renewal (a trailing column of ``pylease_renew_held``).
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg import sql

from pylease._backend import Backend
from pylease._resources import data_dir
from pylease.postgres import PostgresBackend
from pylease.sqlite import SqliteBackend, connect

Conn = psycopg.Connection[Any]
LONG = timedelta(seconds=30)
SHORT = timedelta(milliseconds=300)
PAST_SHORT = 0.45
ADDRESS = {"address": "10.0.0.7:8080", "version": "2.4.1"}


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


def data(backend: Backend, name: str) -> Any:
    [row] = backend.status(name)
    return row.data


def asked(backend: Backend, name: str) -> str | None:
    [row] = backend.status(name)
    return row.release_requested_by


def kept(backend: Backend, name: str, holder: str, fence: int | None = None) -> tuple[Any, ...]:
    """What the keeper's renewal of one lease answers: (renewed, release_requested_by)."""
    [r] = backend.renew_held(["lease"], [name], [holder], [None], [fence], [None])
    return r.renewed, r.release_requested_by


# Data ------------------------------------------------------------------------------


def test_a_grant_records_its_data_and_status_shows_it(backend: Backend) -> None:
    assert backend.claim("leader", LONG, "h1", ADDRESS) == 1
    assert data(backend, "leader") == ADDRESS
    # lease_holders keeps the shape of contract 5.2: no data column.
    [holder] = backend.holders("leader")
    assert (holder.holder, holder.mode, holder.fence) == ("h1", "exclusive", 1)
    assert backend.claim("plain", LONG, "h1") == 1
    assert data(backend, "plain") is None


def test_a_retried_claim_keeps_the_tenures_data_unless_it_gives_some(backend: Backend) -> None:
    assert backend.claim("leader", LONG, "h1", ADDRESS) == 1
    assert backend.claim("leader", LONG, "h1") == 1
    assert data(backend, "leader") == ADDRESS
    assert backend.claim("leader", LONG, "h1", {"v": 2}) == 1
    assert data(backend, "leader") == {"v": 2}


def test_a_new_tenure_never_sees_the_last_ones_data(backend: Backend) -> None:
    assert backend.claim("a", LONG, "h1", ADDRESS) == 1
    assert backend.release("a", "h1")
    # A released lease shows its last holder and that holder's data, as it shows the holder.
    assert data(backend, "a") == ADDRESS
    assert backend.claim("a", LONG, "h2") == 2
    assert data(backend, "a") is None
    # A takeover after an expiry, a steal, a new tenure of the same holder, several names.
    assert backend.claim("b", SHORT, "h1", ADDRESS) == 1
    time.sleep(PAST_SHORT)
    assert backend.claim("b", LONG, "h2") == 2
    assert data(backend, "b") is None
    assert backend.claim("c", LONG, "h1", ADDRESS) == 1
    assert backend.steal("c", LONG, "h2") == 2
    assert data(backend, "c") is None
    assert backend.claim("d", SHORT, "h1", ADDRESS) == 1
    time.sleep(PAST_SHORT)
    assert backend.claim_new("d", LONG, "h1") == 2
    assert data(backend, "d") is None
    assert backend.claim("e", SHORT, "h1", ADDRESS) == 1
    time.sleep(PAST_SHORT)
    assert backend.claim_all(["e"], LONG, "h2") == {"e": 2}
    assert data(backend, "e") is None


def test_set_data_is_holder_matched_and_names_its_tenure(backend: Backend) -> None:
    assert backend.claim("a", LONG, "h1") == 1
    assert backend.set_data("a", "h1", ADDRESS, None)
    assert data(backend, "a") == ADDRESS
    assert not backend.set_data("a", "h2", {"v": 1}, None)
    assert not backend.set_data("a", "h1", {"v": 1}, 2)
    assert backend.set_data("a", "h1", [1, "two"], 1)
    assert data(backend, "a") == [1, "two"]
    assert backend.set_data("a", "h1", None, 1)
    assert data(backend, "a") is None
    assert backend.release("a", "h1")
    assert not backend.set_data("a", "h1", {"v": 1}, None)
    assert not backend.set_data("unknown", "h1", {"v": 1}, None)


def test_readers_have_no_data(backend: Backend) -> None:
    assert backend.claim_shared("r", LONG, "reader") == 0
    [row] = backend.status("r")
    assert (row.state, row.data, row.release_requested_by) == ("shared", None, None)
    assert [h.mode for h in backend.holders("r")] == ["shared"]
    assert not backend.set_data("r", "reader", {"v": 1}, None)


def test_data_of_8192_characters_is_stored_and_more_is_refused_by_the_database(
    backend: Backend,
) -> None:
    largest = "x" * (8192 - 2)  # as JSON text: two quotes more
    assert backend.claim("a", LONG, "h1", largest) == 1
    assert data(backend, "a") == largest
    too_big = json.dumps("x" * 8191)
    if isinstance(backend, SqliteBackend):
        script = (data_dir("sql", "sqlite") / "claim.sql").read_text()
        with pytest.raises(sqlite3.IntegrityError, match="data must be at most 8192"):
            backend.conn.execute(
                script, {"name": "b", "ttl_seconds": 30, "holder": "h", "data": too_big}
            )
        return
    assert isinstance(backend, PostgresBackend)
    for statement in (
        "SELECT lease_claim('b', '30 s', 'h', %s::jsonb)",
        "SELECT lease_claim_new('b', '30 s', 'h', %s::jsonb)",
        "SELECT lease_set_data('a', 'h1', %s::jsonb)",
    ):
        with pytest.raises(pg_errors.InvalidParameterValue) as info:
            backend.conn.execute(statement, (too_big,))  # type: ignore[arg-type]
        assert info.value.diag.column_name == "data"
    assert [r.name for r in backend.status()] == ["a"]
    assert data(backend, "a") == largest


# Step-down requests ----------------------------------------------------------------


def test_a_request_reaches_the_holder_through_the_keepers_renewal(backend: Backend) -> None:
    assert backend.claim("leader", LONG, "h1") == 1
    assert kept(backend, "leader", "h1", 1) == (True, None)
    assert backend.request_release("leader", "deploy-42")
    assert asked(backend, "leader") == "deploy-42"
    # A lost renewal reply loses nothing: every renewal of the tenure tells it again.
    assert kept(backend, "leader", "h1", 1) == (True, "deploy-42")
    assert kept(backend, "leader", "h1", None) == (True, "deploy-42")
    # The first requester is kept.
    assert backend.request_release("leader", "someone-else")
    assert asked(backend, "leader") == "deploy-42"
    # Other kinds answer no request.
    assert backend.claim_shared("r", LONG, "reader") == 0
    [shared] = backend.renew_held(["shared"], ["r"], ["reader"], [None], [0], [None])
    assert (shared.renewed, shared.release_requested_by) == (True, None)


def test_a_request_belongs_to_its_tenure(backend: Backend) -> None:
    assert backend.claim("a", LONG, "h1") == 1
    assert backend.request_release("a", "ops")
    assert backend.release("a", "h1")
    assert asked(backend, "a") is None
    # With no other candidate, the holder that stepped down may lead again: a new
    # tenure, a new fence, no request.
    assert backend.claim("a", LONG, "h1") == 2
    assert asked(backend, "a") is None
    assert kept(backend, "a", "h1", 2) == (True, None)
    # A steal ends the tenure that was asked.
    assert backend.request_release("a", "ops")
    assert backend.steal("a", LONG, "h2") == 3
    assert asked(backend, "a") is None
    assert kept(backend, "a", "h1", 2) == (False, None)


def test_a_request_of_a_free_unknown_expired_or_read_lease_is_false(backend: Backend) -> None:
    assert not backend.request_release("unknown", "ops")
    assert backend.claim("a", LONG, "h1") == 1
    assert backend.release("a", "h1")
    assert not backend.request_release("a", "ops")
    assert backend.claim("b", SHORT, "h1") == 1
    time.sleep(PAST_SHORT)
    assert not backend.request_release("b", "ops")
    assert backend.claim_shared("r", LONG, "reader") == 0
    assert not backend.request_release("r", "ops")
    assert [(r.name, r.release_requested_by) for r in backend.status()] == [
        ("a", None),
        ("b", None),
        ("r", None),
    ]


# PostgreSQL: privileges, the upgrade note, watchers ------------------------------------


@pytest.fixture
def app_role(conn: Conn) -> Iterator[str]:
    role = f"pylease_app_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
    try:
        yield role
    finally:
        conn.execute("RESET ROLE")
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_an_application_role_publishes_data_but_an_operator_asks_to_step_down(
    conn: Conn, app_role: str
) -> None:
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(app_role)))
    assert conn.execute(
        "SELECT lease_claim('leader', '1 hour', 'h1', '{\"a\": 1}')"
    ).fetchone() == (1,)
    assert conn.execute("SELECT lease_set_data('leader', 'h1', '{\"a\": 2}')").fetchone() == (True,)
    assert conn.execute("SELECT data FROM lease_status('leader')").fetchone() == ({"a": 2},)
    assert conn.execute("SELECT lease_watch('leader', 'w', '1 min')").fetchone() == (True,)
    with pytest.raises(pg_errors.InsufficientPrivilege):
        conn.execute("SELECT lease_request_release('leader', 'me')")
    for forbidden in ("SELECT * FROM pylease_watchers", "DELETE FROM pylease_watchers"):
        with pytest.raises(pg_errors.InsufficientPrivilege):
            conn.execute(forbidden)  # type: ignore[call-overload]
    conn.execute("RESET ROLE")
    conn.execute(
        sql.SQL("GRANT EXECUTE ON FUNCTION lease_request_release(text, text) TO {}").format(
            sql.Identifier(app_role)
        )
    )
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(app_role)))
    assert conn.execute("SELECT lease_request_release('leader', 'me')").fetchone() == (True,)


def test_a_bare_lease_claim_is_ambiguous_where_a_signature_is_omitted(conn: Conn) -> None:
    """The upgrade note: with the 4-argument overload, a reference without a signature
    finds two functions (calls of either arity still resolve)."""
    assert conn.execute("SELECT to_regproc('lease_claim')").fetchone() == (None,)
    assert conn.execute(
        "SELECT to_regprocedure('lease_claim(text, interval, text)') IS NOT NULL"
    ).fetchone() == (True,)
    with pytest.raises(pg_errors.AmbiguousFunction):
        conn.execute("COMMENT ON FUNCTION lease_claim IS 'x'")
    assert conn.execute("SELECT lease_claim('a', '1 hour', 'h')").fetchone() == (1,)
    assert conn.execute("SELECT lease_claim('b', '1 hour', 'h', NULL)").fetchone() == (1,)


def notifications(listener: Conn, until: int, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The payloads of pylease_holders that reach ``listener``, until ``until`` of them
    came (or ``timeout`` seconds passed)."""
    got: list[dict[str, Any]] = []
    for notice in listener.notifies(timeout=timeout, stop_after=until):
        assert notice.channel == "pylease_holders"
        payload = json.loads(notice.payload)
        # The times are the row's (checked once below); the rest is compared whole.
        assert set(payload) >= {"acquired_at", "expires_at", "ttl"}, payload
        for key in ("acquired_at", "expires_at", "ttl"):
            payload.pop(key)
        got.append(payload)
    return got


def test_a_watcher_hears_every_change_of_holder_in_order(dsn: str, conn: Conn) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pylease_holders")
        assert conn.execute("SELECT lease_watch('leader', 'w1', '1 min')").fetchone() == (True,)
        assert conn.execute("SELECT lease_watch('leader', 'w1', '1 min')").fetchone() == (False,)
        steps = [
            "SELECT lease_claim('leader', '300 ms', 'h1', '{\"at\": 1}')",
            "SELECT lease_renew('leader', 'h1')",  # nothing to tell
            "SELECT lease_set_data('leader', 'h1', '{\"at\": 2}')",
            "SELECT pg_sleep(0.45)",
            "SELECT lease_claim('leader', '1 hour', 'h2')",  # a takeover after a crash
            "SELECT lease_steal('leader', '1 hour', 'h3')",
            "SELECT lease_release('leader', 'h3')",
            "SELECT lease_claim('other', '1 hour', 'h1')",  # nobody watches it
            "SELECT * FROM lease_claim_all('{leader}', '1 hour', 'h4')",
        ]
        for step in steps:
            conn.execute(step)  # type: ignore[call-overload]
        got = notifications(listener, 6)
    assert got == [
        {"name": "leader", "fence": 1, "holder": "h1", "event": "granted"},
        {"name": "leader", "fence": 1, "holder": "h1", "event": "data"},
        {"name": "leader", "fence": 2, "holder": "h2", "event": "granted"},
        {"name": "leader", "fence": 3, "holder": "h3", "event": "granted"},
        {"name": "leader", "fence": 3, "holder": None, "event": "released"},
        {"name": "leader", "fence": 4, "holder": "h4", "event": "granted"},
    ]


def test_a_hundred_changes_in_quick_succession_arrive_in_order_none_skipped(
    dsn: str, conn: Conn, conn2: Conn
) -> None:
    conn.execute("SELECT lease_watch('leader', 'w1', '1 min')")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pylease_holders")
        for i in range(1, 101):
            # Two sessions, as two candidates: every change is a commit of its own.
            (conn if i % 2 else conn2).execute(
                "SELECT lease_steal('leader', '1 hour', %s)", (f"h{i}",)
            )
        got = notifications(listener, 100)
    assert [(n["fence"], n["holder"]) for n in got] == [(i, f"h{i}") for i in range(1, 101)]


def test_a_notification_carries_the_terms_times_and_never_its_data(dsn: str, conn: Conn) -> None:
    conn.execute("SELECT lease_watch('leader', 'w1', '1 min')")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pylease_holders")
        conn.execute("SELECT lease_claim('leader', '90 s', 'h1', '{\"secret\": \"s3\"}')")
        [notice] = list(listener.notifies(timeout=5.0, stop_after=1))
    payload = json.loads(notice.payload)
    row = conn.execute("SELECT acquired_at, expires_at FROM lease_status('leader')").fetchone()
    assert row is not None
    # Times as JSON writes them (PostgreSQL drops a fraction's trailing zeros).
    assert (
        datetime.fromisoformat(payload["acquired_at"]),
        datetime.fromisoformat(payload["expires_at"]),
        payload["ttl"],
    ) == (row[0], row[1], 90)
    assert "s3" not in notice.payload and "data" not in payload


def test_an_unwatched_or_expired_watch_sends_nothing(dsn: str, conn: Conn) -> None:
    conn.execute("SELECT lease_watch('a', 'w1', '200 ms')")
    conn.execute("SELECT lease_watch('b', 'w1', '1 min')")
    assert conn.execute("SELECT lease_unwatch('b', 'w1')").fetchone() == (True,)
    assert conn.execute("SELECT lease_unwatch('b', 'w1')").fetchone() == (False,)
    time.sleep(0.3)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pylease_holders")
        conn.execute("SELECT lease_claim('a', '1 hour', 'h1')")
        conn.execute("SELECT lease_claim('b', '1 hour', 'h1')")
        conn.execute("SELECT lease_watch('c', 'w1', '1 min')")
        conn.execute("SELECT lease_claim('c', '1 hour', 'h1')")
        got = notifications(listener, 2, timeout=1.0)
    # Only c, which is watched: its one grant (a second payload would be a's or b's).
    assert got == [{"name": "c", "fence": 1, "holder": "h1", "event": "granted"}]
    # A renewal, and a reader's first claim of a watched name, tell nothing either.
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pylease_holders")
        conn.execute("SELECT lease_watch('r', 'w1', '1 min')")
        conn.execute("SELECT lease_renew('c', 'h1')")
        conn.execute("SELECT lease_claim_shared('r', '1 hour', 'reader')")
        assert notifications(listener, 1, timeout=0.5) == []


def test_an_unwatched_name_calls_no_trigger_function(conn: Conn) -> None:
    """A name nobody watches pays nothing for watchers: its grants, steals and releases
    call no function (the trigger's WHEN reads the row's flag), and a name whose
    watchers all expired is unmarked by its next change, once."""
    conn.execute("SET track_functions = 'pl'")

    def calls() -> int:
        row = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions"
            " WHERE funcname = 'pylease_tell_watchers'"
        ).fetchone()
        assert row is not None
        return int(row[0])

    with conn.transaction():
        before = calls()
        for _ in range(3):
            conn.execute("SELECT lease_claim('quiet', '1 hour', 'h')")
            conn.execute("SELECT lease_steal('quiet', '1 hour', 'h2')")
            conn.execute("SELECT lease_release('quiet', 'h2')")
        assert calls() - before == 0
    conn.execute("SELECT lease_watch('once', 'w', '100 ms')")
    conn.execute("SELECT lease_claim('once', '1 hour', 'h')")  # watched: marked at insert
    time.sleep(0.2)  # the watcher vanished
    with conn.transaction():
        # (Counted since the transaction began: a backend's counts of earlier ones may
        # not have been flushed yet.)
        before = calls()
        conn.execute("SELECT lease_release('once', 'h')")  # unmarks, tells nobody
        conn.execute("SELECT lease_claim('once', '1 hour', 'h')")
        conn.execute("SELECT lease_release('once', 'h')")
        assert calls() - before == 1
    assert conn.execute("SELECT watched FROM pylease_leases WHERE name = 'once'").fetchone() == (
        False,
    )
