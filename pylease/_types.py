"""The types of the public signatures: what a target may be, and how a duration is spelled.

``Target`` is what :func:`pylease.lease` and the other sync functions accept,
``AsyncTarget`` what :func:`pylease.alease` and the async ones accept. They are for
type checkers and editors: at run time both are ``object`` (the optional drivers and
ORMs named in them are imported only by a type checker, never by pylease), and the
target is checked by the function itself.

Without SQLAlchemy or psycopg_pool installed, a type checker sees their classes as
``Any``; a Django connection is matched by its shape (:class:`DjangoConnection`),
since Django ships no type information.
"""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from pylease._checks import FOREVER as FOREVER

__all__ = ["FOREVER", "AsyncTarget", "DjangoConnection", "Duration", "Target", "Wait"]

# A span: a timedelta, seconds, or the command line's spelling ("250ms", "5m", "1h30m").
Duration: TypeAlias = timedelta | float | str
# How long to wait for a busy lease: a Duration, or FOREVER (math.inf, "forever").
Wait: TypeAlias = timedelta | float | str


class DjangoConnection(Protocol):
    """Django's ``django.db.connection`` (or ``connections[alias]``), by its shape."""

    @property
    def vendor(self) -> str: ...

    @property
    def settings_dict(self) -> Any: ...

    def ensure_connection(self) -> None: ...


if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import AsyncConnectionPool, ConnectionPool
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.engine import Engine
    from sqlalchemy.ext.asyncio import AsyncConnection as SAAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
    from sqlalchemy.orm import Session

    Target: TypeAlias = (
        "psycopg.Connection[Any] | ConnectionPool[Any] | str | sqlite3.Connection"
        " | Engine | SAConnection | Session | DjangoConnection"
    )
    AsyncTarget: TypeAlias = (
        "psycopg.AsyncConnection[Any] | AsyncConnectionPool[Any] | str | sqlite3.Connection"
        " | Engine | AsyncEngine | SAAsyncConnection | AsyncSession | DjangoConnection"
    )
else:
    Target = object
    AsyncTarget = object
