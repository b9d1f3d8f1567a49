# The source of pylease/postgres/_sources.py: tools/async_to_sync.py writes it from this file.
"""The sources of PostgreSQL targets: where a URL's, a pool's or a connection's leases
are renewed (see :mod:`pylease._links_async`, which imports this module only for a
target that reaches PostgreSQL, so that a lease on SQLite never loads the driver).

- :class:`AsyncConninfoSource`: one connection of pylease's own, for a URL, and for a
  bare connection's renewals (opened with that connection's parameters);
- :class:`AsyncPoolSource`: a psycopg_pool pool, a connection borrowed per operation;
- :class:`AsyncConnectionSource`: a connection the user dedicated to pylease.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Hashable
from typing import Any, TypeVar

import psycopg

from pylease import _budget
from pylease import dsn as dsn_mod
from pylease._acompat import ALock, alock_within, aspawn, monotonic
from pylease._budget import FLOOR
from pylease._links_async import AT_ONCE, AsyncOp, AsyncSource, find_schema, registry, take
from pylease._targets import is_async_pool
from pylease.errors import DatabaseUnavailable
from pylease.postgres._abandon import STATEMENT_BOUND, bounded
from pylease.postgres._backend_async import (
    AsyncPostgresBackend,
    connect_own,
    connection_schema,
    not_installed,
    run_committed,
    schemas,
    wrap_errors,
)
from pylease.postgres._conninfo import (
    HEARTBEAT_APP,
    check_url,
    connection_conninfo,
    conninfo_of,
    is_postgres_url,
    own_conninfo,
    pool_conninfo,
)

T = TypeVar("T")


def source_for(target: object, parameter: str) -> tuple[AsyncSource, str | None] | None:
    """The renewal source of a PostgreSQL target (a URL or key=value string, an
    ``AsyncConnection``, an ``AsyncConnectionPool``), and the conninfo to LISTEN with;
    None for another target."""
    if isinstance(target, str):
        if is_postgres_url(target):
            check_url(target, parameter)
            return AsyncConninfoSource(target), target
    elif isinstance(target, psycopg.AsyncConnection):
        return AsyncConnectionSource(target), connection_conninfo(target)
    elif is_async_pool(target):
        return AsyncPoolSource(target), pool_conninfo(target)
    return None


def own_source(conn: psycopg.AsyncConnection[Any]) -> tuple[AsyncSource, str]:
    """Where a bare connection's leases are renewed: a connection of pylease's own,
    opened with its parameters (password included, see :func:`connection_conninfo`),
    acquired from the registry for the caller; and the conninfo to LISTEN with."""
    conninfo = conninfo_of(conn)
    source = registry().acquire_key(("postgres", conninfo), lambda: AsyncConninfoSource(conninfo))
    return source, conninfo


class AsyncConninfoSource:
    """One connection of pylease's own, opened on first use and again after it breaks.

    Built for every lease but kept only by the first of its key (see the registry),
    so everything derived from the conninfo is computed when first needed.
    """

    def __init__(self, conninfo: str) -> None:
        self.key: Hashable = ("postgres", conninfo)
        self._given = conninfo
        self._lock = ALock()
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._schema: str | None = None
        self._closing: Any = None

    @functools.cached_property
    def label(self) -> str:
        return dsn_mod.redact(self._given)

    async def schema(self, name: str | None) -> str | None:
        if self._schema is None:
            # Its connection has no session state: the conninfo's options and the
            # role's and database's settings make its search_path.
            self._schema = await self.run(find_schema, name=name, retry=True)
            if self._schema is None:
                raise not_installed(name)
        return self._schema

    @functools.cached_property
    def _conninfo(self) -> str:
        return own_conninfo(self._given, HEARTBEAT_APP)

    async def run(
        self, op: AsyncOp[T], *, name: str | None = None, retry: bool = False, urgent: bool = False
    ) -> T:
        await take(self._lock, name)
        try:
            fresh = self._conn is None or self._conn.closed or self._conn.broken
            if fresh:
                await self._discard()
                self._conn = await connect_own(self._conninfo, name)
            assert self._conn is not None
            try:
                with bounded(self._conn):
                    return await op(AsyncPostgresBackend(self._conn))
            except DatabaseUnavailable:
                await self._discard()
                if fresh or not retry:
                    raise
            except asyncio.CancelledError:  # ASYNC
                # Cancelled mid-statement: the connection's state is unknown.
                await asyncio.shield(self._discard())
                raise
            # The connection broke while it sat idle (server restart, terminated
            # backend): one fresh attempt before reporting it.
            self._conn = await connect_own(self._conninfo, name)
            with bounded(self._conn):
                return await op(AsyncPostgresBackend(self._conn))
        finally:
            self._lock.release()

    async def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def close(self) -> None:
        if self._conn is None and not self._lock.locked():
            return  # never connected (a lease that was never renewed), nothing under way
        left = _budget.left()
        if left is None:
            await self._close()
        elif await alock_within(self._lock, left):
            try:
                await self._discard()
            finally:
                self._lock.release()
        else:
            # A block's exit whose budget ran out while a renewal, hung, held the
            # connection: it is closed once that renewal ends.
            self._closing = aspawn(self._close, name="pylease-close")

    async def _close(self) -> None:
        async with self._lock:
            await self._discard()


class AsyncPoolSource:
    """A psycopg_pool pool: each operation borrows a connection."""

    def __init__(self, pool: Any) -> None:
        self.key: Hashable = ("pool", id(pool))
        self.label = f"pool {pool.name!r}"
        self.pool = pool

    async def run(
        self, op: AsyncOp[T], *, name: str | None = None, retry: bool = False, urgent: bool = False
    ) -> T:
        # A pool's own wait for a free connection may be long (30 s by default), and
        # without a connect timeout of its own, endless while the database is silent.
        wait = _budget.wait_bound(STATEMENT_BOUND if urgent else None)
        tries = self.pool.max_size + 1 if retry else 1
        while True:
            tries -= 1
            started = monotonic()
            try:
                return await self._run(op, name, wait)
            except DatabaseUnavailable:
                # After a restart every idle connection of the pool is broken: each
                # fails at once, and the pool replaces it. A failure that took its time
                # is a silent database, which another attempt would wait for again.
                if tries <= 0 or monotonic() - started > AT_ONCE or not _budget.spare(FLOOR):
                    raise

    async def _run(self, op: AsyncOp[T], name: str | None, wait: float | None) -> T:
        with wrap_errors(name):
            async with self.pool.connection(timeout=wait) as conn:
                result: T = await run_committed(conn, op)
                return result

    async def schema(self, name: str | None) -> str | None:
        found = schemas.get(self.pool)
        if found is None:
            # Looked up once per pool: its connections are configured alike.
            found = await self.run(find_schema, name=name, retry=True)
            if found is None:
                raise not_installed(name)
            schemas[self.pool] = found
        return found

    async def close(self) -> None:
        pass


class AsyncConnectionSource:
    """A connection the user dedicated to pylease (``heartbeat_target=conn``)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.key: Hashable = ("connection", id(conn))
        self.label = "a dedicated connection"
        self.conn = conn
        self._lock = ALock()

    async def run(
        self, op: AsyncOp[T], *, name: str | None = None, retry: bool = False, urgent: bool = False
    ) -> T:
        await take(self._lock, name)
        try:
            return await run_committed(self.conn, op)
        finally:
            self._lock.release()

    async def schema(self, name: str | None) -> str | None:
        async with self._lock:
            return await connection_schema(self.conn, name)

    async def close(self) -> None:
        pass
