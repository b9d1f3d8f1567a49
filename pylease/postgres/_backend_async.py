# The source of pylease/postgres/_backend.py: tools/async_to_sync.py writes it from this file.
"""The PostgreSQL backend: each operation is one call of a ``lease_*`` SQL function.

The operations and their statements are declared in :mod:`pylease._operations`;
this backend runs any of them. Every statement runs on the connection it is given as
a statement of its own, with tuple rows whatever the connection's row factory; the
caller decides which connection that is (see ``pylease.alease``). Driver errors are
mapped in one place, :func:`wrap_errors`. :mod:`pylease.postgres` exports both
backends, the sync one and the async one.

Given a schema, every function call names it, so that the statements of one lease run
in one schema on every connection, whatever each one's ``search_path`` says. A role's
or database's settings never decide a race either: a statement they made fail (a
serialization failure under ``default_transaction_isolation``, a ``statement_timeout``
or ``lock_timeout`` that cancelled it; nothing of it committed) runs again once, in a
transaction of its own that is READ COMMITTED with the server's default bounds.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from pylease._backend_async import AsyncBackend
from pylease._budget import connect_timeout
from pylease._operations import COUNT, DATALESS, FLAG, GRANT, VALUE, Operation
from pylease.errors import ConfigurationError, DatabaseUnavailable, SchemaMissing
from pylease.postgres._abandon import bounded
from pylease.postgres._conninfo import CONNECT_TIMEOUT, is_idle
from pylease.postgres._errors import MISSING_SCHEMA_HINT as MISSING_SCHEMA_HINT
from pylease.postgres._errors import translate
from pylease.postgres._errors import wrap_errors as wrap_errors
from pylease.postgres._syncrep import confirmed

# sync: from pylease.postgres._backend_async import AsyncPostgresBackend as AsyncPostgresBackend

T = TypeVar("T")


#: Where ``lease_claim`` resolves by a connection's ``search_path``: the schema a
#: lease's statements then name on every connection. Not installed, the cast raises
#: 42883, as a call would (SchemaMissing).
RESOLVE: LiteralString = (
    "SELECT n.nspname FROM pg_catalog.pg_proc AS p"
    " JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace"
    " WHERE p.oid = 'lease_claim(text,interval,text)'::pg_catalog.regprocedure"
)

_CALL = re.compile(r"(?<![\w.])((?:lease|permit|pylease)_\w+)\(")
_qualified: dict[tuple[str, str], str] = {}


def qualified(statement: LiteralString, schema: str) -> LiteralString:
    """``statement`` with every call of a function of pylease's (``lease_*``, ``permit_*``,
    ``pylease_*``) qualified by ``schema``."""
    found = _qualified.get((statement, schema))
    if found is None:
        prefix = sql.Identifier(schema).as_string(None) + "."
        found = _CALL.sub(lambda m: prefix + m.group(1) + "(", statement)
        _qualified[(statement, schema)] = found
    # The schema is quoted as an identifier: the statement stays one of ours.
    return found


# What a role's or database's settings can make a statement fail with, where the same
# statement run with the server's defaults would have answered: it committed nothing.
_SETTINGS_FAILURES = (
    pg_errors.SerializationFailure,
    pg_errors.QueryCanceled,
    pg_errors.LockNotAvailable,
)
_DEFAULTS: LiteralString = (
    "SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0;"
    " SET LOCAL idle_in_transaction_session_timeout = 0"
)


class AsyncPostgresBackend(AsyncBackend):
    """Lease operations on one psycopg connection; with ``schema``, that schema's."""

    def __init__(
        self,
        conn: psycopg.AsyncConnection[Any],
        schema: str | None = None,
        *,
        defaults: bool = False,
    ) -> None:
        self.conn = conn
        self.schema = schema
        #: Run every statement READ COMMITTED with the server's default bounds at once.
        self.defaults = defaults
        # The cursor the last statement left, for the next: making one costs a
        # statement's client work again, and a lease block's claim and release run on
        # one backend (see AsyncLink.run).
        self._idle: list[psycopg.AsyncCursor[tuple[Any, ...]]] = []

    def in_schema(self, schema: str) -> AsyncPostgresBackend:
        if schema == self.schema:
            return self
        return AsyncPostgresBackend(self.conn, schema, defaults=self.defaults)

    async def installed_schema(self) -> str | None:
        with wrap_errors():
            cur = self.conn.cursor(row_factory=tuple_row)
            await cur.execute(RESOLVE)
            row = await cur.fetchone()
        return None if row is None else str(row[0])

    async def _call(self, op: Operation, params: tuple[Any, ...], name: str | None) -> Any:
        plain = DATALESS.get(op.name)
        if plain is not None and params[plain[1]] is None:
            op, at = plain
            params = params[:at] + params[at + 1 :]
        if op.kind is GRANT:
            # A grant or renewal must not count unless durable.
            with confirmed(self.conn, name):
                rows = await self._rows(op, params, name)
        else:
            rows = await self._rows(op, params, name)
        answer = op.answer
        if answer is VALUE:
            return rows[0][0]
        if answer is FLAG:
            return bool(rows[0][0])
        if answer is COUNT:
            return int(rows[0][0])
        if answer is tuple:
            return rows
        assert isinstance(answer, type)
        return [answer(*row) for row in rows]

    async def _rows(
        self, op: Operation, params: tuple[Any, ...], name: str | None
    ) -> list[tuple[Any, ...]]:
        query = op.postgres
        if self.schema is not None:
            query = _qualified.get((query, self.schema)) or qualified(query, self.schema)
        # As wrap_errors(name) does, without its calls on the hot path (a try costs none).
        try:
            try:
                # Taken, not shared: statements of two tasks or threads never run on one.
                cur = self._idle.pop()
            except IndexError:
                # A client-side cursor holds nothing to close: no `async with` here.
                cur = self.conn.cursor(row_factory=tuple_row)
            if self.defaults:
                return await self._with_defaults(cur, query, params)
            try:
                await cur.execute(query, params)
            except _SETTINGS_FAILURES:
                return await self._with_defaults(cur, query, params)
            rows = await cur.fetchall()
            self._idle.append(cur)
            return rows
        except psycopg.Error as exc:
            raise translate(exc, name) from exc

    async def _with_defaults(
        self, cur: psycopg.AsyncCursor[tuple[Any, ...]], query: LiteralString, params: Any
    ) -> list[tuple[Any, ...]]:
        """Run the statement again, READ COMMITTED with the server's default bounds, in a
        transaction that ends with it: nothing is left set on the connection."""
        conn = self.conn
        if not conn.autocommit:
            # The transaction is one run_committed opened for this statement alone.
            if conn.pgconn.transaction_status != TransactionStatus.IDLE:
                await conn.rollback()
            await cur.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; " + _DEFAULTS)
            await cur.execute(query, params)
            return await cur.fetchall()
        await cur.execute("BEGIN ISOLATION LEVEL READ COMMITTED; " + _DEFAULTS)
        try:
            await cur.execute(query, params)
            rows = await cur.fetchall()
            await cur.execute("COMMIT")
        except BaseException:
            if conn.pgconn.transaction_status != TransactionStatus.IDLE and not conn.broken:
                with contextlib.suppress(psycopg.Error):
                    await cur.execute("ROLLBACK")
            raise
        return rows


