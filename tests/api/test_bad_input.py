"""Bad input, generated: names, holders and durations thrown at every layer.

Hypothesis draws unicode (astral planes, combining marks, lone surrogates), NUL
bytes, huge and negative values, NaN and infinities, and SQL metacharacters, and
sends them through the SQL API, the Python API on both backends, and the command
line. Every input either works as a normal value or raises the documented error:

- SQL: SQLSTATE 22023 naming the parameter (a NUL cannot reach PostgreSQL at all:
  ``text`` cannot hold one, and the driver refuses it);
- Python: ``InvalidArgument`` (a ``ValueError``) before any SQL runs;
- CLI: exit 2 with one line, never a traceback.

A rejected input leaves the lease table as it was. Examples are few per test
(``max_examples``) so the whole module runs in well under a minute.
"""

from __future__ import annotations

import json
import math
import sqlite3
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg import errors as pg_errors
from typer.testing import CliRunner

from pylease import (
    InvalidArgument,
    LeaseBusy,
    LeaseLost,
    durations,
    keep_fresh,
    lease,
    run_exclusive,
)
from pylease.cli import app
from pylease.sqlite import connect as sqlite_connect

Conn = psycopg.Connection[Any]

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
FEW = settings(SETTINGS, max_examples=30)

SQL_META = [
    "'; DROP TABLE pylease_leases; --",
    "x' OR '1'='1",
    '"; SELECT pg_sleep(10); --',
    "$1",
    "%s",
    "%(name)s",
    "\\",
    "\\x00",
    "$$",
    "$q$ DELETE FROM pylease_leases $q$",
    "*/ DROP TABLE pylease_leases /*",
    "; COMMIT; TRUNCATE pylease_leases;",
    "' ; NOTIFY pylease, 'x",
    "E'\\\\'",
    "::interval",
    "%",
    "_",
    "\n\r\t",
    " ",
    "NULL",
]

