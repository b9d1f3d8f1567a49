# The source of pylease/_links.py: tools/async_to_sync.py writes it from this file.
"""How a lease reaches its database.

A *target* is what the user hands to :func:`pylease.alease`: a psycopg
``AsyncConnection``, a psycopg_pool ``AsyncConnectionPool``, a URL (``postgresql://...``
or ``sqlite:///path``) or a ``sqlite3.Connection``. :func:`link` turns it into the
lease's :class:`AsyncLink`, which knows

- how to run one operation as a transaction of its own (claim, release), never
  inside the caller's open transaction;
- its :class:`AsyncSource`: the connection renewals run on, shared by every lease
  that reaches the same database (see :mod:`pylease._keeper_async`);
- how to LISTEN for released leases while waiting (PostgreSQL only).

Where the two twins differ (the ``if True:  # ASYNC`` blocks): on an event loop,
sources are shared per loop, not per process, since a psycopg connection of asyncio
belongs to one loop; and a ``sqlite3.Connection`` may refuse worker threads, so on
an event loop everything runs on a SQLite connection of pylease's own, in worker
threads, where the sync API claims and releases on the caller's connection when it
is idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sqlite3
import weakref
from collections.abc import Awaitable, Callable, Hashable, Iterator
from typing import Any, Protocol, TypeVar

import psycopg

from pylease import dsn as dsn_mod
from pylease._acompat import ALock, AMutex, ato_thread
from pylease._backend_async import AsyncBackend
from pylease._orm import adapt
from pylease._targets import async_pool_class
from pylease._targets import bad_target as bad_target
from pylease._targets import is_idle as is_idle
from pylease._targets import sqlite_location as sqlite_location
from pylease._targets import sqlite_module as sqlite_module
from pylease.errors import ConfigurationError, DatabaseUnavailable, InvalidArgument
from pylease.postgres._abandon import Abandon, start_timer
from pylease.postgres._backend_async import AsyncPostgresBackend, wrap_errors
from pylease.postgres._conninfo import CHANNEL as CHANNEL
from pylease.postgres._conninfo import HEARTBEAT_APP as HEARTBEAT_APP
from pylease.postgres._conninfo import LISTEN_APP as LISTEN_APP
from pylease.postgres._conninfo import check_url as check_url
from pylease.postgres._conninfo import connection_conninfo as connection_conninfo
from pylease.postgres._conninfo import conninfo_of
from pylease.postgres._conninfo import is_postgres_url as is_postgres_url
from pylease.postgres._conninfo import own_conninfo as own_conninfo
from pylease.postgres._conninfo import pool_conninfo as pool_conninfo

T = TypeVar("T")
AsyncOp = Callable[[AsyncBackend], Awaitable[T]]

logger = logging.getLogger("pylease")


# How long one statement on a connection of pylease's own may run before the
# connection is abandoned (see pylease.postgres._abandon): with the connect timeout, what
# bounds the release after a renewal hung, so a block ends within 10 s of its body.
STATEMENT_BOUND = 3.0


@contextlib.contextmanager
def bounded(conn: psycopg.AsyncConnection[Any], seconds: float = STATEMENT_BOUND) -> Iterator[None]:
    """Abandon ``conn`` (shut its socket down) if the block runs past ``seconds``."""
    abandon = Abandon(conn)
    if True:  # ASYNC
        handle = asyncio.get_running_loop().call_later(seconds, abandon.fire)
        try:
            yield
        finally:
            abandon.disarm()
            handle.cancel()
    else:
        cancel = start_timer(seconds, abandon.fire)
        try:
            yield
        finally:
            abandon.disarm()
            cancel()


async def connect_own(conninfo: str, name: str | None) -> psycopg.AsyncConnection[Any]:
    """Open a connection of pylease's own: autocommit, no prepared statements."""
    with wrap_errors(name):
        return await psycopg.AsyncConnection.connect(
            conninfo, autocommit=True, prepare_threshold=None
        )


async def run_committed(conn: psycopg.AsyncConnection[Any], op: AsyncOp[T]) -> T:
    """Run ``op`` on an idle connection as a transaction of its own.

    :raises ConfigurationError: the connection is not idle: its open transaction is
        somebody else's, and a claim, renewal or release there would commit it.
    """
    if not conn.closed and not is_idle(conn):
        raise ConfigurationError(
            "pylease: a connection pylease was given for its own statements is inside a"
            " transaction; pylease never runs a claim, renewal or release there (it would"
            " commit that transaction)"
        )
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


# Sources: the connections renewals (and URL and pool leases) run on ------------