async def connect_own(conninfo: str, name: str | None) -> psycopg.AsyncConnection[Any]:
    """Open a connection of pylease's own: autocommit, no prepared statements; inside a
    block's exit, within what is left of its budget."""
    timeout = connect_timeout(name, int(CONNECT_TIMEOUT))
    if timeout is not None:
        conninfo = make_conninfo(conninfo, connect_timeout=timeout)
    with wrap_errors(name):
        return await psycopg.AsyncConnection.connect(
            conninfo, autocommit=True, prepare_threshold=None
        )


async def run_committed(
    conn: psycopg.AsyncConnection[Any],
    op: Callable[[AsyncBackend], Awaitable[T]],
    schema: str | None = None,
    *,
    idle: bool = False,
    backend: AsyncPostgresBackend | None = None,
) -> T:
    """Run ``op`` on an idle connection as a transaction of its own, its statements
    naming ``schema`` (None: as they are); ``idle``: the caller has just seen it idle;
    ``backend``: one of ``conn`` in ``schema`` to run it on (one is made otherwise).

    :raises ConfigurationError: the connection is not idle: its open transaction is
        somebody else's, and a claim, renewal or release there would commit it.
    """
    if not idle and not conn.closed and not is_idle(conn):
        raise ConfigurationError(
            "pylease: a connection pylease was given for its own statements is inside a"
            " transaction; pylease never runs a claim, renewal or release there (it would"
            " commit that transaction)"
        )
    with bounded(conn):
        b = backend or AsyncPostgresBackend(conn, schema)
        if conn.autocommit:
            return await op(b)
        try:
            result = await op(b)
            try:
                with wrap_errors():
                    await conn.commit()
            except DatabaseUnavailable as exc:
                if not isinstance(exc.__cause__, psycopg.errors.SerializationFailure):
                    raise
                # At the commit: a serializable default's verdict, not the race's (nothing
                # committed). Once more, READ COMMITTED.
                result = await op(AsyncPostgresBackend(conn, schema, defaults=True))
                with wrap_errors():
                    await conn.commit()
        except BaseException:
            if not conn.closed:
                with wrap_errors():
                    await conn.rollback()
            raise
        return result


# The schema found on a connection or pool the caller gave, the first time pylease
# used it: every lease through it names that schema from then on.
schemas: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def not_installed(name: str | None) -> SchemaMissing:
    return SchemaMissing(
        f"pylease: {MISSING_SCHEMA_HINT} (no lease_claim(text, interval, text) on the search_path)",
        name=name,
    )


async def connection_schema(conn: psycopg.AsyncConnection[Any], name: str | None) -> str:
    """Where ``lease_claim`` resolves on the caller's ``conn``, by its ``search_path``.

    Looked up once per connection: idle, in a transaction of its own; inside the
    caller's open transaction, by a read of the catalog that takes no lock and
    writes nothing (a schema that depended on whether a transaction is open would
    split leases between two installs).
    """
    found = schemas.get(conn)
    if found is not None:
        return found
    if conn.pgconn.transaction_status == TransactionStatus.INERROR:
        raise ConfigurationError(
            "pylease: the connection's transaction has failed: roll it back before the first"
            " lease on it (pylease looks up on it which schema holds pylease)",
        )
    backend = AsyncPostgresBackend(conn)
    if conn.autocommit or not is_idle(conn):
        schema = await backend.installed_schema()
    else:
        try:
            schema = await backend.installed_schema()
        finally:
            if not conn.closed:
                with wrap_errors(name):
                    await conn.rollback()
    if schema is None:
        raise not_installed(name)
    schemas[conn] = schema
    return schema
