"""Targets from the ORMs: what a SQLAlchemy engine or connection, or a Django connection, is
to the lease machinery.

:func:`adapt` turns such a target into one :mod:`pylease._links` already knows, so the
rules of that target hold unchanged:

- a SQLAlchemy ``Engine`` or ``AsyncEngine`` (over psycopg 3) becomes the conninfo of
  its URL: like a URL target, every claim, renewal and release runs on connections of
  pylease's own; so does an ORM ``Session`` or ``AsyncSession``, through its engine;
- a SQLAlchemy ``Connection`` or ``AsyncConnection`` becomes the psycopg connection it
  wraps, and Django's ``connection`` (or ``connections["alias"]``) the psycopg 3
  connection it wraps: like a psycopg connection, it is used for the claim only while it
  is idle (a claim made inside ``engine.begin()`` or ``transaction.atomic()`` after a
  statement runs on a connection of pylease's own, so it survives the rollback), and
  renewals always run on a second connection;
- in a running event loop (an async view), where Django's connections may not be
  touched, a Django connection becomes the conninfo of its settings: like a URL;
- a ``postgresql+psycopg://`` URL (SQLAlchemy's spelling) becomes ``postgresql://``.

Neither SQLAlchemy nor Django is imported here: a target is recognised by the module
its class comes from, so the core never requires either.
"""

from __future__ import annotations

from typing import Any

from pylease._targets import in_event_loop, is_psycopg
from pylease.errors import InvalidArgument

# SQLAlchemy drivers that speak libpq's parameters: their URLs are libpq URLs.
LIBPQ_DRIVERS = ("psycopg", "psycopg_async", "psycopg2", "psycopg2cffi")
# Keyword arguments SQLAlchemy's psycopg dialect passes to connect() that are not libpq's.
_NOT_CONNINFO = {"autocommit", "prepare_threshold", "context", "row_factory", "cursor_factory"}


def adapt(target: object, parameter: str = "target") -> object:
    """The target :mod:`pylease._links` accepts for an ORM ``target``; others unchanged.

    :raises InvalidArgument: an ORM target pylease cannot use (another database, a
        driver other than psycopg 3, a closed connection).
    """
    if isinstance(target, str):
        if target.startswith(("postgresql+", "postgres+")):
            return _sqlalchemy_url(target, parameter)
        return target
    if is_psycopg(target):
        return target
    for cls in type(target).__mro__:
        module = cls.__module__
        if module.startswith("sqlalchemy."):
            return _sqlalchemy(target, parameter)
        if module.startswith("django."):
            return _django(target, parameter)
    return target


def _sqlalchemy_url(url: str, parameter: str) -> str:
    scheme, sep, rest = url.partition("://")
    driver = scheme.partition("+")[2]
    if not sep or driver not in LIBPQ_DRIVERS:
        # Never echo the string: it may carry a password.
        raise InvalidArgument(
            f"pylease: {parameter} is a SQLAlchemy URL for driver {driver!r}: "
            "use postgresql+psycopg://",
            parameter=parameter,
        )
    return "postgresql://" + rest


def _sqlalchemy(target: Any, parameter: str) -> object:
    from sqlalchemy.engine import Connection, Engine
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
    from sqlalchemy.orm import Session

    if isinstance(target, AsyncSession):
        target = target.sync_session
    if isinstance(target, Session):
        # Its engine, not its connection: asking for that would begin the session's
        # transaction, and the claim is never part of it anyway.
        target = target.get_bind()
    if isinstance(target, AsyncEngine):
        target = target.sync_engine
    if isinstance(target, Engine):
        _check_dialect(target.dialect, parameter)
        # Parameters given only in create_engine(connect_args=...) are not in the URL
        # and pylease cannot see them: its connections are opened from the URL.
        cargs, cparams = target.dialect.create_connect_args(target.url)
        params = {k: v for k, v in cparams.items() if k not in _NOT_CONNINFO and v is not None}
        return _make_conninfo(*cargs, **params)
    if isinstance(target, AsyncConnection):
        target = target.sync_connection
        if target is None:
            raise InvalidArgument(
                f"pylease: {parameter} is an AsyncConnection that was not started",
                parameter=parameter,
            )
    if isinstance(target, Connection):
        _check_dialect(target.dialect, parameter)
        if target.closed or target.invalidated:
            raise InvalidArgument(
                f"pylease: {parameter} is a closed SQLAlchemy Connection", parameter=parameter
            )
        return _psycopg(target.connection.driver_connection, "SQLAlchemy", parameter)
    raise InvalidArgument(
        f"pylease: {parameter} cannot be {type(target).__name__}: expected a SQLAlchemy "
        "Engine, Connection or Session (or their async twins)",
        parameter=parameter,
    )


def _check_dialect(dialect: Any, parameter: str) -> None:
    if dialect.name != "postgresql" or dialect.driver not in LIBPQ_DRIVERS:
        raise InvalidArgument(
            f"pylease: {parameter} is a SQLAlchemy {dialect.name}+{dialect.driver} "
            "engine: pylease needs postgresql+psycopg://",
            parameter=parameter,
        )


def _django(target: Any, parameter: str) -> object:
    # django.db.connection is a proxy to the calling thread's DatabaseWrapper.
    vendor = getattr(target, "vendor", None)
    if vendor is None or not hasattr(target, "ensure_connection"):
        raise InvalidArgument(
            f"pylease: {parameter} cannot be {type(target).__name__}: expected a Django "
            "database connection (django.db.connection, connections[alias])",
            parameter=parameter,
        )
    if vendor != "postgresql":
        raise InvalidArgument(
            f"pylease: {parameter} is a Django {vendor} connection: pylease needs PostgreSQL "
            "(django.db.backends.postgresql over psycopg 3)",
            parameter=parameter,
        )
    if in_event_loop():
        # Django's connections are synchronous (touching one here raises
        # SynchronousOnlyOperation): pylease reaches the database by its settings, on
        # connections of its own, as for a URL.
        cparams = target.get_connection_params()
        params = {k: v for k, v in cparams.items() if k not in _NOT_CONNINFO and v is not None}
        return _make_conninfo("", **params)
    # Opens the connection if Django has not yet (or closed it at the end of a request).
    target.ensure_connection()
    return _psycopg(target.connection, "Django", parameter)


def _make_conninfo(*args: Any, **params: Any) -> str:
    # Only an ORM target over psycopg gets here: the driver is loaded already.
    from psycopg import conninfo

    return conninfo.make_conninfo(*args, **params)


def _psycopg(conn: object, framework: str, parameter: str) -> object:
    if is_psycopg(conn):
        return conn
    raise InvalidArgument(
        f"pylease: {parameter} is a {framework} connection over {type(conn).__module__}: "
        "pylease needs psycopg 3 (pip install psycopg)",
        parameter=parameter,
    )