class AsyncSource(Protocol):
    """Where renewals run: one per database, shared by its leases."""

    key: Hashable

    @property
    def label(self) -> str:
        """How logs name it (never with a password)."""
        ...

    async def run(self, op: AsyncOp[T], *, name: str | None = None, retry: bool = False) -> T:
        """Run ``op`` as a transaction of its own; ``retry`` once on a stale connection."""
        ...

    async def close(self) -> None: ...


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

    @functools.cached_property
    def label(self) -> str:
        return dsn_mod.redact(self._given)

    @functools.cached_property
    def _conninfo(self) -> str:
        return own_conninfo(self._given, HEARTBEAT_APP)

    async def run(self, op: AsyncOp[T], *, name: str | None = None, retry: bool = False) -> T:
        async with self._lock:
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

    async def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def close(self) -> None:
        async with self._lock:
            await self._discard()


class AsyncPoolSource:
    """A psycopg_pool pool: each operation borrows a connection."""

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
        # The pool replaces a connection found broken; try once more on another.
        return await self._run(op, name)

    async def _run(self, op: AsyncOp[T], name: str | None) -> T:
        with wrap_errors(name):
            async with self.pool.connection() as conn:
                result: T = await run_committed(conn, op)
                return result

    async def close(self) -> None:
        pass


