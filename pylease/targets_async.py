"""How a lease reaches its database, for the asynchronous API.

The twin of :mod:`pylease.targets`: a target of :func:`pylease.alease` is a psycopg
``AsyncConnection``, a psycopg_pool ``AsyncConnectionPool``, a URL or a
``sqlite3.Connection`` (run in a worker thread). Async connections belong to one
event loop, so sources are shared per loop, not per process.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import weakref
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Protocol, TypeVar

import psycopg

from pylease import dsn as dsn_mod
from pylease._backend import AsyncBackend
from pylease._orm import adapt
from pylease.errors import DatabaseUnavailable, InvalidArgument
from pylease.postgres import AsyncPostgresBackend, wrap_errors
from pylease.targets import (
    CHANNEL,
    HEARTBEAT_APP,
    LISTEN_APP,
    ListenerLost,
    bad_target,
    check_url,
    connection_conninfo,
    is_idle,
    is_postgres_url,
    own_conninfo,
    pool_conninfo,
    sqlite_location,
    sqlite_module,
)

T = TypeVar("T")
AsyncOp = Callable[[AsyncBackend], Awaitable[T]]

logger = logging.getLogger("pylease")


async def connect_own(conninfo: str, name: str | None) -> psycopg.AsyncConnection[Any]:
    """Open an async connection of pylease's own: autocommit, no prepared statements."""
    with wrap_errors(name):
        return await psycopg.AsyncConnection.connect(
            conninfo, autocommit=True, prepare_threshold=None
        )


async def run_committed(conn: psycopg.AsyncConnection[Any], op: AsyncOp[T]) -> T:
    """Run ``op`` on an idle connection as a transaction of its own."""
    if conn.autocommit:
        return await op(AsyncPostgresBackend(conn))
    try:
        result = await op(AsyncPostgresBackend(conn))
    except BaseException:
        if not conn.closed:
            with wrap_errors():
                await conn.rollback()
        raise
    with wrap_errors():
        await conn.commit()
    return result


class AsyncSource(Protocol):
    """Where renewals run: one per database per event loop, shared by its leases."""

    key: Hashable
    label: str

    async def run(self, op: AsyncOp[T], *, name: str | None = None, retry: bool = False) -> T:
        """Run ``op`` as a transaction of its own; ``retry`` once on a stale connection."""
        ...

    async def close(self) -> None: ...


class AsyncConninfoSource:
    """One async connection of pylease's own, opened on first use and again after it breaks."""

    def __init__(self, conninfo: str) -> None:
        self.key: Hashable = ("postgres", conninfo)
        self.label = dsn_mod.redact(conninfo)
        self._conninfo = own_conninfo(conninfo, HEARTBEAT_APP)
        self._lock = asyncio.Lock()
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def run(self, op: AsyncOp[T], *, name: str | None = None, retry: bool = False) -> T:
        async with self._lock:
            fresh = self._conn is None or self._conn.closed or self._conn.broken
            if fresh:
                await self._discard()
                self._conn = await connect_own(self._conninfo, name)
            assert self._conn is not None
            try:
                return await op(AsyncPostgresBackend(self._conn))
            except DatabaseUnavailable:
                await self._discard()
                if fresh or not retry:
                    raise
            except asyncio.CancelledError:
                # Cancelled mid-statement: the connection's state is unknown.
                await asyncio.shield(self._discard())
                raise
            self._conn = await connect_own(self._conninfo, name)
            return await op(AsyncPostgresBackend(self._conn))

    async def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def close(self) -> None:
        async with self._lock:
            await self._discard()


class AsyncPoolSource:
    """A psycopg_pool ``AsyncConnectionPool``: each operation borrows a connection."""

    def __init__(self, pool: Any) -> None:
        self.key: Hashable = ("pool", id(pool))
        self.label = f"pool {pool.name!r}"
        self.pool = pool

    async def run(self, op: AsyncOp[T], *, name: str | None = None, retry: bool = False) -> T:
        try:
            return await self._run(op, name)
        except DatabaseUnavailable:
            if not retry:
                raise
        return await self._run(op, name)

    async def _run(self, op: AsyncOp[T], name: str | None) -> T:
        with wrap_errors(name):
            async with self.pool.connection() as conn:
                result: T = await run_committed(conn, op)
                return result

    async def close(self) -> None:
        pass


