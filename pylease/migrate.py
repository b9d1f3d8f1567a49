"""``pylease migrate``: install or upgrade the schema with yoyo-migrations.

Safe to run from two deploys at once, and not wedged by a migrator that was
killed mid-run: pylease migrators serialize on a session advisory lock, so a
yoyo lock row found while holding it can only be a dead migrator's.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from pylease import dsn as dsn_mod
from pylease._resources import data_dir
from pylease.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidArgument,
    MigrationError,
)
from pylease.postgres import _adopt_schema

LOCK_TABLE = "_pylease_yoyo_lock"
ADVISORY_KEY = "SELECT pg_try_advisory_lock(hashtextextended('pylease migrate ' || %s, 0))"
DEFAULT_LOCK_WAIT = 60.0
# PostgreSQL cuts longer identifiers (NAMEDATALEN - 1): it would be another schema.
MAX_SCHEMA_BYTES = 63

Say = Callable[[str], None]


def _postgres_migrations() -> Any:
    from yoyo import read_migrations

    return read_migrations(str(data_dir("migrations", "postgres")))


@contextlib.contextmanager
def _backend(dsn: str, schema: str) -> Iterator[Any]:
    from yoyo.backends import get_backend_class
    from yoyo.connections import DatabaseURI
    from yoyo.migrations import default_migration_table

    params = dsn_mod.parse(dsn)
    params.setdefault("connect_timeout", "10")
    # Migrations need a direct session (advisory locks, DDL): no prepared statements
    # to trip a pooler, and a name that shows in pg_stat_activity.
    params.setdefault("application_name", "pylease migrate")
    # yoyo opens a fresh connection for each migration, so the schema travels in
    # the connection parameters rather than in a SET on one session.
    path = "-c search_path=" + _libpq_escape(sql.Identifier(schema).as_string(None))
    params["options"] = f"{params['options']} {path}" if params.get("options") else path
    database = params.pop("dbname", None)
    uri = DatabaseURI("postgresql+psycopg", None, None, None, None, database, params)
    try:
        backend = get_backend_class(uri.scheme)(uri, default_migration_table)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(
            f"pylease: cannot connect to {dsn_mod.redact(dsn)}: {_reason(exc)}"
        ) from exc
    try:
        backend.lock_table = LOCK_TABLE
        yield backend
    finally:
        with contextlib.suppress(Exception):
            backend.connection.close()


def _libpq_escape(value: str) -> str:
    # In libpq's `options`, spaces separate arguments unless escaped with a backslash.
    return value.replace("\\", "\\\\").replace(" ", "\\ ")


def _reason(exc: BaseException) -> str:
    """The server's own message when there is one, else the driver's, on one line."""
    if isinstance(exc, psycopg.Error) and exc.diag.message_primary:
        return exc.diag.message_primary
    return " ".join(str(exc).split()) or type(exc).__name__


@contextlib.contextmanager
def _mapped_errors(schema: str) -> Iterator[None]:
    try:
        yield
    except pg_errors.InsufficientPrivilege as exc:
        raise MigrationError(
            f"pylease: insufficient privilege to migrate schema {schema!r}: {_reason(exc)}"
        ) from exc
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"pylease: database unavailable: {_reason(exc)}") from exc
    except psycopg.Error as exc:
        raise MigrationError(f"pylease: migration failed: {_reason(exc)}") from exc


def _schema_exists(conn: psycopg.Connection[Any], schema: str) -> bool:
    return conn.execute("SELECT FROM pg_namespace WHERE nspname = %s", (schema,)).rowcount == 1


@contextlib.contextmanager
def _exclusive(backend: Any, schema: str, say: Say, lock_wait: float) -> Iterator[None]:
    """Hold the migrators' advisory lock, and clear a lock row a dead migrator left.

    The schema is created under the lock (two concurrent CREATE SCHEMA IF NOT EXISTS
    can both try to create it), and only when missing (the statement needs CREATE on
    the database even when the schema exists, which an owner of the schema may lack).
    """
    conn: psycopg.Connection[Any] = backend.connection
    deadline = time.monotonic() + lock_wait
    told = False
    while not conn.execute(ADVISORY_KEY, (schema,)).fetchone()[0]:  # type: ignore[index]
        if time.monotonic() >= deadline:
            raise MigrationError(
                f"pylease: another migrator has held the migration lock of schema {schema!r} "
                f"for over {lock_wait:g}s; see pg_stat_activity "
                "(application_name 'pylease migrate')"
            )
        if not told:
            say(f"waiting for another migrator of schema {schema!r}")
            told = True
        time.sleep(0.2)
    if not _schema_exists(conn, schema):
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    # yoyo swallows a failure to create its lock table and trips over the missing
    # table later; say what is wrong instead.
    user, may_create, has_lock_table = conn.execute(
        "SELECT current_user, has_schema_privilege(%s, 'CREATE'),"
        " to_regclass(format('%%I.%%I', %s::text, %s::text)) IS NOT NULL",
        (schema, schema, LOCK_TABLE),
    ).fetchone() or (None, False, False)
    if not may_create and not has_lock_table:
        raise MigrationError(
            f"pylease: insufficient privilege to migrate schema {schema!r}: "
            f"role {user!r} may not create objects in it"
        )
    backend.init_database()
    row = conn.execute(
        sql.SQL("SELECT pid, ctime FROM {}").format(sql.Identifier(LOCK_TABLE))
    ).fetchone()
    if row is not None:
        say(
            f"took over a stale migration lock left by pid {row[0]} at {row[1]} "
            "(that migrator is gone: it no longer holds the advisory lock)"
        )
        backend.break_lock()
    yield


def _check_length(schema: str) -> None:
    if len(schema.encode("utf-8", "surrogatepass")) > MAX_SCHEMA_BYTES:
        raise InvalidArgument(
            f"pylease: schema must be at most {MAX_SCHEMA_BYTES} bytes (PostgreSQL cuts "
            "longer names, which would name another schema)",
            parameter="schema",
        )


def _adopt(backend: Any, schema: str, migrations: Any, say: Say) -> None:
    """Record as applied the migrations that built a schema installed from schema.sql."""
    conn: psycopg.Connection[Any] = backend.connection
    ids = [m.id for m in migrations]
    if len(backend.to_apply(migrations)) < len(ids) or not _adopt_schema.has_leases(conn, schema):
        return
    count = _adopt_schema.installed_version(conn, schema, ids)
    if count is None:
        raise MigrationError(
            f"pylease: schema {schema!r} holds pylease objects but no record of pylease "
            "migrations, and they match no released version of sql/postgres/schema.sql: "
            "compare them with it, or move them aside"
        )
    backend.mark_migrations(migrations.filter(lambda m: m.id in ids[:count]))
    say(
        f"schema {schema!r} was installed from schema.sql at {ids[count - 1]}: "
        f"recorded {count} migrations as applied"
    )


def migrate(
    dsn: str, schema: str = "public", *, say: Say = print, lock_wait: float = DEFAULT_LOCK_WAIT
) -> list[str]:
    """Apply every pending migration to ``schema``; returns the ids applied.

    :raises InvalidArgument: a schema name longer than PostgreSQL keeps (63 bytes).
    :raises DatabaseUnavailable: the server cannot be reached.
    :raises MigrationError: a migration failed, privileges are lacking, or another
        migrator held the lock for longer than ``lock_wait`` seconds.
    """
    if not schema:
        raise ConfigurationError("pylease: schema must not be empty")
    _check_length(schema)
    migrations = _postgres_migrations()
    with _backend(dsn, schema) as backend, _mapped_errors(schema):
        with _exclusive(backend, schema, say, lock_wait), backend.lock():
            _adopt(backend, schema, migrations, say)
            pending = backend.to_apply(migrations)
            # yoyo prints the rows of any SELECT a migration runs; nobody asked for them.
            with contextlib.redirect_stdout(io.StringIO()):
                backend.apply_migrations(pending)
        applied = [m.id for m in pending]
        for migration_id in applied:
            say(f"applied {migration_id}")
        if not applied:
            say(f"schema {schema!r} is up to date ({len(migrations)} migrations applied)")
        return applied


def rollback(
    dsn: str, schema: str = "public", *, say: Say = print, lock_wait: float = DEFAULT_LOCK_WAIT
) -> list[str]:
    """Roll back every applied pylease migration (dropping every lease); returns the ids."""
    _check_length(schema)
    migrations = _postgres_migrations()
    with _backend(dsn, schema) as backend, _mapped_errors(schema):
        if not _schema_exists(backend.connection, schema):
            return []
        with _exclusive(backend, schema, say, lock_wait), backend.lock():
            applied = backend.to_rollback(migrations)
            with contextlib.redirect_stdout(io.StringIO()):
                backend.rollback_migrations(applied)
        ids = [m.id for m in applied]
        for migration_id in ids:
            say(f"rolled back {migration_id}")
        return ids
