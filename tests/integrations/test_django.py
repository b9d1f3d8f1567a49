"""pylease.contrib.django and Django connections as targets, with a real Django on a
real PostgreSQL (settings: tests/support/django_settings.py)."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from io import StringIO
from typing import Any

# Installed by the dev extra (`make test`): a missing one fails, never skips.
import django
import psycopg
import pytest

from pylease import FOREVER, exclusive, lease
from pylease.migrate import rollback
from tests.fixtures.database import _create_db, _drop_db
from tests.support.leases import status, wait_until

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


# A block that ends inside the caller's transaction (issue 21, item 3) -------------------


def test_read_modify_write_jobs_in_atomic_blocks_count_every_job(db: Conn) -> None:
    """Four jobs, each in transaction.atomic() (as ATOMIC_REQUESTS wraps a view): the
    block reads and writes the counter; the transaction commits a moment after it."""
    from django.db import connection, transaction

    db.execute("CREATE TABLE IF NOT EXISTS integ_counter (n int)")
    db.execute("DELETE FROM integ_counter")
    db.execute("INSERT INTO integ_counter VALUES (0)")
    errors: list[BaseException] = []

    def job() -> None:
        try:
            with transaction.atomic():
                with lease(connection, "counter", ttl=60, wait=FOREVER), connection.cursor() as cur:
                    cur.execute("SELECT n FROM integ_counter")
                    (n,) = cur.fetchone()
                    cur.execute("UPDATE integ_counter SET n = %s", (n + 1,))
                time.sleep(0.2)  # the rest of the view, in the same transaction
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=job) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert db.execute("SELECT n FROM integ_counter").fetchone() == (4,)


@pytest.mark.parametrize("end", ["commit", "rollback", "savepoint-rollback"])
def test_a_lease_is_held_until_the_atomic_block_ends(db: Conn, end: str) -> None:
    from django.db import connection, transaction

    def held_now() -> bool:
        return bool((status(db, "in-atomic-end") or {}).get("held"))

    with ExitStack() as outer:
        if end == "savepoint-rollback":
            outer.enter_context(transaction.atomic())
        ends = pytest.raises(Rollback) if end != "commit" else ExitStack()
        with ends, transaction.atomic():
            with lease(connection, "in-atomic-end", ttl=60), connection.cursor() as cur:
                cur.execute("SELECT 1")
            time.sleep(0.3)
            assert held_now()
            if end != "commit":
                raise Rollback
        # The writes of the block are committed or gone: the lease follows.
        assert wait_until(lambda: not held_now())