class AsyncConnectionSource:
    """An async connection the user dedicated to pylease (``heartbeat_target=conn``)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.key: Hashable = ("connection", id(conn))
        self.label = "a dedicated connection"
        self.conn = conn
        self._lock = asyncio.Lock()

    async def run(self, op: AsyncOp[T], *, name: str | None = None, retry: bool = False) -> T:
        async with self._lock:
            return await run_committed(self.conn, op)

    async def close(self) -> None:
        pass


class AsyncSqliteSource:
    """A SQLite database file on a connection of pylease's own, its calls in worker threads."""

    def __init__(self, location: str | None = None, conn: sqlite3.Connection | None = None) -> None:
        self.key: Hashable = ("sqlite", location) if location is not None else ("sqlite", id(conn))
        self.label = location or "an in-memory SQLite database"
        self._conn = conn
        self._location = location
        self._lock = asyncio.Lock()

    async def connection(self) -> sqlite3.Connection:
        async with self._lock:
            if self._conn is None:
                conn: sqlite3.Connection = await asyncio.to_thread(
                    sqlite_module().connect, self._location
                )
                self._conn = conn
            return self._conn

    async def run(self, op: AsyncOp[T], *, name: str | None = None, retry: bool = False) -> T:
        backend: AsyncBackend = sqlite_module().AsyncSqliteBackend(await self.connection())
        return await op(backend)

    async def close(self) -> None:
        async with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None and self._location is not None:
            await asyncio.to_thread(conn.close)


class _AsyncRegistry:
    """The sources in use on one event loop, shared by key and closed with their last lease."""

    def __init__(self) -> None:
        self._sources: dict[Hashable, tuple[AsyncSource, int]] = {}

    def acquire(self, source: AsyncSource) -> AsyncSource:
        found, count = self._sources.get(source.key, (source, 0))
        self._sources[source.key] = (found, count + 1)
        return found

    async def release(self, source: AsyncSource) -> None:
        found, count = self._sources[source.key]
        if count > 1:
            self._sources[source.key] = (found, count - 1)
            return
        del self._sources[source.key]
        await found.close()


_registries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _AsyncRegistry] = (
    weakref.WeakKeyDictionary()
)


def registry() -> _AsyncRegistry:
    """The registry of the running event loop."""
    loop = asyncio.get_running_loop()
    found = _registries.get(loop)
    if found is None:
        found = _registries[loop] = _AsyncRegistry()
    return found


class AsyncListener:
    """An async connection LISTENing on ``pylease``."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn: psycopg.AsyncConnection[Any] | None = conn

    @classmethod
    async def open(cls, conninfo: str, name: str) -> AsyncListener | None:
        """Start listening; None (and the waiter polls) when LISTEN cannot be used."""
        try:
            conn = await psycopg.AsyncConnection.connect(
                own_conninfo(conninfo, LISTEN_APP), autocommit=True, prepare_threshold=None
            )
            await conn.execute("LISTEN " + CHANNEL)
        except psycopg.Error as exc:
            logger.info("cannot LISTEN for lease %r, polling instead: %s", name, exc)
            return None
        return cls(conn)

    async def wait(self, name: str, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True if a release of ``name`` was announced."""
        conn = self.conn
        if conn is None:
            return False
        try:
            async for notify in conn.notifies(timeout=max(timeout, 0.0)):
                if notify.payload == name:
                    return True
        except psycopg.Error as exc:
            logger.info("LISTEN connection lost while waiting for %r: %s", name, exc)
            await self.close()
            raise ListenerLost from exc
        return False

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            await conn.close()


