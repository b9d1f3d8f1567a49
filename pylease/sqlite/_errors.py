"""sqlite3 errors as pylease errors: busy, read-only, corrupt, missing schema, exhausted fences."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from pylease.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    FenceExhausted,
    InvalidArgument,
    PyleaseError,
    SchemaMissing,
)

# SQLite's primary result codes that pylease tells apart.
_BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT = 5, 6, 8, 10, 11
_FULL, _CANTOPEN, _PROTOCOL, _NOTADB = 13, 14, 15, 26


# Errors ----------------------------------------------------------------------


def _translate(exc: sqlite3.Error, name: str | None, where: str) -> PyleaseError:
    message = " ".join(str(exc).split())
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if isinstance(exc, sqlite3.IntegrityError) and message.startswith("pylease: fences exhausted"):
        # The trigger's message is a literal: the name comes from the call.
        return FenceExhausted(
            f"pylease: lease {name!r} has used every fence (2^63-1): it cannot be granted again",
            name=name,
        )
    if isinstance(exc, sqlite3.IntegrityError) and message.startswith("pylease: "):
        parameter = message.removeprefix("pylease: ").split(" ", 1)[0]
        return InvalidArgument(message, parameter=parameter, name=name)
    if "no such table: pylease_leases" in message:
        return SchemaMissing(
            f"pylease: the pylease schema is not installed in {where}: open it with "
            "pylease.sqlite.connect(), or call pylease.sqlite.migrate(conn)",
            name=name,
        )
    if primary in (_BUSY, _LOCKED):
        return DatabaseUnavailable(
            f"pylease: the SQLite database {where} stayed locked by another writer "
            f"for longer than the busy timeout ({message})",
            name=name,
        )
    if primary == _READONLY:
        return ConfigurationError(
            f"pylease: the SQLite database {where} is read-only ({message})", name=name
        )
    if primary in (_CORRUPT, _NOTADB):
        return DatabaseUnavailable(
            f"pylease: {where} is not a SQLite database, or it is corrupt ({message}); "
            "move it aside: pylease creates a new one",
            name=name,
        )
    if primary in (_IOERR, _FULL, _CANTOPEN, _PROTOCOL):
        return DatabaseUnavailable(
            f"pylease: cannot use the SQLite database {where} ({message})", name=name
        )
    if isinstance(exc, sqlite3.ProgrammingError) and "thread" in message:
        return ConfigurationError(
            "pylease: this sqlite3 connection was opened with check_same_thread=True, but "
            "pylease uses it from other threads (heartbeat, asyncio): open it with "
            "pylease.sqlite.connect(), or with check_same_thread=False",
            name=name,
        )
    if isinstance(exc, sqlite3.ProgrammingError) and "closed" in message:
        return DatabaseUnavailable(f"pylease: the SQLite connection is closed ({message})")
    return PyleaseError(f"pylease: {type(exc).__name__}: {message}", name=name)


@contextmanager
def _errors(name: str | None, where: str) -> Iterator[None]:
    """Map sqlite3 errors to pylease errors, keeping the driver error as ``__cause__``."""
    try:
        yield
    except sqlite3.Error as exc:
        raise _translate(exc, name, where) from exc


def _where(conn: sqlite3.Connection) -> str:
    known: str | None = getattr(conn, "pylease_path", None)
    if known is not None:
        return known
    try:
        for _seq, schema, file in conn.execute("PRAGMA database_list").fetchall():
            if schema == "main":
                return str(file) or ":memory:"
    except sqlite3.Error:
        pass
    return "(this connection's database)"