class AsyncConnectionSource:
    """A connection the user dedicated to pylease (``heartbeat_target=conn``)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.key: Hashable = ("connection", id(conn))
        self.label = "a dedicated connection"
        self.conn = conn
        self._lock = ALock()

    async def run(self, op: AsyncOp[T], *, name: str | None = None, retry: bool = False) -> T:
        async with self._lock:
            return await run_committed(self.conn, op)

    async def close(self) -> None:
        pass


class AsyncSqliteSource:
    """A SQLite database file, on a connection of pylease's own, usable from any thread.

    An in-memory database has no second connection: its only one is shared.
    """

    def __init__(self, location: str | None = None, conn: sqlite3.Connection | None = None) -> None:
        self.key: Hashable = ("sqlite", location) if location is not None else ("sqlite", id(conn))
        self.label = location or "an in-memory SQLite database"
        self._conn = conn
        self._location = location
        self._lock = ALock()

    async def connection(self) -> sqlite3.Connection:
        async with self._lock:
            if self._conn is None:
                conn: sqlite3.Connection = await ato_thread(sqlite_module().connect, self._location)
                self._conn = conn
            return self._conn

    async def run(self, op: AsyncOp[T], *, name: str | None = None, retry: bool = False) -> T:
        backend: AsyncBackend = sqlite_module().AsyncSqliteBackend(await self.connection())
        return await op(backend)

    async def close(self) -> None:
        async with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None and self._location is not None:
            await ato_thread(conn.close)


class AsyncRegistry:
    """The sources in use, shared by key and closed with their last lease."""

    def __init__(self) -> None:
        self._mutex = AMutex()
        self._sources: dict[Hashable, tuple[AsyncSource, int]] = {}

    def acquire(self, source: AsyncSource) -> AsyncSource:
        with self._mutex:
            found, count = self._sources.get(source.key, (source, 0))
            self._sources[source.key] = (found, count + 1)
            return found

    async def release(self, source: AsyncSource) -> None:
        with self._mutex:
            found, count = self._sources[source.key]
            if count > 1:
                self._sources[source.key] = (found, count - 1)
                return
            del self._sources[source.key]
        await found.close()


if True:  # ASYNC
    _registries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncRegistry] = (
        weakref.WeakKeyDictionary()
    )

    def registry() -> AsyncRegistry:
        """The registry of the running event loop."""
        loop = asyncio.get_running_loop()
        found = _registries.get(loop)
        if found is None:
            found = _registries[loop] = AsyncRegistry()
        return found

else:
    _registry = AsyncRegistry()

    def registry() -> AsyncRegistry:
        """The registry of this process."""
        return _registry

    def reset_registry() -> None:
        """Forget every source without closing it (a forked child must not share them)."""
        global _registry
        _registry = AsyncRegistry()


# Links: one lease's way to its database -----------------------------------------


class AsyncLink:
    """How one lease claims, releases, renews and listens.

    Claim and release run on the caller's connection when it is idle (committed at
    once), otherwise on the source: never inside a transaction the caller left open.
    """

    def __init__(
        self,
        source: AsyncSource,
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
        sqlite_conn: sqlite3.Connection | None = None,
        listen_conninfo: str | None = None,
    ) -> None:
        self.source = registry().acquire(source)
        self.conn = conn
        self.sqlite_conn = sqlite_conn
        self.listen_conninfo = listen_conninfo
        self.sqlite = isinstance(source, AsyncSqliteSource)

    async def run(self, op: AsyncOp[T], *, name: str | None = None, retry: bool = False) -> T:
        conn = self.conn
        if conn is not None and (is_idle(conn) or conn.closed):
            # A closed connection fails loudly here rather than silently elsewhere.
            return await run_committed(conn, op)
        if True:  # ASYNC
            pass  # no sqlite_conn on an event loop: see the module's docstring
        else:
            if self.sqlite_conn is not None and not self.sqlite_conn.in_transaction:
                backend: AsyncBackend = sqlite_module().AsyncSqliteBackend(self.sqlite_conn)
                return await op(backend)
        return await self.source.run(op, name=name, retry=retry)

    async def run_release(self, op: AsyncOp[T], *, name: str) -> T:
        conn = self.conn
        if conn is not None and is_idle(conn):
            return await run_committed(conn, op)
        if True:  # ASYNC
            pass
        else:
            if self.sqlite_conn is not None and not self.sqlite_conn.in_transaction:
                backend: AsyncBackend = sqlite_module().AsyncSqliteBackend(self.sqlite_conn)
                return await op(backend)
        return await self.source.run(op, name=name)

    async def close(self) -> None:
        await registry().release(self.source)


def source_for(target: object, parameter: str = "target") -> tuple[AsyncSource, str | None]:
    """The renewal source of a target, and the conninfo to LISTEN with (None: cannot)."""
    target = adapt(target, parameter)  # ORM targets: SQLAlchemy, Django (pylease._orm)
    pool_cls = async_pool_class()
    if isinstance(target, str):
        if dsn_mod.is_sqlite(target):
            if target.partition("?")[0] == "sqlite:///:memory:":
                raise in_memory(parameter)
            return AsyncSqliteSource(target), None
        if is_postgres_url(target):
            check_url(target, parameter)
            return AsyncConninfoSource(target), target
    elif isinstance(target, psycopg.AsyncConnection):
        return AsyncConnectionSource(target), connection_conninfo(target)
    elif pool_cls is not None and isinstance(target, pool_cls):
        return AsyncPoolSource(target), pool_conninfo(target)
    elif isinstance(target, sqlite3.Connection):
        location = sqlite_location(target)
        if location is None:
            raise in_memory(parameter)
        return AsyncSqliteSource(location), None
    raise bad_target(target, parameter, "alease")


def in_memory(parameter: str) -> InvalidArgument:
    """The error for an in-memory SQLite database (issue 21, item 8)."""
    return InvalidArgument(
        f"pylease: {parameter} is an in-memory SQLite database: nothing outside its one"
        " connection sees its leases, and pylease's claims and renewals there would run"
        " inside the caller's transactions (a rollback would undo a grant); use a file"
        " (sqlite:///path)",
        parameter=parameter,
    )


def check(target: object, heartbeat_target: object = None) -> None:
    """Raise InvalidArgument now for a target :func:`link` would refuse (no I/O)."""
    target = adapt(target)  # ORM targets: SQLAlchemy, Django (pylease._orm)
    if isinstance(target, psycopg.AsyncConnection):
        if heartbeat_target is target:
            raise InvalidArgument(
                "pylease: heartbeat_target must not be the lease's own connection: a renewal"
                " there would run inside, and commit, the caller's transactions",
                parameter="heartbeat_target",
            )
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
    """The :class:`AsyncLink` for a target.

    For a bare connection renewals run on a second connection opened with the
    same parameters (password included, see :func:`connection_conninfo`), unless
    ``heartbeat_target`` names a URL, a pool or a connection dedicated to pylease.
    """
    target = adapt(target)  # ORM targets: SQLAlchemy, Django (pylease._orm)
    check(target, heartbeat_target)
    if isinstance(target, sqlite3.Connection) and target.in_transaction:
        # Refused, not joined: a grant made in it would vanish with its rollback, and
        # one made outside it would wait for the write lock it may hold (issue 21, item 8).
        raise InvalidArgument(
            "pylease: target is a sqlite3.Connection inside a transaction: commit or roll"
            " back before taking a lease (pylease never claims inside the caller's"
            " transaction)",
            parameter="target",
        )
    if isinstance(target, psycopg.AsyncConnection):
        if heartbeat_target is None:
            conninfo = conninfo_of(target)
            return AsyncLink(AsyncConninfoSource(conninfo), conn=target, listen_conninfo=conninfo)
        source, listen = source_for(heartbeat_target, "heartbeat_target")
        return AsyncLink(source, conn=target, listen_conninfo=listen)
    source, listen = source_for(target)
    if True:  # ASYNC
        pass
    else:
        if isinstance(target, sqlite3.Connection):
            # Claim and release on the caller's connection when it is idle; renew on
            # one of pylease's own to the same file, outside the caller's transactions.
            return AsyncLink(source, sqlite_conn=target)
    return AsyncLink(source, listen_conninfo=listen)
