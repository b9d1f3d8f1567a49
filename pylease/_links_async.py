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
- how to LISTEN for released leases while waiting (PostgreSQL only);
- the schema its statements name on every connection: where ``lease_claim`` resolves
  by the ``search_path`` of the caller's connection (looked up the first time pylease
  uses that connection) or, for a URL or a pool, of the source's. Two installs on
  one ``search_path`` then never split a lease between them.

Where the two twins differ (the ``if True:  # ASYNC`` blocks): on an event loop,
sources are shared per loop, not per process, since a psycopg connection of asyncio
belongs to one loop; and a ``sqlite3.Connection`` may refuse worker threads, so on
an event loop everything runs on a SQLite connection of pylease's own, in worker
threads, where the sync API claims and releases on the caller's connection when it
is idle.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import weakref
from collections.abc import Awaitable, Callable, Hashable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pylease import _budget
from pylease import dsn as dsn_mod
from pylease._acompat import ALock, AMutex, alock_within, ato_thread, monotonic
from pylease._backend_async import AsyncBackend
from pylease._budget import FLOOR
from pylease._orm import adapt
from pylease._targets import bad_target as bad_target
from pylease._targets import is_async_connection, is_async_pool
from pylease._targets import sqlite_location as sqlite_location
from pylease._targets import sqlite_module as sqlite_module
from pylease.errors import DatabaseUnavailable, InvalidArgument

if TYPE_CHECKING:
    import psycopg

T = TypeVar("T")
AsyncOp = Callable[[AsyncBackend], Awaitable[T]]

logger = logging.getLogger("pylease")


# A failure within this long came from a connection that was already broken (it broke
# while idle: a restart, a terminated backend, an idle_session_timeout), not from a
# database that stopped answering: worth another attempt on a fresh connection.
AT_ONCE = 1.0
# What the release's second attempt needs of a block's exit: a connect and a statement.
AGAIN = _budget.CONNECT_FLOOR + FLOOR


# libpq's CONNECTION_OK and PQTRANS_IDLE: a caller's connection is read as
# pylease.postgres._conninfo.is_idle reads it, without loading the driver here.
_OK = 0
_IDLE = 0
_pg: Any = None


def _postgres() -> Any:
    """:mod:`pylease.postgres._backend_async`, imported at the first statement on a
    caller's connection (a lease on SQLite never loads the driver)."""
    global _pg
    if _pg is None:
        from pylease.postgres import _backend_async

        _pg = _backend_async
    return _pg


_pg_sources: Any = None


def _postgres_sources() -> Any:
    """:mod:`pylease.postgres._sources_async`, imported as :func:`_postgres`."""
    global _pg_sources
    if _pg_sources is None:
        from pylease.postgres import _sources_async

        _pg_sources = _sources_async
    return _pg_sources


def in_schema(op: AsyncOp[T], schema: str | None) -> AsyncOp[T]:
    """``op`` with every statement naming ``schema`` (None: as it is)."""
    if schema is None:
        return op

    async def named(b: AsyncBackend) -> T:
        return await op(b.in_schema(schema))

    return named


async def find_schema(b: AsyncBackend) -> str | None:
    """Where the ``search_path`` of a source's connection finds pylease."""
    return await b.installed_schema()


async def take(lock: ALock, name: str | None) -> None:
    """Take a source's lock: inside a block's exit, within its budget (a renewal that
    hangs may hold the connection)."""
    if _budget.exit_deadline.get() is None:
        await lock.acquire()
    elif not await alock_within(lock, _budget.left() or 0.0):
        raise _budget.spent(name, "while a renewal held its connection")


# Sources: the connections renewals (and URL and pool leases) run on ------------


class AsyncSource(Protocol):
    """Where renewals run: one per database, shared by its leases."""

    key: Hashable

    @property
    def label(self) -> str:
        """How logs name it (never with a password)."""
        ...

    async def run(
        self, op: AsyncOp[T], *, name: str | None = None, retry: bool = False, urgent: bool = False
    ) -> T:
        """Run ``op`` as a transaction of its own; ``retry`` once on a stale connection;
        ``urgent`` (a renewal, a block's way out): a pool's connection is waited for at
        most :data:`STATEMENT_BOUND`."""
        ...

    async def schema(self, name: str | None) -> str | None:
        """The schema its statements name (None: SQLite), found once."""
        ...

    async def close(self) -> None: ...


class AsyncSchemaSource:
    """A source whose statements name one schema: how the keeper renews a link's leases
    (leases of one source in two schemas are two groups)."""

    def __init__(self, source: AsyncSource, schema: str | None) -> None:
        self.source = source
        self.key: Hashable = (source.key, schema)
        self._schema = schema

    @property
    def label(self) -> str:
        return self.source.label

    async def run(
        self, op: AsyncOp[T], *, name: str | None = None, retry: bool = False, urgent: bool = False
    ) -> T:
        op = in_schema(op, self._schema)
        return await self.source.run(op, name=name, retry=retry, urgent=urgent)

    async def schema(self, name: str | None) -> str | None:
        return self._schema

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

    async def run(
        self, op: AsyncOp[T], *, name: str | None = None, retry: bool = False, urgent: bool = False
    ) -> T:
        backend: AsyncBackend = sqlite_module().AsyncSqliteBackend(await self.connection())
        return await op(backend)

    async def schema(self, name: str | None) -> str | None:
        return None

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

    def acquire_key(self, key: Hashable, make: Callable[[], AsyncSource]) -> AsyncSource:
        """The source of ``key`` in use, or ``make()``'s: a lease per loop iteration
        builds no source of its own while one of its database is in use."""
        with self._mutex:
            found = self._sources.get(key)
            if found is None:
                source = make()
                self._sources[key] = (source, 1)
                return source
            self._sources[key] = (found[0], found[1] + 1)
            return found[0]

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

    # The last loop asked about and its registry: every block asks twice.
    _last: tuple[weakref.ref[asyncio.AbstractEventLoop], AsyncRegistry] | None = None

    def registry() -> AsyncRegistry:
        """The registry of the running event loop."""
        global _last
        loop = asyncio.get_running_loop()
        last = _last
        if last is not None and last[0]() is loop:
            return last[1]
        found = _registries.get(loop)
        if found is None:
            found = _registries[loop] = AsyncRegistry()
        _last = (weakref.ref(loop), found)
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
        acquired: bool = False,
    ) -> None:
        # ``acquired``: the registry already counts this lease as a user of ``source``.
        self.source = source if acquired else registry().acquire(source)
        self.conn = conn
        self.sqlite_conn = sqlite_conn
        self.listen_conninfo = listen_conninfo
        self.sqlite = isinstance(source, AsyncSqliteSource)
        self._schema: str | None = None
        self._renewals: AsyncSource | None = None
        # The backend of the caller's connection, once its schema is known: the link's
        # statements there run one after another, on one cursor.
        self._backend: Any = None

    async def schema(self, name: str | None) -> str | None:
        """The schema every statement of this link names (None: SQLite), found once."""
        if self._schema is None and not self.sqlite:
            if self.conn is not None:
                pg = _postgres()
                self._schema = schema = await pg.connection_schema(self.conn, name)
                self._backend = pg.AsyncPostgresBackend(self.conn, schema)
            else:
                self._schema = await self.source.schema(name)
        return self._schema

    @property
    def renewals(self) -> AsyncSource:
        """The source the keeper renews this link's leases through, in its schema."""
        if self.sqlite:
            return self.source
        if self._renewals is None:
            assert self._schema is not None, "a lease is kept only once claimed"
            self._renewals = AsyncSchemaSource(self.source, self._schema)
        return self._renewals

    async def run(
        self, op: AsyncOp[T], *, name: str | None = None, retry: bool = False, urgent: bool = False
    ) -> T:
        schema = self._schema or await self.schema(name)
        conn = self.conn
        if conn is not None:
            pgconn = conn.pgconn
            if (pgconn.status == _OK and pgconn.transaction_status == _IDLE) or conn.closed:
                # A closed connection fails loudly here rather than silently elsewhere.
                result: T = await _postgres().run_committed(
                    conn, op, schema, idle=True, backend=self._backend
                )
                return result
        if True:  # ASYNC
            pass  # no sqlite_conn on an event loop: see the module's docstring
        else:
            if self.sqlite_conn is not None and not self.sqlite_conn.in_transaction:
                backend: AsyncBackend = sqlite_module().AsyncSqliteBackend(self.sqlite_conn)
                return await op(backend)
        op = in_schema(op, schema)
        return await self.source.run(op, name=name, retry=retry, urgent=urgent)

    async def run_release(self, op: AsyncOp[T], *, name: str, again: AsyncOp[T] | None = None) -> T:
        """Run a release, bounded; ``again`` once more on a fresh connection of the
        source when the first attempt failed at once (its connection had broken while
        idle). The release names its tenure, so running it twice frees nothing else;
        ``again`` answers for a first attempt that may have done it already."""
        schema = self._schema or await self.schema(name)
        started = monotonic()
        try:
            return await self._release(op, schema, name)
        except DatabaseUnavailable:
            # Within a block's exit, only while a connect and a statement still fit.
            if again is None or monotonic() - started > AT_ONCE or not _budget.spare(AGAIN):
                raise
        return await self.source.run(in_schema(again, schema), name=name, retry=True, urgent=True)

    async def _release(self, op: AsyncOp[T], schema: str | None, name: str) -> T:
        conn = self.conn
        if conn is not None:
            pgconn = conn.pgconn
            if pgconn.status == _OK and pgconn.transaction_status == _IDLE:
                result: T = await _postgres().run_committed(
                    conn, op, schema, idle=True, backend=self._backend
                )
                return result
        if True:  # ASYNC
            pass
        else:
            if self.sqlite_conn is not None and not self.sqlite_conn.in_transaction:
                backend: AsyncBackend = sqlite_module().AsyncSqliteBackend(self.sqlite_conn)
                return await op(backend)
        return await self.source.run(in_schema(op, schema), name=name, urgent=True)

    async def close(self) -> None:
        await registry().release(self.source)


