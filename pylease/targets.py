"""How a lease reaches its database, for the synchronous API.

A *target* is what the user hands to :func:`pylease.lease`: a psycopg ``Connection``,
a psycopg_pool ``ConnectionPool``, a URL (``postgresql://...`` or ``sqlite:///path``)
or a ``sqlite3.Connection``. :func:`link` turns it into a :class:`Link`, which knows

- how to run one operation as a transaction of its own (claim, release), never
  inside the caller's open transaction;
- a :class:`Source`: the connection renewals run on, shared by every lease of the
  process that reaches the same database (see :mod:`pylease.heartbeat`);
- how to LISTEN for released leases while waiting (PostgreSQL only).

Connections pylease opens are autocommit, never prepare statements (PgBouncer's
transaction mode) and are named by ``application_name`` (``pylease-heartbeat``,
``pylease-listen``) so an operator can find them in ``pg_stat_activity``.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sqlite3
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg.pq import TransactionStatus

from pylease import dsn as dsn_mod
from pylease._backend import Backend
from pylease._orm import adapt
from pylease.errors import ConfigurationError, DatabaseUnavailable, InvalidArgument
from pylease.postgres import PostgresBackend, wrap_errors

T = TypeVar("T")

logger = logging.getLogger("pylease")

HEARTBEAT_APP = "pylease-heartbeat"
LISTEN_APP = "pylease-listen"
CHANNEL = "pylease"
CONNECT_TIMEOUT = "10"
TCP_LIVENESS = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}

# Keyword arguments of psycopg's connect() that are not libpq parameters.
_NOT_CONNINFO = {"autocommit", "prepare_threshold", "context", "row_factory", "cursor_factory"}


def own_conninfo(conninfo: str, application_name: str) -> str:
    """The conninfo for a connection pylease opens for itself."""
    params = dsn_mod.parse(conninfo)
    params["application_name"] = application_name
    params.setdefault("connect_timeout", CONNECT_TIMEOUT)
    # A peer that vanished (a network partition) fails a statement in seconds, not
    # after the kernel's retransmission timeout of a quarter of an hour.
    for key, value in TCP_LIVENESS.items():
        params.setdefault(key, value)
    return pg_conninfo.make_conninfo("", **params)


def connection_conninfo(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> str:
    """Parameters to open another connection like ``conn``, password included.

    ``conn.info.dsn`` leaves the password out; libpq still knows the one it used
    (given, from ``PGPASSWORD`` or from a password file) and psycopg exposes it as
    ``conn.info.password``.
    """
    params: dict[str, Any] = dict(conn.info.get_parameters())
    password = conn.info.password
    if password:
        params["password"] = password
    return pg_conninfo.make_conninfo("", **params)


_conninfos: weakref.WeakKeyDictionary[psycopg.Connection[Any], str] = weakref.WeakKeyDictionary()


def _conninfo_of(conn: psycopg.Connection[Any]) -> str:
    """:func:`connection_conninfo`, remembered per connection: a lease per loop
    iteration on one connection must not parse its parameters every time."""
    try:
        return _conninfos[conn]
    except KeyError:
        conninfo = _conninfos[conn] = connection_conninfo(conn)
        return conninfo


def pool_conninfo(pool: Any) -> str:
    """Parameters to open a connection like the ones ``pool`` makes."""
    kwargs = {k: v for k, v in (pool.kwargs or {}).items() if k not in _NOT_CONNINFO}
    return pg_conninfo.make_conninfo(pool.conninfo, **kwargs)


def connect_own(conninfo: str, name: str | None) -> psycopg.Connection[Any]:
    """Open a connection of pylease's own: autocommit, no prepared statements."""
    with wrap_errors(name):
        return psycopg.connect(conninfo, autocommit=True, prepare_threshold=None)


