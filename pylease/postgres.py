"""The PostgreSQL backend: each operation is one call of a ``lease_*`` SQL function.

Every statement runs on the connection it is given as a statement of its own,
with tuple rows whatever the connection's row factory;
the caller decides which connection that is (see ``pylease.lease``). Driver
errors are mapped in one place, :func:`wrap_errors`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, LiteralString

import psycopg
from psycopg import errors as pg_errors
from psycopg.rows import tuple_row

from pylease import _arguments, _validate
from pylease._backend import CounterRow, LeaseEvent, LeaseRow, Renewal
from pylease.errors import (
    DatabaseUnavailable,
    FenceExhausted,
    InvalidArgument,
    PyleaseError,
    ReadOnlyServer,
    SchemaMissing,
)

CLAIM: LiteralString = "SELECT lease_claim(%s, %s, %s)"
RENEW: LiteralString = "SELECT lease_renew(%s, %s, %s)"
RENEW_MANY: LiteralString = "SELECT name, renewed FROM lease_renew_many(%s, %s, %s)"
RENEW_EACH: LiteralString = (
    "SELECT name, renewed, expires_at, server_time"
    " FROM lease_renew_each(%s::text[], %s::text[], %s::interval[])"
)
RELEASE: LiteralString = "SELECT lease_release(%s, %s, %s)"
STEAL: LiteralString = "SELECT lease_steal(%s, %s, %s, %s)"
HOLDS: LiteralString = "SELECT lease_holds(%s, %s, %s)"
STATUS: LiteralString = (
    "SELECT name, holder, fence, acquired_at, renewed_at, expires_at, held, state, ttl"
    " FROM lease_status(%s)"
)
COUNTERS: LiteralString = "SELECT name, grants, takeovers, steals, releases FROM lease_counters(%s)"
_EVENT_COLUMNS: LiteralString = "SELECT at, name, event, holder, fence, previous_holder"
HISTORY: LiteralString = _EVENT_COLUMNS + " FROM lease_history(%s, %s, %s)"
# A span back from now is taken by the database's clock, like every other time.
HISTORY_AGO: LiteralString = _EVENT_COLUMNS + " FROM lease_history(%s, clock_timestamp() - %s, %s)"
PRUNE_HISTORY: LiteralString = "SELECT lease_prune_history(%s)"

MISSING_SCHEMA_HINT = "the pylease schema is not installed here: run `pylease migrate --dsn ...`"


@contextmanager
def wrap_errors(name: str | None = None) -> Iterator[None]:
    """Map driver errors to pylease errors, keeping the driver error as ``__cause__``."""
    try:
        yield
    except pg_errors.InvalidParameterValue as exc:
        message = exc.diag.message_primary or str(exc)
        # Schema 0002 names the parameter in the error's COLUMN field; before it, the message.
        parameter = exc.diag.column_name or message.removeprefix("pylease: ").split(" ", 1)[0]
        raise InvalidArgument(message, parameter=parameter, name=name) from exc
    except pg_errors.ProgramLimitExceeded as exc:
        raise FenceExhausted(exc.diag.message_primary or _one_line(exc), name=name) from exc
    except (pg_errors.UndefinedFunction, pg_errors.UndefinedTable) as exc:
        raise SchemaMissing(
            f"pylease: {MISSING_SCHEMA_HINT} ({exc.diag.message_primary})", name=name
        ) from exc
    except pg_errors.ReadOnlySqlTransaction as exc:
        # A standby (the SQL refuses there with this SQLSTATE too): during a failover this
        # is transient, so it is a DatabaseUnavailable that the keeper retries.
        raise ReadOnlyServer(
            f"pylease: {ReadOnlyServer.__doc__} ({exc.diag.message_primary})", name=name
        ) from exc
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(
            f"pylease: database unavailable: {_one_line(exc)}", name=name
        ) from exc
    except psycopg.Error as exc:
        raise PyleaseError(f"pylease: {type(exc).__name__}: {_one_line(exc)}", name=name) from exc


class _args:
    """Each operation's parameters, checked before any SQL runs, as the SQLite backend does."""

    @staticmethod
    def claim(name: object, ttl: object, holder: object) -> tuple[Any, ...]:
        return (_validate.key("name", name), _validate.ttl(ttl), _validate.key("holder", holder))

    @staticmethod
    def renew(name: object, holder: object, ttl: object) -> tuple[Any, ...]:
        span = None if ttl is None else _validate.ttl(ttl)
        return (_validate.key("name", name), _validate.key("holder", holder), span)

    @staticmethod
    def renew_many(names: object, holders: object, ttl: object) -> tuple[Any, ...]:
        span = None if ttl is None else _validate.ttl(ttl)
        return (*_validate.key_lists(names, holders), span)

    @staticmethod
    def renew_each(names: object, holders: object, ttls: object) -> tuple[Any, ...]:
        name_list, holder_list = _validate.key_lists(names, holders)
        return (name_list, holder_list, _arguments.ttl_list(ttls, len(name_list)))

    @staticmethod
    def release(name: object, holder: object, min_hold: object) -> tuple[Any, ...]:
        span = None if min_hold is None else _validate.span("min_hold", min_hold)
        return (_validate.key("name", name), _validate.key("holder", holder), span)

    @staticmethod
    def steal(name: object, ttl: object, holder: object, older_than: object) -> tuple[Any, ...]:
        return (
            _validate.key("name", name),
            _validate.ttl(ttl),
            _validate.key("holder", holder),
            _validate.span("older_than", older_than),
        )

    @staticmethod
    def holds(name: object, holder: object, fence: object) -> tuple[Any, ...]:
        return (
            _validate.key("name", name),
            _validate.key("holder", holder),
            _validate.fence(fence),
        )

    @staticmethod
    def status(name: object) -> tuple[Any, ...]:
        return (None if name is None else _validate.key("name", name),)

    @staticmethod
    def history(name: object, since: object, max_rows: object) -> tuple[Any, ...]:
        return (
            None if name is None else _validate.key("name", name),
            _arguments.since(since),
            _arguments.max_rows(max_rows),
        )

    @staticmethod
    def prune_history(older_than: object) -> tuple[Any, ...]:
        return (_validate.span("older_than", older_than),)


