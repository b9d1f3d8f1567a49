# The source of pylease/postgres.py: tools/async_to_sync.py writes it from this file.
"""The PostgreSQL backend: each operation is one call of a ``lease_*`` SQL function.

Every statement runs on the connection it is given as a statement of its own,
with tuple rows whatever the connection's row factory;
the caller decides which connection that is (see ``pylease.alease``). Driver
errors are mapped in one place, :func:`wrap_errors`. :mod:`pylease.postgres`
exports both backends, the sync one and the async one.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, LiteralString

import psycopg
from psycopg.rows import tuple_row

from pylease import _arguments as _args
from pylease._pg_errors import MISSING_SCHEMA_HINT as MISSING_SCHEMA_HINT
from pylease._pg_errors import wrap_errors as wrap_errors
from pylease._rows import CounterRow, LeaseEvent, LeaseRow, Renewal
from pylease._syncrep import confirmed

# sync: from pylease._postgres_async import AsyncPostgresBackend as AsyncPostgresBackend


# One statement per operation, each a call of its lease_* SQL function.
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


def _history_query(params: tuple[Any, ...]) -> LiteralString:
    return HISTORY_AGO if isinstance(params[1], timedelta) else HISTORY


class AsyncPostgresBackend:
    """Lease operations on one psycopg connection."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def _one(self, query: LiteralString, params: Sequence[Any], name: str | None) -> Any:
        with wrap_errors(name):
            async with self.conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(query, params)
                row = await cur.fetchone()
        assert row is not None
        return row[0]

    async def _all(
        self, query: LiteralString, params: Sequence[Any], name: str | None
    ) -> list[tuple[Any, ...]]:
        with wrap_errors(name):
            async with self.conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(query, params)
                return await cur.fetchall()

    async def _write(self, query: LiteralString, params: Sequence[Any], name: str | None) -> Any:
        """:meth:`_one` for a grant or renewal, which must not count unless durable."""
        with confirmed(self.conn, name):
            return await self._one(query, params, name)

    async def claim(self, name: str, ttl: timedelta, holder: str) -> int | None:
        result: int | None = await self._write(CLAIM, _args.claim(name, ttl, holder), name)
        return result

    async def renew(self, name: str, holder: str, ttl: timedelta | None = None) -> bool:
        return bool(await self._write(RENEW, _args.renew(name, holder, ttl), name))

    async def renew_many(
        self, names: Sequence[str], holders: Sequence[str], ttl: timedelta | None = None
    ) -> list[tuple[str, bool]]:
        with confirmed(self.conn, None):
            rows = await self._all(RENEW_MANY, _args.renew_many(names, holders, ttl), None)
        return [(n, bool(r)) for n, r in rows]

    async def renew_each(
        self,
        names: Sequence[str],
        holders: Sequence[str],
        ttls: Sequence[timedelta | None],
    ) -> list[Renewal]:
        """Renew each lease with its own ttl (None: its last one), in one statement.

        :raises InvalidArgument: bad names, holders or ttls, or lists of unequal length.
        """
        with confirmed(self.conn, None):
            rows = await self._all(RENEW_EACH, _args.renew_each(names, holders, ttls), None)
        return [Renewal(*r) for r in rows]

    async def release(self, name: str, holder: str, min_hold: timedelta | None = None) -> bool:
        return bool(await self._one(RELEASE, _args.release(name, holder, min_hold), name))

    async def steal(
        self, name: str, ttl: timedelta, holder: str, older_than: timedelta = timedelta(0)
    ) -> int | None:
        result: int | None = await self._write(
            STEAL, _args.steal(name, ttl, holder, older_than), name
        )
        return result

    async def holds(self, name: str, holder: str, fence: int) -> bool:
        return bool(await self._one(HOLDS, _args.holds(name, holder, fence), name))

    async def status(self, name: str | None = None) -> list[LeaseRow]:
        with wrap_errors(name):
            async with self.conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(STATUS, _args.status(name))
                return [LeaseRow(*r) for r in await cur.fetchall()]

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