# Text that PostgreSQL can store: no NUL, no lone surrogate.
storable = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
keys = st.one_of(
    st.sampled_from(SQL_META),
    storable.filter(lambda s: len(s) <= 40),
    st.text(st.characters(exclude_categories=["Cs"]), max_size=20),  # NUL included
    st.text(min_size=195, max_size=205, alphabet=st.characters(exclude_categories=["Cs"])),
    st.text(st.characters(codec=None), max_size=10),  # lone surrogates too
    st.just(""),
    st.just("名前" * 100),
    st.just("🔒" * 200),
    st.just("🔒" * 201),
)
spans = st.one_of(
    st.timedeltas(min_value=timedelta(days=-800), max_value=timedelta(days=800)),
    st.sampled_from(
        [
            timedelta(0),
            timedelta(microseconds=1),
            timedelta(microseconds=-1),
            timedelta(days=366),
            timedelta(days=366, microseconds=1),
            timedelta.max,
            timedelta.min,
        ]
    ),
)
seconds = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.sampled_from([0, 0.0, -0.0, 1e-9, 5e-324, 31622400, 31622400.000001, 10**400 // 10**390]),
    spans,
    st.sampled_from([True, False, None, "5", "5s", b"5", [5], float("nan")]),
)


def key_ok(value: object) -> bool:
    """The documented rule for a name or holder."""
    if not isinstance(value, str) or not 1 <= len(value) <= 200 or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def ttl_ok(value: object) -> bool:
    """The documented rule for a ttl: a timedelta or seconds in (0, 366 days]."""
    if isinstance(value, bool) or not isinstance(value, int | float | timedelta):
        return False
    if not isinstance(value, timedelta):
        if not math.isfinite(value) or abs(value) > 10**12:
            return False
        value = timedelta(seconds=value)  # microseconds: 1e-9 s is no time at all
    return timedelta(0) < value <= timedelta(days=366)


def py_ttl_ok(value: object) -> bool:
    """The Python API's rule (contract section 2): also the CLI's duration strings."""
    if isinstance(value, str):
        try:
            value = durations.parse(value)
        except ValueError:
            return False
    return ttl_ok(value)


def as_span(value: Any) -> timedelta:
    if isinstance(value, str):
        return durations.parse(value)
    return value if isinstance(value, timedelta) else timedelta(seconds=value)


def sendable(value: str) -> bool:
    return "\x00" not in value and key_ok(value[:200] or "x")


# SQL ---------------------------------------------------------------------------


def table(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT * FROM pylease_leases ORDER BY name").fetchall()


def sql_call(conn: Conn, query: str, params: tuple[Any, ...], valid: bool) -> Any:
    """Run one call: its result if valid; else assert a 22023 that changed nothing."""
    before = table(conn)
    if not valid:
        with pytest.raises(pg_errors.InvalidParameterValue) as caught:
            conn.execute(query, params)  # type: ignore[call-overload]
        assert caught.value.sqlstate == "22023"
        assert (caught.value.diag.message_primary or "").startswith("pylease: ")
        assert table(conn) == before
        return None
    row = conn.execute(query, params).fetchone()  # type: ignore[call-overload]
    assert row is not None
    return row[0]


@SETTINGS
@given(name=keys, holder=keys, ttl=spans)
def test_sql_claim_renew_release_steal_and_holds(
    module_conn: Conn, name: str, holder: str, ttl: timedelta
) -> None:
    conn = module_conn
    if "\x00" in name + holder:
        # PostgreSQL text cannot hold NUL: the driver refuses before the server sees it.
        before = table(conn)
        with pytest.raises(psycopg.DataError, match="NUL"):
            conn.execute("SELECT lease_claim(%s, %s, %s)", (name, ttl, holder))
        assert table(conn) == before
        return
    if not all(sendable(k) for k in (name, holder) if k):
        return  # lone surrogates cannot be encoded for the wire at all (see the Python API)
    keys_ok = key_ok(name) and key_ok(holder)
    fence = sql_call(
        conn, "SELECT lease_claim(%s, %s, %s)", (name, ttl, holder), keys_ok and ttl_ok(ttl)
    )
    if fence is not None and ttl >= timedelta(seconds=10):
        assert sql_call(conn, "SELECT lease_holds(%s, %s, %s)", (name, holder, fence), True)
    sql_call(conn, "SELECT lease_renew(%s, %s, %s)", (name, holder, ttl), keys_ok and ttl_ok(ttl))
    sql_call(conn, "SELECT lease_renew(%s, %s)", (name, holder), keys_ok)
    span_ok = timedelta(0) <= ttl <= timedelta(days=366)
    sql_call(conn, "SELECT lease_release(%s, %s, %s)", (name, holder, ttl), keys_ok and span_ok)
    sql_call(
        conn,
        "SELECT lease_steal(%s, %s, %s, %s)",
        (name, timedelta(seconds=1), holder, ttl),
        keys_ok and span_ok,
    )
    sql_call(conn, "SELECT count(*) FROM lease_status(%s)", (name,), key_ok(name))


@pytest.mark.parametrize("call", ["lease_steal(%s, '1s', 'h', %s)", "lease_release(%s, 'h', %s)"])
def test_sql_an_absurd_span_is_22023(module_conn: Conn, call: str) -> None:
    name = f"absurd-{uuid.uuid4().hex[:8]}"
    module_conn.execute("SELECT lease_claim(%s, '1 hour', 'h')", (name,))
    before = table(module_conn)
    with pytest.raises(pg_errors.InvalidParameterValue):
        module_conn.execute(f"SELECT {call}", (name, timedelta.max))  # type: ignore[call-overload]
    assert table(module_conn) == before


@FEW
@given(names=st.lists(keys, max_size=4), ttl=st.one_of(st.none(), spans))
def test_sql_renew_many(module_conn: Conn, names: list[str], ttl: timedelta | None) -> None:
    if any("\x00" in n or not sendable(n) for n in names if n):
        return
    valid = all(key_ok(n) for n in names) and (ttl is None or ttl_ok(ttl))
    holders = [n[::-1] or "h" for n in names]
    valid = valid and all(key_ok(h) for h in holders)
    before = table(module_conn)
    if valid:
        rows = module_conn.execute(
            "SELECT * FROM lease_renew_many(%s, %s, %s)", (names, holders, ttl)
        ).fetchall()
        assert [r[0] for r in rows] == names
    else:
        with pytest.raises(pg_errors.InvalidParameterValue):
            module_conn.execute("SELECT * FROM lease_renew_many(%s, %s, %s)", (names, holders, ttl))
        assert table(module_conn) == before


@FEW
@given(ttl=st.sampled_from(["1 mon", "12 mons", "13 mons", "1 year", "-1 mon", "1 mon -31 days"]))
def test_sql_month_intervals_follow_postgres_interval_comparison(
    module_conn: Conn, ttl: str
) -> None:
    """A month counts 30 days when PostgreSQL compares intervals: '13 mons' > 366 days."""
    row = module_conn.execute(
        "SELECT %s::interval > '0' AND %s::interval <= '366 days'", (ttl, ttl)
    ).fetchone()
    assert row is not None
    name = f"months-{uuid.uuid4().hex[:8]}"
    sql_call(module_conn, "SELECT lease_claim(%s, %s::interval, 'h')", (name, ttl), row[0])


# Python, both backends -----------------------------------------------------------


@pytest.fixture(scope="module")
def own_db(pg_admin_dsn: str, pg_template: str) -> Iterator[Any]:
    """Opens databases of this module's own (so no test sees another's leases)."""
    made: list[str] = []

    def make() -> Conn:
        name = f"pylease_bad_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(
                psycopg.sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    psycopg.sql.Identifier(name), psycopg.sql.Identifier(pg_template)
                )
            )
        made.append(name)
        params = psycopg.conninfo.conninfo_to_dict(pg_admin_dsn)
        params["dbname"] = name
        return psycopg.connect(psycopg.conninfo.make_conninfo("", **params), autocommit=True)

    opened: list[Conn] = []

    def open_() -> Conn:
        opened.append(make())
        return opened[-1]

    yield open_
    for c in opened:
        c.close()
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        for name in made:
            admin.execute(
                psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    psycopg.sql.Identifier(name)
                )
            )