def run_committed(conn: psycopg.Connection[Any], op: Callable[[Backend], T]) -> T:
    """Run ``op`` on an idle connection as a transaction of its own."""
    if conn.autocommit:
        return op(PostgresBackend(conn))
    try:
        result = op(PostgresBackend(conn))
    except BaseException:
        if not conn.closed:
            with wrap_errors():
                conn.rollback()
        raise
    with wrap_errors():
        conn.commit()
    return result


def is_idle(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """True when a statement run on ``conn`` now would not join a transaction of the caller."""
    return bool(not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE)


# Sources: the connections renewals (and URL and pool leases) run on ------------


class Source(Protocol):
    """Where renewals run: one per database per process, shared by its leases."""

    key: Hashable

    @property
    def label(self) -> str:
        """How logs name it (never with a password)."""
        ...

    def run(self, op: Callable[[Backend], T], *, name: str | None = None, retry: bool = False) -> T:
        """Run ``op`` as a transaction of its own; ``retry`` once on a stale connection."""
        ...

    def close(self) -> None: ...


class ConninfoSource:
    """One connection of pylease's own, opened on first use and again after it breaks.

    Built for every lease but kept only by the first of its key (see the registry),
    so everything derived from the conninfo is computed when first needed.
    """

    def __init__(self, conninfo: str) -> None:
        self.key: Hashable = ("postgres", conninfo)
        self._given = conninfo
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None

    @functools.cached_property
    def label(self) -> str:
        return dsn_mod.redact(self._given)

    @functools.cached_property
    def _conninfo(self) -> str:
        return own_conninfo(self._given, HEARTBEAT_APP)

    def run(self, op: Callable[[Backend], T], *, name: str | None = None, retry: bool = False) -> T:
        with self._lock:
            fresh = self._conn is None or self._conn.closed or self._conn.broken
            if fresh:
                self._discard()
                self._conn = connect_own(self._conninfo, name)
            assert self._conn is not None
            try:
                return op(PostgresBackend(self._conn))
            except DatabaseUnavailable:
                self._discard()
                if fresh or not retry:
                    raise
            # The connection broke while it sat idle (server restart, terminated
            # backend): one fresh attempt before reporting it.
            self._conn = connect_own(self._conninfo, name)
            return op(PostgresBackend(self._conn))

    def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._discard()


class PoolSource:
    """A psycopg_pool ``ConnectionPool``: each operation borrows a connection."""

    def __init__(self, pool: Any) -> None:
        self.key: Hashable = ("pool", id(pool))
        self.label = f"pool {pool.name!r}"
        self.pool = pool

    def run(self, op: Callable[[Backend], T], *, name: str | None = None, retry: bool = False) -> T:
        try:
            return self._run(op, name)
        except DatabaseUnavailable:
            if not retry:
                raise
        # The pool replaces a connection found broken; try once more on another.
        return self._run(op, name)

    def _run(self, op: Callable[[Backend], T], name: str | None) -> T:
        with wrap_errors(name), self.pool.connection() as conn:
            return run_committed(conn, op)

    def close(self) -> None:
        pass


class ConnectionSource:
    """A connection the user dedicated to pylease (``heartbeat_target=conn``)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.key: Hashable = ("connection", id(conn))
        self.label = "a dedicated connection"
        self.conn = conn
        self._lock = threading.Lock()

    def run(self, op: Callable[[Backend], T], *, name: str | None = None, retry: bool = False) -> T:
        with self._lock:
            return run_committed(self.conn, op)

    def close(self) -> None:
        pass


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


class SqliteSource:
    """A SQLite database file, on a connection of pylease's own, usable from any thread.

    An in-memory database has no second connection: its only one is shared.
    """

    def __init__(self, location: str | None = None, conn: sqlite3.Connection | None = None) -> None:
        self.key: Hashable = ("sqlite", location) if location is not None else ("sqlite", id(conn))
        self.label = location or "an in-memory SQLite database"
        self._conn = conn
        self._location = location
        self._lock = threading.Lock()

    def connection(self) -> sqlite3.Connection:
        with self._lock:
            if self._conn is None:
                conn: sqlite3.Connection = sqlite_module().connect(self._location)
                self._conn = conn
            return self._conn

    def run(self, op: Callable[[Backend], T], *, name: str | None = None, retry: bool = False) -> T:
        backend: Backend = sqlite_module().SqliteBackend(self.connection())
        return op(backend)

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None and self._location is not None:
                conn.close()


class _Registry:
    """The sources in use in this process, shared by key and closed with their last lease."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sources: dict[Hashable, tuple[Source, int]] = {}

    def acquire(self, source: Source) -> Source:
        with self._lock:
            found, count = self._sources.get(source.key, (source, 0))
            self._sources[source.key] = (found, count + 1)
            return found

    def release(self, source: Source) -> None:
        with self._lock:
            found, count = self._sources[source.key]
            if count > 1:
                self._sources[source.key] = (found, count - 1)
                return
            del self._sources[source.key]
        found.close()

    def reset(self) -> None:
        """Forget every source without closing it (a forked child must not share them)."""
        self._sources = {}
        self._lock = threading.Lock()


registry = _Registry()


# Listening -------------------------------------------------------------------


class Listener:
    """A connection LISTENing on ``pylease``, to wake a waiter when a lease is released."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn: psycopg.Connection[Any] | None = conn

    @classmethod
    def open(cls, conninfo: str, name: str) -> Listener | None:
        """Start listening; None (and the waiter polls) when LISTEN cannot be used."""
        try:
            conn = psycopg.connect(
                own_conninfo(conninfo, LISTEN_APP), autocommit=True, prepare_threshold=None
            )
            conn.execute("LISTEN " + CHANNEL)
        except psycopg.Error as exc:
            logger.info("pylease: cannot LISTEN for lease %r, polling instead: %s", name, exc)
            return None
        return cls(conn)

    def wait(self, name: str, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True if a release of ``name`` was announced."""
        conn = self.conn
        if conn is None:
            return False
        try:
            for notify in conn.notifies(timeout=max(timeout, 0.0)):
                if notify.payload == name:
                    return True
        except psycopg.Error as exc:
            logger.info("pylease: LISTEN connection lost while waiting for %r: %s", name, exc)
            self.close()
            raise ListenerLost from exc
        return False

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()


class ListenerLost(Exception):
    """The LISTEN connection broke: the waiter polls from now on."""


# Links: one lease's way to its database -----------------------------------------


class Link:
    """How one lease claims, releases, renews and listens.

    Claim and release run on the caller's connection when it is idle (committed at
    once), otherwise on the source: never inside a transaction the caller left open.
    """

    def __init__(
        self,
        source: Source,
        *,
        conn: psycopg.Connection[Any] | None = None,
        sqlite_conn: sqlite3.Connection | None = None,
        listen_conninfo: str | None = None,
    ) -> None:
        self.source = registry.acquire(source)
        self.conn = conn
        self.sqlite_conn = sqlite_conn
        self.listen_conninfo = listen_conninfo
        self.sqlite = isinstance(source, SqliteSource)

    def run(self, op: Callable[[Backend], T], *, name: str | None = None, retry: bool = False) -> T:
        conn = self.conn
        if conn is not None and (is_idle(conn) or conn.closed):
            # A closed connection fails loudly here rather than silently elsewhere.
            return run_committed(conn, op)
        if self.sqlite_conn is not None and not self.sqlite_conn.in_transaction:
            backend: Backend = sqlite_module().SqliteBackend(self.sqlite_conn)
            return op(backend)
        return self.source.run(op, name=name, retry=retry)

    def run_release(self, op: Callable[[Backend], T], *, name: str) -> T:
        conn = self.conn
        if conn is not None and is_idle(conn):
            return run_committed(conn, op)
        if self.sqlite_conn is not None and not self.sqlite_conn.in_transaction:
            backend: Backend = sqlite_module().SqliteBackend(self.sqlite_conn)
            return op(backend)
        return self.source.run(op, name=name)

    def listen(self, name: str) -> Listener | None:
        if self.listen_conninfo is None:
            return None
        return Listener.open(self.listen_conninfo, name)

    def close(self) -> None:
        registry.release(self.source)


def _pool_class() -> type[Any] | None:
    try:
        from psycopg_pool import ConnectionPool
    except ImportError:  # pragma: no cover - psycopg_pool is an optional extra
        return None
    return ConnectionPool


def _async_pool_class() -> type[Any] | None:
    try:
        from psycopg_pool import AsyncConnectionPool
    except ImportError:  # pragma: no cover
        return None
    return AsyncConnectionPool


def is_postgres_url(target: str) -> bool:
    return target.startswith(("postgresql:", "postgres:")) or "=" in target


def check_url(url: str, parameter: str) -> None:
    """A malformed connection string is an invalid argument, reported without its text."""
    try:
        dsn_mod.parse(url)
    except ConfigurationError:
        raise InvalidArgument(
            f"pylease: {parameter} is a malformed connection string", parameter=parameter
        ) from None


def source_for(target: object, parameter: str = "target") -> tuple[Source, str | None]:
    """The renewal source of a target, and the conninfo to LISTEN with (None: cannot)."""
    target = adapt(target, parameter)  # ORM targets: SQLAlchemy, Django (pylease._orm)
    pool_cls = _pool_class()
    if isinstance(target, str):
        if dsn_mod.is_sqlite(target):
            return SqliteSource(target), None
        if is_postgres_url(target):
            check_url(target, parameter)
            return ConninfoSource(target), target
    elif isinstance(target, psycopg.Connection):
        return ConnectionSource(target), connection_conninfo(target)
    elif pool_cls is not None and isinstance(target, pool_cls):
        return PoolSource(target), pool_conninfo(target)
    elif isinstance(target, sqlite3.Connection):
        location = sqlite_location(target)
        return SqliteSource(location, None if location else target), None
    raise bad_target(target, parameter, "lease")


def bad_target(target: object, parameter: str, api: str) -> InvalidArgument:
    """The error for a target this API cannot use; a string is never echoed (passwords)."""
    pool_cls = _async_pool_class()
    async_ = isinstance(target, psycopg.AsyncConnection) or (
        pool_cls is not None and isinstance(target, pool_cls)
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


def _sync_pool_types() -> tuple[type[Any], ...]:
    pool_cls = _pool_class()
    return () if pool_cls is None else (pool_cls,)


def check(target: object, heartbeat_target: object = None) -> None:
    """Raise InvalidArgument now for a target :func:`link` would refuse (no I/O)."""
    target = adapt(target)  # ORM targets: SQLAlchemy, Django (pylease._orm)
    if isinstance(target, psycopg.Connection):
        if heartbeat_target is not None:
            source, _listen = source_for(heartbeat_target, "heartbeat_target")
            if isinstance(source, SqliteSource):
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


def link(target: object, *, heartbeat_target: object = None) -> Link:
    """The :class:`Link` for a target of the synchronous API.

    For a bare ``Connection`` renewals run on a second connection opened with the
    same parameters (password included, see :func:`connection_conninfo`), unless
    ``heartbeat_target`` names a URL, a pool or a connection dedicated to pylease.
    """
    target = adapt(target)  # ORM targets: SQLAlchemy, Django (pylease._orm)
    check(target, heartbeat_target)
    if isinstance(target, psycopg.Connection):
        if heartbeat_target is None:
            conninfo = _conninfo_of(target)
            return Link(ConninfoSource(conninfo), conn=target, listen_conninfo=conninfo)
        source, listen = source_for(heartbeat_target, "heartbeat_target")
        return Link(source, conn=target, listen_conninfo=listen)
    source, listen = source_for(target)
    if isinstance(target, sqlite3.Connection):
        # Claim and release on the caller's connection when it is idle; renew on
        # one of pylease's own to the same file, outside the caller's transactions.
        return Link(source, sqlite_conn=target)
    return Link(source, listen_conninfo=listen)