def _history_query(params: tuple[Any, ...]) -> LiteralString:
    return HISTORY_AGO if isinstance(params[1], timedelta) else HISTORY


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _row(values: tuple[Any, ...]) -> LeaseRow:
    return LeaseRow(*values)


class PostgresBackend:
    """Lease operations on one psycopg connection."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def _one(self, query: LiteralString, params: Sequence[Any], name: str | None) -> Any:
        with wrap_errors(name), self.conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(query, params)
            row = cur.fetchone()
        assert row is not None
        return row[0]

    def claim(self, name: str, ttl: timedelta, holder: str) -> int | None:
        result: int | None = self._one(CLAIM, _args.claim(name, ttl, holder), name)
        return result

    def renew(self, name: str, holder: str, ttl: timedelta | None = None) -> bool:
        return bool(self._one(RENEW, _args.renew(name, holder, ttl), name))

    def renew_many(
        self, names: Sequence[str], holders: Sequence[str], ttl: timedelta | None = None
    ) -> list[tuple[str, bool]]:
        with wrap_errors(), self.conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(RENEW_MANY, _args.renew_many(names, holders, ttl))
            return [(n, bool(r)) for n, r in cur.fetchall()]

    def renew_each(
        self,
        names: Sequence[str],
        holders: Sequence[str],
        ttls: Sequence[timedelta | None],
    ) -> list[Renewal]:
        """Renew each lease with its own ttl (None: its last one), in one statement.

        :raises InvalidArgument: bad names, holders or ttls, or lists of unequal length.
        """
        with wrap_errors(), self.conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(RENEW_EACH, _args.renew_each(names, holders, ttls))
            return [Renewal(n, bool(r), e, t) for n, r, e, t in cur.fetchall()]

    def release(self, name: str, holder: str, min_hold: timedelta | None = None) -> bool:
        return bool(self._one(RELEASE, _args.release(name, holder, min_hold), name))

    def steal(
        self, name: str, ttl: timedelta, holder: str, older_than: timedelta = timedelta(0)
    ) -> int | None:
        result: int | None = self._one(STEAL, _args.steal(name, ttl, holder, older_than), name)
        return result

    def holds(self, name: str, holder: str, fence: int) -> bool:
        return bool(self._one(HOLDS, _args.holds(name, holder, fence), name))

    def status(self, name: str | None = None) -> list[LeaseRow]:
        with wrap_errors(name), self.conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(STATUS, _args.status(name))
            return [_row(r) for r in cur.fetchall()]

    def counters(self, name: str | None = None) -> list[CounterRow]:
        """``lease_counters``: per name (all when None), grants, takeovers, steals, releases."""
        with wrap_errors(name), self.conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(COUNTERS, _args.status(name))
            return [CounterRow(*r) for r in cur.fetchall()]

    def history(
        self,
        name: str | None = None,
        since: datetime | timedelta | None = None,
        max_rows: int = 100,
    ) -> list[LeaseEvent]:
        """``lease_history``: recorded events, newest first.

        :param since: an aware datetime, or a span back from the database's now.
        :raises InvalidArgument: a bad name, since, or max_rows outside 1..10,000.
        """
        params = _args.history(name, since, max_rows)
        with wrap_errors(name), self.conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(_history_query(params), params)
            return [LeaseEvent(*r) for r in cur.fetchall()]

    def prune_history(self, older_than: timedelta) -> int:
        """``lease_prune_history``: delete the events older than ``older_than``; how many.

        :raises PyleaseError: the role may not prune (not executable by PUBLIC).
        """
        return int(self._one(PRUNE_HISTORY, _args.prune_history(older_than), None))


class AsyncPostgresBackend:
    """Lease operations on one psycopg async connection; kept in step with PostgresBackend."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def _one(self, query: LiteralString, params: Sequence[Any], name: str | None) -> Any:
        with wrap_errors(name):
            async with self.conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(query, params)
                row = await cur.fetchone()
        assert row is not None
        return row[0]

    async def claim(self, name: str, ttl: timedelta, holder: str) -> int | None:
        result: int | None = await self._one(CLAIM, _args.claim(name, ttl, holder), name)
        return result

    async def renew(self, name: str, holder: str, ttl: timedelta | None = None) -> bool:
        return bool(await self._one(RENEW, _args.renew(name, holder, ttl), name))

    async def renew_many(
        self, names: Sequence[str], holders: Sequence[str], ttl: timedelta | None = None
    ) -> list[tuple[str, bool]]:
        with wrap_errors():
            async with self.conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(RENEW_MANY, _args.renew_many(names, holders, ttl))
                return [(n, bool(r)) for n, r in await cur.fetchall()]

    async def renew_each(
        self,
        names: Sequence[str],
        holders: Sequence[str],
        ttls: Sequence[timedelta | None],
    ) -> list[Renewal]:
        """Renew each lease with its own ttl (None: its last one), in one statement.

        :raises InvalidArgument: bad names, holders or ttls, or lists of unequal length.
        """
        with wrap_errors():
            async with self.conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(RENEW_EACH, _args.renew_each(names, holders, ttls))
                return [Renewal(n, bool(r), e, t) for n, r, e, t in await cur.fetchall()]

    async def release(self, name: str, holder: str, min_hold: timedelta | None = None) -> bool:
        return bool(await self._one(RELEASE, _args.release(name, holder, min_hold), name))

    async def steal(
        self, name: str, ttl: timedelta, holder: str, older_than: timedelta = timedelta(0)
    ) -> int | None:
        result: int | None = await self._one(
            STEAL, _args.steal(name, ttl, holder, older_than), name
        )
        return result

    async def holds(self, name: str, holder: str, fence: int) -> bool:
        return bool(await self._one(HOLDS, _args.holds(name, holder, fence), name))

    async def status(self, name: str | None = None) -> list[LeaseRow]:
        with wrap_errors(name):
            async with self.conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(STATUS, _args.status(name))
                return [_row(r) for r in await cur.fetchall()]

    async def counters(self, name: str | None = None) -> list[CounterRow]:
        """``lease_counters``: per name (all when None), grants, takeovers, steals, releases."""
        with wrap_errors(name):
            async with self.conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(COUNTERS, _args.status(name))
                return [CounterRow(*r) for r in await cur.fetchall()]

    async def history(
        self,
        name: str | None = None,
        since: datetime | timedelta | None = None,
        max_rows: int = 100,
    ) -> list[LeaseEvent]:
        """``lease_history``: recorded events, newest first.

        :param since: an aware datetime, or a span back from the database's now.
        :raises InvalidArgument: a bad name, since, or max_rows outside 1..10,000.
        """
        params = _args.history(name, since, max_rows)
        with wrap_errors(name):
            async with self.conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(_history_query(params), params)
                return [LeaseEvent(*r) for r in await cur.fetchall()]

    async def prune_history(self, older_than: timedelta) -> int:
        """``lease_prune_history``: delete the events older than ``older_than``; how many.

        :raises PyleaseError: the role may not prune (not executable by PUBLIC).
        """
        return int(await self._one(PRUNE_HISTORY, _args.prune_history(older_than), None))
