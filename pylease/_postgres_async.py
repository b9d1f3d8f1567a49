# The source of pylease/postgres.py: tools/async_to_sync.py writes it from this file.
"""The PostgreSQL backend: each operation is one call of a ``lease_*`` SQL function.

Every statement runs on the connection it is given as a statement of its own,
with tuple rows whatever the connection's row factory;
the caller decides which connection that is (see ``pylease.alease``). Driver
errors are mapped in one place, :func:`wrap_errors`. :mod:`pylease.postgres`
exports both backends, ``PostgresBackend`` and ``AsyncPostgresBackend``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, LiteralString

import psycopg
from psycopg.rows import tuple_row

from pylease import _arguments as _args
from pylease._pg_errors import MISSING_SCHEMA_HINT as MISSING_SCHEMA_HINT
from pylease._pg_errors import wrap_errors as wrap_errors
from pylease._rows import LeaseRow

# sync: from pylease._postgres_async import AsyncPostgresBackend as AsyncPostgresBackend


# One statement per operation, each a call of its lease_* SQL function.
CLAIM: LiteralString = "SELECT lease_claim(%s, %s, %s)"
RENEW: LiteralString = "SELECT lease_renew(%s, %s, %s)"
RENEW_MANY: LiteralString = "SELECT name, renewed FROM lease_renew_many(%s, %s, %s)"
RELEASE: LiteralString = "SELECT lease_release(%s, %s, %s)"
STEAL: LiteralString = "SELECT lease_steal(%s, %s, %s, %s)"
HOLDS: LiteralString = "SELECT lease_holds(%s, %s, %s)"
STATUS: LiteralString = (
    "SELECT name, holder, fence, acquired_at, renewed_at, expires_at, held FROM lease_status(%s)"
)


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
                return [LeaseRow(*r) for r in await cur.fetchall()]