class AsyncLink:
    """How one async lease claims, releases, renews and listens (see :class:`targets.Link`)."""

    def __init__(
        self,
        source: AsyncSource,
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
        listen_conninfo: str | None = None,
    ) -> None:
        self.source = registry().acquire(source)
        self.conn = conn
        self.listen_conninfo = listen_conninfo
        self.sqlite = isinstance(source, AsyncSqliteSource)

    async def run(self, op: AsyncOp[T], *, name: str | None = None, retry: bool = False) -> T:
        conn = self.conn
        if conn is not None and (is_idle(conn) or conn.closed):
            return await run_committed(conn, op)
        return await self.source.run(op, name=name, retry=retry)

    async def run_release(self, op: AsyncOp[T], *, name: str) -> T:
        conn = self.conn
        if conn is not None and is_idle(conn):
            return await run_committed(conn, op)
        return await self.source.run(op, name=name)

    async def listen(self, name: str) -> AsyncListener | None:
        if self.listen_conninfo is None:
            return None
        return await AsyncListener.open(self.listen_conninfo, name)

    async def close(self) -> None:
        await registry().release(self.source)


def _async_pool_class() -> type[Any] | None:
    try:
        from psycopg_pool import AsyncConnectionPool
    except ImportError:  # pragma: no cover - psycopg_pool is an optional extra
        return None
    return AsyncConnectionPool


def source_for(target: object, parameter: str = "target") -> tuple[AsyncSource, str | None]:
    """The renewal source of an async target, and the conninfo to LISTEN with."""
    target = adapt(target, parameter)  # ORM targets: SQLAlchemy, Django (pylease._orm)
    pool_cls = _async_pool_class()
    if isinstance(target, str):
        if dsn_mod.is_sqlite(target):
            return AsyncSqliteSource(target), None
        if is_postgres_url(target):
            check_url(target, parameter)
            return AsyncConninfoSource(target), target
    elif isinstance(target, psycopg.AsyncConnection):
        return AsyncConnectionSource(target), connection_conninfo(target)
    elif pool_cls is not None and isinstance(target, pool_cls):
        return AsyncPoolSource(target), pool_conninfo(target)
    elif isinstance(target, sqlite3.Connection):
        # Everything runs on pylease's own connection to the same file: the
        # caller's may refuse worker threads (check_same_thread).
        location = sqlite_location(target)
        return AsyncSqliteSource(location, None if location else target), None
    raise bad_target(target, parameter, "alease")


def check(target: object, heartbeat_target: object = None) -> None:
    """Raise InvalidArgument now for a target :func:`link` would refuse (no I/O)."""
    target = adapt(target)  # ORM targets: SQLAlchemy, Django (pylease._orm)
    if isinstance(target, psycopg.AsyncConnection):
        if heartbeat_target is not None:
            source, _listen = source_for(heartbeat_target, "heartbeat_target")
            if isinstance(source, AsyncSqliteSource):
                raise InvalidArgument(
                    "pylease: heartbeat_target must reach PostgreSQL", parameter="heartbeat_target"
                )
        return
    if heartbeat_target is not None:
        raise InvalidArgument(
            "pylease: heartbeat_target is for a Connection target only: a URL or pool "
            "target renews through itself",
            parameter="heartbeat_target",
        )
    source_for(target)


def link(target: object, *, heartbeat_target: object = None) -> AsyncLink:
    """The :class:`AsyncLink` for a target of the asynchronous API (see ``targets.link``)."""
    target = adapt(target)  # ORM targets: SQLAlchemy, Django (pylease._orm)
    check(target, heartbeat_target)
    if isinstance(target, psycopg.AsyncConnection):
        if heartbeat_target is None:
            conninfo = connection_conninfo(target)
            return AsyncLink(AsyncConninfoSource(conninfo), conn=target, listen_conninfo=conninfo)
        source, listen = source_for(heartbeat_target, "heartbeat_target")
        return AsyncLink(source, conn=target, listen_conninfo=listen)
    source, listen = source_for(target)
    return AsyncLink(source, listen_conninfo=listen)
