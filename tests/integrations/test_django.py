"""pylease.contrib.django and Django connections as targets, with a real Django on a
real PostgreSQL (settings: tests/support/django_settings.py)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from io import StringIO
from typing import Any

# Installed by the dev extra (`make test`): a missing one fails, never skips.
import django
import psycopg
import pytest

from pylease import exclusive, lease
from pylease.migrate import rollback
from tests.fixtures.database import _create_db, _drop_db
from tests.support.leases import status

Conn = psycopg.Connection[Any]


class Rollback(Exception):
    """Raised to roll back an atomic block."""


@pytest.fixture(scope="module")
def databases(pg_admin_dsn: str) -> Iterator[dict[str, str]]:
    """Two empty databases (no pylease schema) and Django set up on them."""
    names = {
        alias: f"integ_django_{alias}_{uuid.uuid4().hex[:8]}" for alias in ("default", "other")
    }
    urls = {alias: _create_db(pg_admin_dsn, name) for alias, name in names.items()}
    env = {
        "INTEG_DJANGO_DEFAULT_DSN": urls["default"],
        "INTEG_DJANGO_OTHER_DSN": urls["other"],
        "DJANGO_SETTINGS_MODULE": "tests.support.django_settings",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    django.setup()
    from django.core.management import call_command
    from django.db import connections

    call_command("migrate", verbosity=0)
    try:
        yield urls
    finally:
        connections.close_all()
        for name in names.values():
            _drop_db(pg_admin_dsn, name)
        for key, value in saved.items():  # later tests' subprocesses must not inherit them
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def db(databases: dict[str, str]) -> Iterator[Conn]:
    """An autocommit connection of the test's own to Django's default database."""
    with psycopg.connect(databases["default"], autocommit=True) as c:
        yield c
        c.execute("DELETE FROM pylease_leases")


def tables(conn: Conn) -> set[str]:
    rows = conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        " AND (tablename LIKE 'pylease%%' OR tablename LIKE '\\_yoyo%%')"
    )
    return {r[0] for r in rows}


def test_migrate_installs_pylease_and_twice_is_idempotent(db: Conn) -> None:
    from django.core.management import call_command

    assert "pylease_leases" in tables(db)
    applied = db.execute("SELECT migration_id FROM _yoyo_migration").fetchall()
    assert ("pylease-0001-leases",) in applied
    assert db.execute(
        "SELECT count(*) FROM django_migrations WHERE app = 'pylease'"
    ).fetchone() == (1,)
    out = StringIO()
    call_command("migrate", stdout=out)
    call_command("migrate", verbosity=0)
    assert db.execute("SELECT migration_id FROM _yoyo_migration").fetchall() == applied
    assert "pylease" in out.getvalue()


def test_every_migrate_applies_pending_pylease_migrations(databases: dict[str, str]) -> None:
    """An upgrade of pylease brings new SQL migrations, while Django's own migration of
    the app ran long ago: migrate applies them all the same (here: every one, after a
    rollback of the schema)."""
    from django.core.management import call_command

    rollback(databases["default"], say=lambda _line: None)
    with psycopg.connect(databases["default"]) as c:
        assert "pylease_leases" not in tables(c)
    out = StringIO()
    call_command("migrate", stdout=out)
    assert "pylease: applied pylease-0001-leases" in out.getvalue()
    with psycopg.connect(databases["default"]) as c:
        assert "pylease_leases" in tables(c)


def test_pylease_database_names_another_alias(databases: dict[str, str]) -> None:
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import call_command
    from django.test import override_settings

    with psycopg.connect(databases["other"]) as c:
        assert "pylease_leases" not in tables(c)
    with override_settings(PYLEASE_DATABASE="other"):
        call_command("migrate", verbosity=0)
        from django.db import connections

        from pylease.contrib.django import connection

        assert connection() is connections["other"]
        with lease(connection(), "on-other", ttl=30):
            out = StringIO()
            call_command("pylease", "status", stdout=out)
            assert "on-other" in out.getvalue()
    with psycopg.connect(databases["other"]) as c:
        assert "pylease_leases" in tables(c)
    with override_settings(PYLEASE_DATABASE="nope"), pytest.raises(ImproperlyConfigured):
        call_command("pylease", "status")


@pytest.mark.parametrize("statement_first", [True, False], ids=["after-a-statement", "at-once"])
def test_a_claim_inside_atomic_survives_its_rollback(db: Conn, statement_first: bool) -> None:
    from django.db import connection, transaction

    db.execute("CREATE TABLE IF NOT EXISTS integ_work (n int)")
    db.execute("TRUNCATE integ_work")
    with ExitStack() as stack:
        with pytest.raises(Rollback), transaction.atomic():
            with connection.cursor() as cur:
                if statement_first:
                    cur.execute("INSERT INTO integ_work VALUES (1)")
                held = stack.enter_context(lease(connection, "in-atomic", ttl=30))
                cur.execute("INSERT INTO integ_work VALUES (2)")
            raise Rollback
        assert db.execute("SELECT count(*) FROM integ_work").fetchone() == (0,)
        row = status(db, "in-atomic")
        assert row is not None and row["held"] and row["holder"] == held.holder
        assert row["fence"] == held.fence
        # Django's connection is still usable, in autocommit again.
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        assert connection.get_autocommit()
    row = status(db, "in-atomic")
    assert row is not None and not row["held"]


def test_connections_alias_and_exclusive(db: Conn) -> None:
    from django.db import connection, connections

    @exclusive(connection, "report-{day}", ttl=30)
    def report(day: str) -> bool:
        row = status(db, f"report-{day}")
        return row is not None and bool(row["held"])

    assert report("2026-12-01") is True
    with lease(connections["default"], "by-alias", ttl=30) as held:
        row = status(db, "by-alias")
        assert row is not None and row["holder"] == held.holder


def test_the_management_command_prints_status(db: Conn) -> None:
    from django.core.management import CommandError, call_command
    from django.db import connection

    with lease(connection, "nightly", ttl=30) as held:
        out = StringIO()
        call_command("pylease", "status", stdout=out)
        assert "nightly" in out.getvalue() and held.holder[:8] in out.getvalue()
        out = StringIO()
        call_command("pylease", "status", "nightly", "--json", stdout=out)
        rows = json.loads(out.getvalue())
        rows = rows if isinstance(rows, list) else [rows]
        assert [r["name"] for r in rows] == ["nightly"] and rows[0]["holder"] == held.holder
    with pytest.raises(CommandError):
        call_command("pylease", "status", "--no-such-option", stderr=StringIO())


def _cli_has(command: str) -> bool:
    import typer.main

    from pylease import cli

    return command in typer.main.get_command(cli.app).commands  # type: ignore[attr-defined]


def _sql_has_history() -> bool:
    from pylease._resources import data_dir

    folder = data_dir("migrations", "postgres")
    return any("lease_history" in path.read_text() for path in folder.glob("*.sql"))


@pytest.mark.xfail(
    not (_cli_has("history") and _sql_has_history()),
    reason="needs `pylease history` (cli) and lease_history (sql 0003)",
    strict=True,
)
def test_the_management_command_prints_history(db: Conn) -> None:
    from django.core.management import call_command

    db.execute("SELECT lease_claim('h', '1 ms', 'gone')")
    db.execute("SELECT pg_sleep(0.01)")
    db.execute("SELECT lease_claim('h', '30 s', 'next')")
    out = StringIO()
    call_command("pylease", "history", "h", stdout=out)
    assert "taken_over" in out.getvalue()


async def test_alease_on_a_django_connection_in_async_code(db: Conn) -> None:
    """In an async view Django's connection may not be touched: pylease reaches the
    database through its settings, on connections of its own."""
    from django.db import connection

    from pylease import alease

    async with alease(connection, "from-async-view", ttl=30) as held:
        row = status(db, "from-async-view")
        assert row is not None and row["held"] and row["holder"] == held.holder

    @exclusive(connection, "async-report-{day}", ttl=30)
    async def report(day: str) -> str:
        return day

    assert await report("2026-12-01") == "2026-12-01"
