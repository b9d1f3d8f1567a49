# The source of pylease/postgres/_backend.py: tools/async_to_sync.py writes it from this file.
"""The PostgreSQL backend: each operation is one call of a ``lease_*`` SQL function.

The operations and their statements are declared in :mod:`pylease._operations`;
this backend runs any of them. Every statement runs on the connection it is given as
a statement of its own, with tuple rows whatever the connection's row factory; the
caller decides which connection that is (see ``pylease.alease``). Driver errors are
mapped in one place, :func:`wrap_errors`. :mod:`pylease.postgres` exports both
backends, the sync one and the async one.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import tuple_row

from pylease._backend_async import AsyncBackend
from pylease._operations import COUNT, FLAG, GRANT, VALUE, Operation
from pylease.postgres._errors import MISSING_SCHEMA_HINT as MISSING_SCHEMA_HINT
from pylease.postgres._errors import wrap_errors as wrap_errors
from pylease.postgres._syncrep import confirmed

# sync: from pylease.postgres._backend_async import AsyncPostgresBackend as AsyncPostgresBackend


class AsyncPostgresBackend(AsyncBackend):
    """Lease operations on one psycopg connection."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def _call(self, op: Operation, params: tuple[Any, ...], name: str | None) -> Any:
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
        with wrap_errors(name):
            # A client-side cursor holds nothing to close: no `async with` on the hot path.
            cur = self.conn.cursor(row_factory=tuple_row)
            await cur.execute(op.postgres, params)
            return await cur.fetchall()