@pytest.fixture(scope="module", params=["postgres", "sqlite"])
def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, Any]]:
    """A lease target and a function that reads its whole table."""
    if request.param == "postgres":
        conn: Conn = request.getfixturevalue("own_db")()
        yield conn, lambda: table(conn)
        return
    path = tmp_path_factory.mktemp("bad") / "leases.sqlite3"
    sconn = sqlite_connect(path)
    try:
        yield sconn, lambda: sconn.execute("SELECT * FROM pylease_leases ORDER BY name").fetchall()
    finally:
        sconn.close()


@SETTINGS
@given(name=keys, holder=st.one_of(st.none(), keys), ttl=seconds)
@example(name="a\udcffb", holder=None, ttl=5)  # undecodable argv bytes come as surrogates
@example(name="job", holder="\ud800", ttl=5)
@example(name="job\x00", holder=None, ttl=5)
@example(name="🔒" * 201, holder=None, ttl=5)
@example(name="job", holder=None, ttl=float("nan"))
@example(name="job", holder=None, ttl=timedelta.max)
def test_python_lease_works_or_raises_invalid_argument(
    target: tuple[Any, Any], name: Any, holder: Any, ttl: Any
) -> None:
    where, read = target
    valid = key_ok(name) and (holder is None or key_ok(holder)) and py_ttl_ok(ttl)
    before = read()
    try:
        with lease(where, name, ttl, holder=holder, heartbeat=False) as held:
            assert held.name == name and isinstance(held.fence, int)
            if holder is not None:
                assert held.holder == holder
    except InvalidArgument as exc:
        assert not valid, f"a valid input was refused: {exc}"
        assert isinstance(exc, ValueError) and exc.parameter
        assert read() == before
        return
    except LeaseLost:
        # Documented: a ttl that short ran out before the block ended.
        assert valid and as_span(ttl) < timedelta(seconds=1)
        return
    except LeaseBusy:
        # Only a holder chosen by hand can meet its own earlier lease (min_hold
        # aside, leases here are released): a fresh default holder never is busy.
        assert valid
        return
    assert valid, "an invalid input was accepted"


