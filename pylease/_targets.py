"""Which objects are targets of which API, and the error for one that is not.

Shared by :mod:`pylease._links` and :mod:`pylease._links_async`: a target handed to
the wrong API is told which one to use.

Nothing here imports the driver: an object can only be a psycopg connection or a
psycopg_pool pool once its module was imported, so a module missing from
``sys.modules`` answers "no" without loading it. A lease on SQLite (``pylease run``
in a shell loop) then never pays for psycopg, and one on PostgreSQL has loaded it
already, by making its target.
"""

from __future__ import annotations

import importlib
import sqlite3
import sys
from typing import TYPE_CHECKING, Any, TypeGuard

from pylease.errors import InvalidArgument

if TYPE_CHECKING:
    import psycopg


def is_connection(target: object) -> TypeGuard[psycopg.Connection[Any]]:
    """True for a psycopg ``Connection``."""
    pg = sys.modules.get("psycopg")
    return pg is not None and isinstance(target, pg.Connection)


def is_async_connection(target: object) -> TypeGuard[psycopg.AsyncConnection[Any]]:
    """True for a psycopg ``AsyncConnection``."""
    pg = sys.modules.get("psycopg")
    return pg is not None and isinstance(target, pg.AsyncConnection)


def is_psycopg(
    target: object,
) -> TypeGuard[psycopg.Connection[Any] | psycopg.AsyncConnection[Any]]:
    """True for a psycopg connection, sync or async."""
    pg = sys.modules.get("psycopg")
    return pg is not None and isinstance(target, (pg.Connection, pg.AsyncConnection))


def is_pool(target: object) -> bool:
    """True for a psycopg_pool ``ConnectionPool``."""
    pools = sys.modules.get("psycopg_pool")
    return pools is not None and isinstance(target, pools.ConnectionPool)


def is_async_pool(target: object) -> bool:
    """True for a psycopg_pool ``AsyncConnectionPool``."""
    pools = sys.modules.get("psycopg_pool")
    return pools is not None and isinstance(target, pools.AsyncConnectionPool)


def in_event_loop() -> bool:
    """True inside a running event loop (none runs before asyncio was imported)."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def bad_target(target: object, parameter: str, api: str) -> InvalidArgument:
    """The error for a target this API cannot use; a string is never echoed (passwords)."""
    if api == "lease" and (is_async_connection(target) or is_async_pool(target)):
        why = f"cannot be an async {type(target).__name__}: use alease()"
    elif api == "alease" and (is_connection(target) or is_pool(target)):
        why = f"cannot be a sync {type(target).__name__}: use lease()"
    elif isinstance(target, str):
        why = "is not a postgresql://, postgres:// or sqlite:/// URL, nor a key=value string"
    else:
        kind = "an async" if api == "alease" else "a"
        why = (
            f"cannot be {type(target).__name__}: expected {kind} psycopg connection "
            "or psycopg_pool pool, a postgresql:// or sqlite:/// URL, or a sqlite3.Connection"
        )
    return InvalidArgument(f"pylease: {parameter} {why}", parameter=parameter)


def sqlite_module() -> Any:
    """``pylease.sqlite``, imported when a SQLite target is first used."""
    return importlib.import_module("pylease.sqlite")


def sqlite_location(conn: sqlite3.Connection) -> str | None:
    """The file behind a SQLite connection; None for an in-memory database."""
    path: str | None = getattr(conn, "pylease_path", None)
    if path is None:
        for _seq, schema, file in conn.execute("PRAGMA database_list").fetchall():
            if schema == "main":
                path = file
    return path if path and path != ":memory:" else None