def source_for(target: object, parameter: str = "target") -> tuple[AsyncSource, str | None]:
    """The renewal source of a target, and the conninfo to LISTEN with (None: cannot)."""
    target = adapt(target, parameter)  # ORM targets: SQLAlchemy, Django (pylease._orm)
    if isinstance(target, str) and dsn_mod.is_sqlite(target):
        if target.partition("?")[0] == "sqlite:///:memory:":
            raise in_memory(parameter)
        return AsyncSqliteSource(target), None
    if isinstance(target, sqlite3.Connection):
        location = sqlite_location(target)
        if location is None:
            raise in_memory(parameter)
        return AsyncSqliteSource(location), None
    if isinstance(target, str) or is_async_connection(target) or is_async_pool(target):
        # Only now the driver: a lease on SQLite never loads it.
        from pylease.postgres import _sources_async

        found = _sources_async.source_for(target, parameter)
        if found is not None:
            return found
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
    if heartbeat_target is None and is_async_connection(target):
        return  # the common case: a connection renews on one of pylease's own
    target = adapt(target)  # ORM targets: SQLAlchemy, Django (pylease._orm)
    if is_async_connection(target):
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


def _own_link(conn: Any) -> AsyncLink:
    """A caller's connection, renewed on a connection of pylease's own to its database
    (that database's source, found by key)."""
    renewals, conninfo = _postgres_sources().own_source(conn)
    return AsyncLink(renewals, conn=conn, listen_conninfo=conninfo, acquired=True)


def link(target: object, *, heartbeat_target: object = None) -> AsyncLink:
    """The :class:`AsyncLink` for a target.

    For a bare connection renewals run on a second connection opened with the
    same parameters (password included), unless
    ``heartbeat_target`` names a URL, a pool or a connection dedicated to pylease.
    """
    if heartbeat_target is None and is_async_connection(target):
        # The common case first (a lease per loop iteration on one connection): nothing
        # to check or adapt.
        return _own_link(target)
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
    if is_async_connection(target):
        if heartbeat_target is None:  # an ORM's connection
            return _own_link(target)
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