@SETTINGS
@example(name="job", ttl=5, wait=0, min_hold=timedelta.max, poll=None)
@example(name="job", ttl=5, wait=timedelta.min, min_hold=None, poll=None)
@example(name="job", ttl=5, wait=0, min_hold=None, poll=timedelta.max)
@given(
    name=keys,
    ttl=seconds,
    wait=seconds,
    min_hold=st.one_of(st.none(), seconds),
    poll=st.one_of(st.none(), seconds),
)
def test_python_options_never_fail_otherwise(
    target: tuple[Any, Any], name: Any, ttl: Any, wait: Any, min_hold: Any, poll: Any
) -> None:
    """Whatever the options, the outcome is a run, a busy lease, or InvalidArgument."""
    where, read = target
    before = read()
    if isinstance(wait, int | float) and not isinstance(wait, bool) and wait > 1:
        wait = 0.01  # a valid long wait would only slow the test
    if isinstance(wait, timedelta) and wait > timedelta(seconds=1):
        wait = timedelta(seconds=0.01)
    try:
        outcome = run_exclusive(
            where,
            name,
            ttl,
            lambda: "ran",
            heartbeat=False,
            wait=wait,
            min_hold=min_hold,
            poll_interval=poll,
        )
    except InvalidArgument:
        assert read() == before
        return
    except LeaseLost:
        # Documented: the work ran, but a ttl that short ran out while it did.
        assert py_ttl_ok(ttl) and as_span(ttl) < timedelta(seconds=1)
        return
    assert outcome in ((True, "ran"), (False, None))
    assert key_ok(name) and py_ttl_ok(ttl)


@FEW
@given(name=keys, holder=keys, ttl=st.one_of(st.none(), seconds))
def test_python_keep_fresh_works_or_raises_invalid_argument(
    target: tuple[Any, Any], name: Any, holder: Any, ttl: Any
) -> None:
    where, read = target
    before = read()
    valid = key_ok(name) and key_ok(holder) and (ttl is None or py_ttl_ok(ttl))
    try:
        with keep_fresh(where, name, holder, ttl=ttl):
            pass
    except InvalidArgument:
        assert not valid
        assert read() == before
        return
    except LeaseLost:
        assert valid  # not held by that holder: the documented answer
        assert read() == before
        return


# Command line ------------------------------------------------------------------

runner = CliRunner()
durations_text = st.one_of(
    st.sampled_from(
        [
            "5s",
            "250ms",
            "1h30m",
            "90",
            "0",
            "0s",
            "-5s",
            "nan",
            "inf",
            "-inf",
            "1e400",
            "99999999999999999999d",
            "367d",
            "366d",
            "8784h",
            "8784h1ms",
            "5m1h",
            "",
            " ",
            "5x",
            "0x10",
            "1_000",
            "٣s",
            "5s; DROP TABLE pylease_leases",
        ]
    ),
    st.text(max_size=12),
)


@pytest.fixture(scope="module", params=["postgres", "sqlite"])
def cli_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    if request.param == "postgres":
        conn: Conn = request.getfixturevalue("own_db")()
        params = conn.info.get_parameters()
        url = psycopg.conninfo.make_conninfo("", **params)
        return url, lambda: table(conn)
    path: Path = tmp_path_factory.mktemp("cli") / "leases.sqlite3"
    sqlite_connect(path).close()

    def read() -> list[Any]:
        with sqlite3.connect(path) as c:
            return c.execute("SELECT * FROM pylease_leases ORDER BY name").fetchall()

    return f"sqlite:///{path}", read


def cli(url: str, command: str, name: str | None = None, *options: str) -> Any:
    """Run one command in-process; the name goes after ``--``, so '-x' is a name too."""
    args = [command, *options, "--dsn", url, *(("--", name) if name is not None else ())]
    result = runner.invoke(app, args, env={"PYLEASE_DSN": None})
    out = result.output
    assert "Traceback" not in out, out
    if result.exception is not None:
        assert isinstance(result.exception, SystemExit), repr(result.exception)
    return result


@SETTINGS
@given(name=keys, holder=keys, ttl=durations_text)
@example(name="\udcff", holder="h", ttl="5s")
@example(name="job", holder="a\udcffb", ttl="5s")
@example(name="job", holder="h", ttl="1e400")
def test_cli_claim_and_release_exit_0_1_or_2(
    cli_url: tuple[str, Any], name: str, holder: str, ttl: str
) -> None:
    url, read = cli_url
    before = read()
    claimed = cli(url, "claim", name, "--ttl", ttl, "--holder", holder)
    assert claimed.exit_code in (0, 1, 2), claimed.output
    if not (key_ok(name) and key_ok(holder)):
        assert claimed.exit_code == 2, claimed.output
    if claimed.exit_code == 2:
        assert read() == before
        assert len(claimed.output.strip().splitlines()) <= 30  # usage, never a dump
        if key_ok(name) and key_ok(holder):
            assert "--ttl" in claimed.output, claimed.output  # only the duration was wrong
        return
    assert claimed.exit_code == 0, claimed.output
    assert claimed.output.strip().split("\t")[0] == holder.strip() or holder in claimed.output
    released = cli(url, "release", name, "--holder", holder)
    assert released.exit_code == 0, released.output


