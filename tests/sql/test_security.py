"""Security as an application meets it: a least-privileged login, look-alikes, impostors,
unguessable holders, and passwords that never leak.

tests/sql/test_schema.py proves the grants and the pinned search_path at the SQL level
(``SET ROLE``, one session); this module goes through the Python API and the
command line, as real logins with real connections.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import traceback
import unicodedata
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import errors as pg_errors
from psycopg import sql

from pylease import DatabaseUnavailable, LeaseLost, PyleaseError, keep_fresh, lease, run_exclusive
from pylease import dsn as dsn_mod
from pylease.leasing import default_holder
from pylease.postgres import PostgresBackend
from pylease.sqlite import SqliteBackend
from pylease.sqlite import connect as sqlite_connect
from tests.support.leases import backends, status, terminate, wait_until

Conn = psycopg.Connection[Any]
ROOT = Path(__file__).resolve().parents[2]
HOUR = timedelta(hours=1)


def with_user(dsn: str, user: str, password: str | None = None) -> str:
    params = dsn_mod.parse(dsn)
    params["user"] = user
    params.pop("password", None)
    if password is not None:
        params["password"] = password
    return psycopg.conninfo.make_conninfo("", **params)


def as_url(dsn: str, user: str, password: str, port: int | None = None) -> str:
    params = dsn_mod.parse(dsn)
    host = params.get("host", "127.0.0.1")
    port_ = port or params.get("port", 5432)
    return f"postgresql://{user}:{password}@{host}:{port_}/{params['dbname']}"


@pytest.fixture
def login(conn: Conn) -> Iterator[str]:
    """A LOGIN role that may do only what PUBLIC may: EXECUTE the lease functions."""
    role = f"pylease_login_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        yield role
    finally:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def pylease_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "HOME": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pylease", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**base, **(env or {})},
    )


# An EXECUTE-only login -------------------------------------------------------------


def test_an_execute_only_login_uses_every_api_but_cannot_steal_or_write(
    dsn: str, conn: Conn, login: str
) -> None:
    app = with_user(dsn, login)
    with psycopg.connect(app, autocommit=True) as mine:
        assert mine.execute("SELECT current_user").fetchone() == (login,)
        with lease(mine, "sweep", ttl=0.9) as held:
            # The heartbeat renews (lease_renew_many) as this login too.
            wait_until(lambda: held._ticket.renewals >= 2)
            held.check()
            assert mine.execute(
                "SELECT lease_holds('sweep', %s, %s)", (held.holder, held.fence)
            ).fetchone() == (True,)
            backend = PostgresBackend(mine)
            assert [r.holder for r in backend.status("sweep")] == [held.holder]
            [renewal] = backend.renew_each(["sweep"], [held.holder], [None])
            assert renewal.renewed and renewal.expires_at is not None
            with pytest.raises(PyleaseError, match="permission denied") as denied:
                backend.steal("sweep", HOUR, "thief")
            assert isinstance(denied.value.__cause__, pg_errors.InsufficientPrivilege)
            for forbidden in (
                "UPDATE pylease_leases SET holder = 'thief'",
                "DELETE FROM pylease_leases",
                "SELECT holder FROM pylease_leases",
                "TRUNCATE pylease_leases",
            ):
                with pytest.raises(pg_errors.InsufficientPrivilege):
                    mine.execute(forbidden)  # type: ignore[call-overload]
        assert run_exclusive(app, "sweep", 30, lambda: "ran") == (True, "ran")

    env = {"PYLEASE_DSN": app}
    claimed = pylease_cli("claim", "cli", "--ttl", "1m", "--holder", "me", env=env)
    assert claimed.returncode == 0, claimed.stderr
    for args in (("renew", "cli", "--holder", "me"), ("status", "cli", "--json")):
        assert pylease_cli(*args, env=env).returncode == 0, args
    with keep_fresh(app, "cli", "me", ttl=60) as kept:
        assert kept.fence == int(claimed.stdout.split()[1])
    stolen = pylease_cli("steal", "cli", "--ttl", "1m", "--holder", "thief", env=env)
    assert stolen.returncode == 3 and "may not steal leases" in stolen.stderr, stolen
    assert "GRANT EXECUTE ON FUNCTION" in stolen.stderr, stolen
    assert pylease_cli("release", "cli", "--holder", "me", env=env).returncode == 0
    rows = conn.execute(
        "SELECT name, holder, released FROM pylease_leases ORDER BY name"
    ).fetchall()
    assert rows == [("cli", "me", True), ("sweep", rows[1][1], True)]
    assert rows[1][1] != "thief"


def test_an_execute_only_login_reads_history_and_counters_but_cannot_prune(
    dsn: str, conn: Conn, login: str
) -> None:
    conn.execute("SELECT lease_claim('job', interval '1 hour', 'stuck')")
    conn.execute("SELECT lease_steal('job', interval '1 hour', 'operator')")
    with psycopg.connect(with_user(dsn, login), autocommit=True) as mine:
        backend = PostgresBackend(mine)
        [event] = backend.history()
        assert (event.event, event.holder, event.previous_holder) == ("stolen", "operator", "stuck")
        assert [(c.grants, c.steals) for c in backend.counters("job")] == [(2, 1)]
        assert [r.state for r in backend.status("job")] == ["held"]
        with pytest.raises(PyleaseError, match="permission denied") as denied:
            backend.prune_history(timedelta(0))
        assert isinstance(denied.value.__cause__, pg_errors.InsufficientPrivilege)
        for forbidden in (
            "SELECT * FROM pylease_events",
            "DELETE FROM pylease_events",
            "INSERT INTO pylease_events (at, name, event, holder, fence)"
            " VALUES (now(), 'job', 'claimed', 'me', 9)",
        ):
            with pytest.raises(pg_errors.InsufficientPrivilege):
                mine.execute(forbidden)  # type: ignore[call-overload]
    assert conn.execute("SELECT count(*) FROM pylease_events").fetchone() == (1,)
    conn.execute(
        sql.SQL("GRANT EXECUTE ON FUNCTION lease_prune_history(interval) TO {}").format(
            sql.Identifier(login)
        )
    )
    with psycopg.connect(with_user(dsn, login), autocommit=True) as mine:
        assert PostgresBackend(mine).prune_history(timedelta(0)) == 1


# Look-alikes earlier in the search_path ---------------------------------------------


def test_look_alikes_earlier_in_the_search_path_change_nothing_for_the_python_api(
    dsn: str, conn: Conn, login: str
) -> None:
    conn.execute(
        """
        CREATE SCHEMA lookalike;
        CREATE TABLE lookalike.pylease_leases (LIKE public.pylease_leases);
        CREATE TABLE lookalike.calls (what text);
        CREATE FUNCTION lookalike.pylease_check_key(parameter text, value text) RETURNS void
        LANGUAGE sql AS $$ INSERT INTO lookalike.calls VALUES ('check_key') $$;
        CREATE FUNCTION lookalike.pylease_check_ttl(parameter text, value interval)
        RETURNS void LANGUAGE sql AS $$ INSERT INTO lookalike.calls VALUES ('check_ttl') $$;
        CREATE FUNCTION lookalike.clock_timestamp() RETURNS timestamptz
        LANGUAGE sql AS $$ SELECT timestamptz '2000-01-01' $$;
        CREATE FUNCTION lookalike.now() RETURNS timestamptz
        LANGUAGE sql AS $$ SELECT timestamptz '2000-01-01' $$;
        CREATE FUNCTION lookalike.pg_notify(text, text) RETURNS void
        LANGUAGE sql AS $$ INSERT INTO lookalike.calls VALUES ('pg_notify') $$;
        CREATE FUNCTION lookalike.always(text, text) RETURNS boolean
        LANGUAGE sql AS $$ SELECT true $$;
        CREATE OPERATOR lookalike.= (LEFTARG = text, RIGHTARG = text, FUNCTION = lookalike.always);
        GRANT ALL ON SCHEMA lookalike TO PUBLIC;
        GRANT ALL ON ALL TABLES IN SCHEMA lookalike TO PUBLIC;
        """
    )
    app = with_user(dsn, login) + " options='-c search_path=lookalike,public'"
    with psycopg.connect(app, autocommit=True) as mine:
        assert mine.execute("SHOW search_path").fetchone() == ("lookalike,public",)
        with lease(mine, "sweep", ttl=0.9) as held:
            wait_until(lambda: held._ticket.renewals >= 2)
            # The look-alike '=' would match any holder; the real one does not.
            assert run_exclusive(app, "sweep", 30, lambda: "ran") == (False, None)
            with pytest.raises(LeaseLost):
                keep_fresh(app, "sweep", "impostor").__enter__()
            with pytest.raises(PyleaseError, match="name must not be empty"):
                PostgresBackend(mine).claim("", HOUR, "me")
            row = status(conn, "sweep")
            assert row is not None and row["held"] and row["holder"] == held.holder
            assert row["acquired_at"].year > 2000
    assert conn.execute("SELECT count(*) FROM lookalike.pylease_leases").fetchone() == (0,)
    assert conn.execute("SELECT * FROM lookalike.calls").fetchall() == []
    assert conn.execute("SELECT fence, released FROM public.pylease_leases").fetchall() == [
        (held.fence, True)
    ]


# Impostors: a non-holder can neither renew nor release --------------------------------

REAL = "worker-7:4a1f"


def near_misses(real: str) -> list[str]:
    return [
        real.upper(),
        real + " ",
        " " + real,
        real[:-1],
        real + "0",
        real.replace("o", "\u043e"),  # Cyrillic o
        real + "\u200b",  # zero-width space
        unicodedata.normalize("NFD", "é" + real),
        real[:-1] + "%",
        real[:3] + "_" + real[4:],
        ".*",
        "%",
        "' OR '1'='1",
        real + "'; --",
    ]


@pytest.fixture(scope="module")
def impostor_targets(pg_admin_dsn: str, pg_template: str, tmp_path_factory: Any) -> Iterator[Any]:
    name = f"pylease_imp_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(pg_template)
            )
        )
    params = dsn_mod.parse(pg_admin_dsn)
    params["dbname"] = name
    url = psycopg.conninfo.make_conninfo("", **params)
    pg = psycopg.connect(url, autocommit=True)
    sq = sqlite_connect(tmp_path_factory.mktemp("imp") / "leases.sqlite3")
    try:
        yield [(PostgresBackend(pg), url), (SqliteBackend(sq), None)]
    finally:
        pg.close()
        sq.close()
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    impostor=st.one_of(
        st.sampled_from(near_misses(REAL)),
        st.text(min_size=1, max_size=30).filter(lambda s: "\x00" not in s),
    )
)
def test_a_non_holder_can_neither_renew_nor_release(impostor_targets: Any, impostor: str) -> None:
    if impostor == REAL or impostor.encode("utf-8", "replace") != impostor.encode(
        "utf-8", "surrogatepass"
    ):
        return
    for backend, _url in impostor_targets:
        backend.claim("guarded", HOUR, REAL)
        before = backend.status("guarded")
        assert not backend.renew("guarded", impostor, HOUR)
        assert backend.renew_many(["guarded"], [impostor]) == [("guarded", False)]
        assert not backend.release("guarded", impostor)
        assert not backend.holds("guarded", impostor, before[0].fence)
        assert backend.status("guarded") == before


def test_an_impostor_keep_fresh_and_cli_are_refused(impostor_targets: Any, tmp_path: Path) -> None:
    pg_backend, url = impostor_targets[0]
    pg_backend.claim("guarded", HOUR, REAL)
    before = pg_backend.status("guarded")
    for impostor in near_misses(REAL)[:6]:
        with pytest.raises(LeaseLost):
            keep_fresh(url, "guarded", impostor).__enter__()
        for command in ("renew", "release"):
            done = pylease_cli(command, "guarded", "--holder", impostor, env={"PYLEASE_DSN": url})
            assert done.returncode == 1, (impostor, done.stderr)
    assert pg_backend.status("guarded") == before


# Default holders ------------------------------------------------------------------

TOKEN = re.compile(r"^(?P<host>.+):(?P<pid>\d+):(?P<bits>[0-9a-f]{32})$")


def test_default_holders_carry_128_random_bits_distinct_per_claim(dsn: str, conn: Conn) -> None:
    holders = []
    for _ in range(64):
        with lease(conn, "sweep", ttl=30, heartbeat=False) as held:
            holders.append(held.holder)
            assert status(conn, "sweep")["holder"] == held.holder  # type: ignore[index]
    for _ in range(3):
        done = pylease_cli("claim", "cli", "--ttl", "1m", env={"PYLEASE_DSN": dsn})
        assert done.returncode == 0, done.stderr
        holder = done.stdout.split("\t")[0]
        holders.append(holder)
        assert (
            pylease_cli("release", "cli", "--holder", holder, env={"PYLEASE_DSN": dsn}).returncode
            == 0
        )
    holders += [default_holder() for _ in range(64)]
    tokens = []
    for holder in holders:
        match = TOKEN.match(holder)
        assert match, holder
        tokens.append(int(match["bits"], 16))
    assert len(set(tokens)) == len(tokens)
    # Every one of the 128 bit positions varies: no fixed, counter or clock bits.
    for bit in range(128):
        seen = {(t >> bit) & 1 for t in tokens}
        assert seen == {0, 1}, f"bit {bit} never changes"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_childs_default_holder_names_the_child() -> None:
    parent = TOKEN.match(default_holder())  # the parent has made its holders' prefix
    assert parent and int(parent["pid"]) == os.getpid()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one holder, then out at once
        try:
            os.write(write, default_holder().encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        holder = pipe.read()
    os.waitpid(pid, 0)
    match = TOKEN.match(holder)
    assert match, holder
    assert int(match["pid"]) == pid


# Passwords never leak --------------------------------------------------------------


@pytest.fixture
def secret_login(conn: Conn) -> Iterator[tuple[str, str]]:
    """A LOGIN role with a password (the local server may trust it anyway)."""
    role = f"pylease_pw_{uuid.uuid4().hex[:8]}"
    secret = f"Pw-{uuid.uuid4().hex}"
    conn.execute(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(secret)
        )
    )
    try:
        yield role, secret
    finally:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def told(exc: BaseException) -> str:
    """Everything an error says: its text, its repr, its notes, the whole chain."""
    return "".join(traceback.format_exception(exc)) + repr(exc)


def test_passwords_never_appear_in_logs_or_errors(
    dsn: str, conn: Conn, secret_login: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    role, secret = secret_login
    caplog.set_level(logging.DEBUG, logger="pylease")
    good = as_url(dsn, role, secret)
    dead = as_url(dsn, role, secret, port=1)
    kv_dead = with_user(dsn, role, secret).replace("port=", "port=1 x=").split(" x=")[0]

    # A heartbeat that fails, through a URL and through a Connection with a password.
    with psycopg.connect(good, autocommit=True) as mine:
        with pytest.raises(LeaseLost) as lost, lease(mine, "sweep", ttl=1.5) as held:
            wait_until(lambda: backends(conn, "pylease-heartbeat"))
            # Its next connection is refused: the renewals fail until the loss.
            conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(role)))
            terminate(conn, backends(conn, "pylease-heartbeat"))
            assert wait_until(lambda: held.lost, 15)
        assert secret not in told(lost.value)
    # The failures were logged, naming the connection with its password masked.
    assert any("renewing" in r.getMessage() and "***" in r.getMessage() for r in caplog.records)

    errors: list[BaseException] = []
    for target in (dead, kv_dead, "postgresql://u:" + secret + "@127.0.0.1:notaport/db"):
        for attempt in (
            lambda t=target: lease(t, "x", ttl=5).__enter__(),
            lambda t=target: run_exclusive(t, "x", 5, lambda: None),
            lambda t=target: keep_fresh(t, "x", "h").__enter__(),
        ):
            with pytest.raises(PyleaseError) as raised:
                attempt()
            errors.append(raised.value)
    assert any(isinstance(e, DatabaseUnavailable) for e in errors)
    for error in errors:
        assert secret not in told(error), told(error)
    assert secret not in caplog.text
    for record in caplog.records:
        assert secret not in record.getMessage()
        assert secret not in str(record.args)


def test_passwords_never_appear_in_cli_output(dsn: str, secret_login: tuple[str, str]) -> None:
    role, secret = secret_login
    good = as_url(dsn, role, secret)
    dead = as_url(dsn, role, secret, port=1)
    runs = [
        ((0, 1), ("claim", "job", "--ttl", "1m", "--json"), good),  # 1: the 2nd is busy
        (0, ("status", "--json"), good),
        (0, ("-v", "status", "job"), good),
        (3, ("claim", "job", "--ttl", "1m", "--json"), dead),
        (3, ("-v", "claim", "job", "--ttl", "1m", "--json"), dead),
        (3, ("-v", "status", "--json"), dead),
        (3, ("-v", "migrate"), dead),
        (3, ("run", "job", "--ttl", "1m", "--", "true"), dead),
        (3, ("-v", "status"), good.replace("127.0.0.1:", "127.0.0.1:x")),
    ]
    for expected, args, url in runs:
        for how in ("flag", "env"):
            if how == "flag":
                done = (
                    pylease_cli(*args, "--dsn", url)
                    if args[0] != "run"
                    else pylease_cli("run", "--dsn", url, *args[1:])
                )
            else:
                done = pylease_cli(*args, env={"PYLEASE_DSN": url})
            assert done.returncode in (expected if isinstance(expected, tuple) else (expected,)), (
                args,
                how,
                done.stderr,
            )
            assert secret not in done.stdout + done.stderr, (args, how)
