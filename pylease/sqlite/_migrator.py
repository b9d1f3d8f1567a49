"""The SQLite migrations of ``migrations/sqlite/``, recorded in yoyo's own tables."""

from __future__ import annotations

import functools
import getpass
import os
import socket
import sqlite3
import threading
import uuid

from pylease._resources import data_dir
from pylease.errors import ConfigurationError
from pylease.sqlite._errors import _errors, _where

_MIGRATION_TABLE = "_yoyo_migration"
# yoyo's own bookkeeping tables (its internal schema version 2), so that
# `yoyo apply sqlite:///...` and pylease agree on what is applied.
_YOYO_TABLES = (
    'CREATE TABLE IF NOT EXISTS "_yoyo_migration" ("migration_hash" VARCHAR(64), '
    '"migration_id" VARCHAR(255), "applied_at_utc" TIMESTAMP, PRIMARY KEY ("migration_hash"))',
    'CREATE TABLE IF NOT EXISTS "_yoyo_log" ("id" VARCHAR(36), "migration_hash" VARCHAR(64), '
    '"migration_id" VARCHAR(255), "operation" VARCHAR(10), "username" VARCHAR(255), '
    '"hostname" VARCHAR(255), "comment" VARCHAR(255), "created_at_utc" TIMESTAMP, '
    'PRIMARY KEY ("id"))',
    'CREATE TABLE IF NOT EXISTS "_yoyo_version" ("version" INT NOT NULL PRIMARY KEY, '
    '"installed_at_utc" TIMESTAMP)',
)
_SQL_UTC_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"


# Serializes connections that connect() did not open (they carry no lock of their own):
# the migrator and the backend share it.
_SHARED_LOCK = threading.RLock()


# Migrations ------------------------------------------------------------------


def _statements(script: str) -> list[str]:
    """Split a SQL script into statements (triggers included), dropping bare comments."""
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    rest = "\n".join(
        line for line in buffer.splitlines() if line.strip() and not line.strip().startswith("--")
    )
    if rest:
        raise ConfigurationError(f"pylease: an incomplete SQL statement ends a migration: {rest}")
    return statements


@functools.cache
def _migrations() -> tuple[tuple[str, tuple[str, ...]], ...]:
    folder = data_dir("migrations", "sqlite")
    files = sorted(p for p in folder.glob("*.sql") if not p.name.endswith(".rollback.sql"))
    return tuple(
        (p.name.removesuffix(".sql"), tuple(_statements(p.read_text(encoding="utf-8"))))
        for p in files
    )


def _applied(conn: sqlite3.Connection) -> set[str]:
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (_MIGRATION_TABLE,)
    ).fetchone()
    if exists is None:
        return set()
    return {row[0] for row in conn.execute(f'SELECT migration_id FROM "{_MIGRATION_TABLE}"')}


def _who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def migrate(conn: sqlite3.Connection) -> list[str]:
    """Apply every pending migration of ``migrations/sqlite/``; returns the ids applied.

    All of them in one ``BEGIN IMMEDIATE`` transaction, so that processes opening a
    new file at once serialize on SQLite's write lock and a migrator killed halfway
    leaves nothing behind. They are recorded in yoyo's own tables (yoyo's lock
    table, which a killed process would leave behind, is not needed), so
    ``yoyo apply``/``yoyo rollback`` with a ``sqlite:///`` URL agree with pylease.
    A database whose migrations are all applied costs one read.

    :raises DatabaseUnavailable: another writer held the file for longer than the
        busy timeout, or the file is not a SQLite database.
    """
    migrations = _migrations()
    wanted = {migration_id for migration_id, _ in migrations}
    where = _where(conn)
    lock = getattr(conn, "pylease_lock", _SHARED_LOCK)
    with lock, _errors(None, where):
        if wanted <= _applied(conn):
            return []
        # Here, not at the top: a file already migrated opens without loading yoyo.
        from yoyo.migrations import get_migration_hash

        conn.execute("BEGIN IMMEDIATE")
        try:
            for ddl in _YOYO_TABLES:
                conn.execute(ddl)
            conn.execute(f"INSERT OR IGNORE INTO _yoyo_version VALUES (2, {_SQL_UTC_NOW})")
            done = _applied(conn)
            applied: list[str] = []
            for migration_id, statements in migrations:
                if migration_id in done:
                    continue
                for statement in statements:
                    conn.execute(statement)
                migration_hash = get_migration_hash(migration_id)
                conn.execute(
                    f"INSERT INTO _yoyo_migration VALUES (?, ?, {_SQL_UTC_NOW})",
                    (migration_hash, migration_id),
                )
                conn.execute(
                    "INSERT INTO _yoyo_log (id, migration_hash, migration_id, operation, "
                    "username, hostname, comment, created_at_utc) "
                    f"VALUES (?, ?, ?, 'apply', ?, ?, 'pylease.sqlite.migrate', {_SQL_UTC_NOW})",
                    (str(uuid.uuid4()), migration_hash, migration_id, _who(), socket.gethostname()),
                )
                applied.append(migration_id)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return applied