@FEW
@given(name=keys, holder=keys, span=durations_text)
@example(name="job", holder="h", span="1000000d")
@example(name="job", holder="\udcff", span="5s")
def test_cli_renew_steal_status_exit_0_1_or_2(
    cli_url: tuple[str, Any], name: str, holder: str, span: str
) -> None:
    url, read = cli_url
    before = read()
    for args in (
        ("renew", name, "--holder", holder, "--ttl", span),
        ("release", name, "--holder", holder, "--min-hold", span),
        ("steal", name, "--ttl", "1s", "--holder", holder, "--older-than", span),
        ("status", name, "--json"),
        ("status", None, "--json"),
    ):
        result = cli(url, *args)
        assert result.exit_code in (0, 1, 2), (args, result.output)
        if result.exit_code == 2:
            assert read() == before, args
        elif args[0] == "status":
            assert isinstance(json.loads(result.stdout), list)
        before = read()


@FEW
@given(name=keys, holder=keys)
@example(name="[/bold]", holder="h")  # rich markup: a closing tag with no opening one
@example(name="[red]alarm[/red]", holder="[link=https://example.com]me[/link]")
@example(name="\x1b[2J\x1b[Hcleared", holder="h\x07")  # terminal escapes, a bell
@example(name="job\roverwritten", holder="h\x1b]0;title\x07")
def test_cli_status_shows_any_stored_name_and_holder_as_plain_text(
    cli_url: tuple[str, Any], name: str, holder: str
) -> None:
    """Names and holders are data: the table neither interprets them nor passes escapes on."""
    if not (key_ok(name) and key_ok(holder)):
        return
    url, _read = cli_url
    claimed = cli(url, "claim", name, "--ttl", "1h", "--holder", holder)
    assert claimed.exit_code in (0, 1), claimed.output
    for args in (("status",), ("status", name)):  # every lease, and this one
        shown = cli(url, *args)
        assert shown.exit_code == 0, shown.output
        assert all(ch.isprintable() or ch == "\n" for ch in shown.stdout), repr(shown.stdout)
    if claimed.exit_code == 0:
        assert cli(url, "release", name, "--holder", holder).exit_code == 0


@pytest.mark.parametrize(
    ("schema", "works"),
    [
        ('we"ird; DROP TABLE pylease_leases; --', True),
        ("Upper Case", True),
        ("s" * 63, True),
        ("名" * 21, True),  # 63 bytes
        ("s" * 64, False),
        ("名" * 22, False),  # 22 characters, 66 bytes
    ],
    ids=["metacharacters", "spaces", "63-bytes", "63-bytes-cjk", "64-bytes", "66-bytes-cjk"],
)
def test_cli_migrate_takes_any_schema_name_postgres_keeps_whole(
    empty_dsn: str, schema: str, works: bool
) -> None:
    """PostgreSQL cuts identifiers to 63 bytes: a longer name would be another schema."""
    migrated = cli(empty_dsn, "migrate", None, "--schema", schema)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        schemas = {r[0] for r in c.execute("SELECT nspname FROM pg_namespace").fetchall()}
        if works:
            assert migrated.exit_code == 0, migrated.output
            assert schema in schemas
            c.execute(
                psycopg.sql.SQL("SET search_path = {}").format(psycopg.sql.Identifier(schema))
            )
            assert c.execute("SELECT lease_claim('x', '1 min', 'h')").fetchone() == (1,)
        else:
            assert migrated.exit_code == 2, migrated.output
            assert "63 bytes" in migrated.output
            # Nothing was created, not even the cut-down schema.
            assert not any(s and schema.startswith(s) for s in schemas - {"public"}), schemas
