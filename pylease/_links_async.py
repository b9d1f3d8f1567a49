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
import functools
import logging
import sqlite3
import weakref
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Protocol, TypeVar

import psycopg

from pylease import _budget
from pylease import dsn as dsn_mod
from pylease._acompat import ALock, AMutex, alock_within, aspawn, ato_thread, monotonic
from pylease._backend_async import AsyncBackend
from pylease._budget import FLOOR
from pylease._orm import adapt
from pylease._targets import async_pool_class
from pylease._targets import bad_target as bad_target
from pylease._targets import is_idle as is_idle
from pylease._targets import sqlite_location as sqlite_location
from pylease._targets import sqlite_module as sqlite_module
from pylease.errors import DatabaseUnavailable, InvalidArgument
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


# A failure within this long came from a connection that was already broken (it broke
# while idle: a restart, a terminated backend, an idle_session_timeout), not from a
# database that stopped answering: worth another attempt on a fresh connection.
AT_ONCE = 1.0
# What the release's second attempt needs of a block's exit: a connect and a statement.
AGAIN = _budget.CONNECT_FLOOR + FLOOR


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
        self._schema: str | None = None
        self._renewals: AsyncSource | None = None

    async def schema(self, name: str | None) -> str | None:
        """The schema every statement of this link names (None: SQLite), found once."""
        if self._schema is None and not self.sqlite:
            if self.conn is not None:
                self._schema = await connection_schema(self.conn, name)
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
        op = in_schema(op, self._schema or await self.schema(name))
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
        return await self.source.run(op, name=name, retry=retry, urgent=urgent)

    async def run_release(self, op: AsyncOp[T], *, name: str, again: AsyncOp[T] | None = None) -> T:
        """Run a release, bounded; ``again`` once more on a fresh connection of the
        source when the first attempt failed at once (its connection had broken while
        idle). The release names its tenure, so running it twice frees nothing else;
        ``again`` answers for a first attempt that may have done it already."""
        schema = self._schema or await self.schema(name)
        started = monotonic()
        try:
            return await self._release(in_schema(op, schema), name)
        except DatabaseUnavailable:
            # Within a block's exit, only while a connect and a statement still fit.
            if again is None or monotonic() - started > AT_ONCE or not _budget.spare(AGAIN):
                raise
        return await self.source.run(in_schema(again, schema), name=name, retry=True, urgent=True)

    async def _release(self, op: AsyncOp[T], name: str) -> T:
        conn = self.conn
        if conn is not None and is_idle(conn):
            return await run_committed(conn, op)
        if True:  # ASYNC
            pass
        else:
            if self.sqlite_conn is not None and not self.sqlite_conn.in_transaction:
                backend: AsyncBackend = sqlite_module().AsyncSqliteBackend(self.sqlite_conn)
                return await op(backend)
        return await self.source.run(op, name=name, urgent=True)

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
