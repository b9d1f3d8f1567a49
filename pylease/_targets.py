"""Which objects are targets of which API, the error for one that is not, and
whether the caller's connection can run a statement of pylease's now.

Shared by :mod:`pylease._links` and :mod:`pylease._links_async`: a target handed to
the wrong API is told which one to use.
"""

from __future__ import annotations

import importlib
import sqlite3
from typing import Any

import psycopg
from psycopg.pq import ConnStatus, TransactionStatus

from pylease.errors import InvalidArgument


def pool_class() -> type[Any] | None:
    try:
        from psycopg_pool import ConnectionPool
    except ImportError:  # pragma: no cover - psycopg_pool is an optional extra
        return None
    return ConnectionPool


def async_pool_class() -> type[Any] | None:
    try:
        from psycopg_pool import AsyncConnectionPool
    except ImportError:  # pragma: no cover
        return None
    return AsyncConnectionPool


def _sync_pool_types() -> tuple[type[Any], ...]:
    cls = pool_class()
    return () if cls is None else (cls,)


def bad_target(target: object, parameter: str, api: str) -> InvalidArgument:
    """The error for a target this API cannot use; a string is never echoed (passwords)."""
    cls = async_pool_class()
    async_ = isinstance(target, psycopg.AsyncConnection) or (
        cls is not None and isinstance(target, cls)
    )
    if api == "lease" and async_:
        why = f"cannot be an async {type(target).__name__}: use alease()"
    elif api == "alease" and isinstance(target, (psycopg.Connection, *_sync_pool_types())):
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


_OK = int(ConnStatus.OK)
_IDLE = int(TransactionStatus.IDLE)


def is_idle(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """True when a statement run on ``conn`` now would not join a transaction of the caller."""
    # The libpq ints, not conn.info's enums: this runs several times per lease.
    pgconn = conn.pgconn
    return pgconn.status == _OK and pgconn.transaction_status == _IDLE


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
