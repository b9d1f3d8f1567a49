"""Connection parameters: those of the connections pylease opens for itself, and how
they are derived from a URL, a connection or a pool the user gave.

Connections pylease opens are autocommit, never prepare statements (PgBouncer's
transaction mode) and are named by ``application_name`` (``pylease-heartbeat``,
``pylease-listen``) so an operator can find them in ``pg_stat_activity``.
"""

from __future__ import annotations

import weakref
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg.pq import ConnStatus, TransactionStatus

from pylease import dsn as dsn_mod
from pylease.errors import ConfigurationError, InvalidArgument

HEARTBEAT_APP = "pylease-heartbeat"
LISTEN_APP = "pylease-listen"
CHANNEL = "pylease"
# With the statement bound (pylease.postgres._abandon.STATEMENT_BOUND), what keeps a
# release after a hung renewal within the 10 s a block may take to end.
CONNECT_TIMEOUT = "3"
TCP_LIVENESS = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}

# Keyword arguments of psycopg's connect() that are not libpq parameters.
_NOT_CONNINFO = {"autocommit", "prepare_threshold", "context", "row_factory", "cursor_factory"}

AnyConnection = psycopg.Connection[Any] | psycopg.AsyncConnection[Any]

_OK = int(ConnStatus.OK)
_IDLE = int(TransactionStatus.IDLE)


def is_idle(conn: AnyConnection) -> bool:
    """True when a statement run on ``conn`` now would not join a transaction of the caller."""
    # The libpq ints, not conn.info's enums: this runs several times per lease.
    pgconn = conn.pgconn
    return pgconn.status == _OK and pgconn.transaction_status == _IDLE


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


def connection_conninfo(conn: AnyConnection) -> str:
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


_conninfos: weakref.WeakKeyDictionary[AnyConnection, str] = weakref.WeakKeyDictionary()


def conninfo_of(conn: AnyConnection) -> str:
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
