"""The lease operations on a SQLite connection: one statement of ``sql/sqlite/`` each."""

from __future__ import annotations

import asyncio
import functools
import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pylease import _arguments, _validate
from pylease._backend import AsyncBackend, Backend, CounterRow, LeaseEvent, LeaseRow, Renewal
from pylease._resources import data_dir
from pylease.errors import DatabaseUnavailable, InvalidArgument
from pylease.sqlite._connection import DEFAULT_BUSY_TIMEOUT
from pylease.sqlite._errors import _errors, _where
from pylease.sqlite._migrator import _SHARED_LOCK

OPERATIONS = (
    "claim",
    "renew",
    "renew_many",
    "renew_each",
    "release",
    "steal",
    "holds",
    "status",
    "counters",
    "history",
    "prune_history",
)

#: The values of the history setting (the row 'history' of pylease_settings).
HISTORY_SETTINGS = ("rare", "all", "none")


@functools.cache
def _sql(operation: str) -> str:
    """The statement of ``sql/sqlite/<operation>.sql``, exactly as other languages run it."""
    return (data_dir("sql", "sqlite") / f"{operation}.sql").read_text(encoding="utf-8")


# Backends --------------------------------------------------------------------


def _seconds(span: timedelta) -> float:
    return span.total_seconds()


def _when(unix_seconds: float) -> datetime:
    return datetime.fromtimestamp(unix_seconds, UTC)


class SqliteBackend:
    """Lease operations on one SQLite connection, with the semantics of the SQL API.

    Outside a transaction each write runs alone in ``BEGIN IMMEDIATE ... COMMIT``;
    inside the caller's own transaction it joins it, as a PostgreSQL function call
    would. Threads sharing the connection are serialized (a connection from
    :func:`connect` carries its lock; others share one module-wide lock).
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._lock: Any = getattr(conn, "pylease_lock", _SHARED_LOCK)
        busy: float = getattr(conn, "pylease_busy_timeout", DEFAULT_BUSY_TIMEOUT)
        # A thread waits for another that may itself wait out a busy timeout.
        self._lock_timeout = 2 * busy + 1.0
        self._where = _where(conn)

    @contextmanager
    def _session(self, name: str | None) -> Iterator[sqlite3.Connection]:
        if not self._lock.acquire(timeout=self._lock_timeout):
            raise DatabaseUnavailable(
                f"pylease: another thread kept the SQLite connection to {self._where} "
                f"busy for over {self._lock_timeout:g}s",
                name=name,
            )
        try:
            with _errors(name, self._where):
                yield self.conn
        finally:
            self._lock.release()

    def _write(
        self, operation: str, params: Mapping[str, Any], name: str | None, *, durable: bool = True
    ) -> list[Any]:
        with self._session(name) as conn:
            if conn.in_transaction:
                return conn.execute(_sql(operation), params).fetchall()
            restore: int | None = None
            if not durable:
                level = int(conn.execute("PRAGMA synchronous").fetchone()[0])
                if level > 1:
                    restore = level
                    conn.execute("PRAGMA synchronous = NORMAL")
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    rows = conn.execute(_sql(operation), params).fetchall()
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            finally:
                if restore is not None:
                    conn.execute(f"PRAGMA synchronous = {restore}")
            return rows

    def _read(self, operation: str, params: Mapping[str, Any], name: str | None) -> list[Any]:
        with self._session(name) as conn:
            return conn.execute(_sql(operation), params).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE ... COMMIT`` on this connection, holding it for this thread.

        For a fenced write: ``holds`` and the write inside one transaction keep every
        takeover out until the write is committed. Rolled back on an exception.
        """
        with self._session(None) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            if conn.in_transaction:
                conn.execute("COMMIT")

    def claim(self, name: str, ttl: timedelta, holder: str) -> int | None:
        _validate.key("name", name)
        ttl = _validate.ttl(ttl)
        _validate.key("holder", holder)
        params = {"name": name, "ttl_seconds": _seconds(ttl), "holder": holder}
        rows = self._write("claim", params, name)
        return int(rows[0][0]) if rows else None

    def renew(self, name: str, holder: str, ttl: timedelta | None = None) -> bool:
        _validate.key("name", name)
        _validate.key("holder", holder)
        seconds = None if ttl is None else _seconds(_validate.ttl(ttl))
        params = {"name": name, "holder": holder, "ttl_seconds": seconds}
        return bool(self._write("renew", params, name))

    def renew_many(
        self, names: Sequence[str], holders: Sequence[str], ttl: timedelta | None = None
    ) -> list[tuple[str, bool]]:
        name_list, holder_list = _validate.key_lists(names, holders)
        seconds = None if ttl is None else _seconds(_validate.ttl(ttl))
        if not name_list:
            return []
        params = {
            "names": json.dumps(name_list),
            "holders": json.dumps(holder_list),
            "ttl_seconds": seconds,
        }
        renewed = {(row[0], row[1]) for row in self._write("renew_many", params, None)}
        return [(n, (n, h) in renewed) for n, h in zip(name_list, holder_list, strict=True)]

    def renew_each(
        self,
        names: Sequence[str],
        holders: Sequence[str],
        ttls: Sequence[timedelta | None],
    ) -> list[Renewal]:
        """Renew each lease with its own ttl (None: its last one), in one statement.

        :raises InvalidArgument: bad names, holders or ttls, or lists of unequal length.
        """
        name_list, holder_list = _validate.key_lists(names, holders)
        ttl_list = _arguments.ttl_list(ttls, len(name_list))
        if not name_list:
            return []
        params = {
            "names": json.dumps(name_list),
            "holders": json.dumps(holder_list),
            "ttls": json.dumps([None if t is None else _seconds(t) for t in ttl_list]),
        }
        renewed = {(r[0], r[1]): r for r in self._write("renew_each", params, None)}
        result = []
        for n, h in zip(name_list, holder_list, strict=True):
            row = renewed.get((n, h))
            if row is None:
                result.append(Renewal(n, False, None, None))
            else:
                result.append(Renewal(n, True, _when(row[2]), _when(row[3])))
        return result

    def release(self, name: str, holder: str, min_hold: timedelta | None = None) -> bool:
        _validate.key("name", name)
        _validate.key("holder", holder)
        seconds = None if min_hold is None else _seconds(_validate.span("min_hold", min_hold))
        params = {"name": name, "holder": holder, "min_hold_seconds": seconds}
        return bool(self._write("release", params, name, durable=False))

    def steal(
        self, name: str, ttl: timedelta, holder: str, older_than: timedelta = timedelta(0)
    ) -> int | None:
        _validate.key("name", name)
        ttl = _validate.ttl(ttl)
        _validate.key("holder", holder)
        older = _validate.span("older_than", older_than)
        params = {
            "name": name,
            "ttl_seconds": _seconds(ttl),
            "holder": holder,
            "older_than_seconds": _seconds(older),
        }
        rows = self._write("steal", params, name)
        return int(rows[0][0]) if rows else None

    def holds(self, name: str, holder: str, fence: int) -> bool:
        _validate.key("name", name)
        _validate.key("holder", holder)
        _validate.fence(fence)
        rows = self._read("holds", {"name": name, "holder": holder, "fence": fence}, name)
        return bool(rows[0][0])

    def status(self, name: str | None = None) -> list[LeaseRow]:
        if name is not None:
            _validate.key("name", name)
        return [
            LeaseRow(
                name=row[0],
                holder=row[1],
                fence=int(row[2]),
                acquired_at=_when(row[3]),
                renewed_at=_when(row[4]),
                expires_at=_when(row[5]),
                held=bool(row[6]),
                state=row[7],
                ttl=timedelta(seconds=row[8]),
            )
            for row in self._read("status", {"name": name}, name)
        ]

    def counters(self, name: str | None = None) -> list[CounterRow]:
        """Per name (all when None): grants, takeovers, steals and releases."""
        if name is not None:
            _validate.key("name", name)
        return [CounterRow(*row) for row in self._read("counters", {"name": name}, name)]

    def history(
        self,
        name: str | None = None,
        since: datetime | timedelta | None = None,
        max_rows: int = 100,
    ) -> list[LeaseEvent]:
        """Recorded events, newest first (see :func:`set_history` for what is recorded).

        :param since: an aware datetime, or a span back from now (SQLite's clock).
        :raises InvalidArgument: a bad name, since, or max_rows outside 1..10,000.
        """
        if name is not None:
            _validate.key("name", name)
        after = _arguments.since(since)
        params = {
            "name": name,
            "since": after.timestamp() if isinstance(after, datetime) else None,
            "since_seconds": _seconds(after) if isinstance(after, timedelta) else None,
            "max_rows": _arguments.max_rows(max_rows),
        }
        return [
            LeaseEvent(_when(r[0]), r[1], r[2], r[3], int(r[4]), r[5])
            for r in self._read("history", params, name)
        ]

    def prune_history(self, older_than: timedelta) -> int:
        """Delete the events older than ``older_than``; returns how many."""
        older = _validate.span("older_than", older_than)
        return len(self._write("prune_history", {"older_than_seconds": _seconds(older)}, None))


class AsyncSqliteBackend:
    """The same operations, awaitable: each runs in a worker thread (``asyncio.to_thread``)."""

    def __init__(self, conn: sqlite3.Connection | SqliteBackend) -> None:
        self.sync = conn if isinstance(conn, SqliteBackend) else SqliteBackend(conn)
        self.conn = self.sync.conn

    async def claim(self, name: str, ttl: timedelta, holder: str) -> int | None:
        return await asyncio.to_thread(self.sync.claim, name, ttl, holder)

    async def renew(self, name: str, holder: str, ttl: timedelta | None = None) -> bool:
        return await asyncio.to_thread(self.sync.renew, name, holder, ttl)

    async def renew_many(
        self, names: Sequence[str], holders: Sequence[str], ttl: timedelta | None = None
    ) -> list[tuple[str, bool]]:
        return await asyncio.to_thread(self.sync.renew_many, names, holders, ttl)

    async def renew_each(
        self,
        names: Sequence[str],
        holders: Sequence[str],
        ttls: Sequence[timedelta | None],
    ) -> list[Renewal]:
        """Renew each lease with its own ttl (None: its last one), in one statement."""
        return await asyncio.to_thread(self.sync.renew_each, names, holders, ttls)

    async def release(self, name: str, holder: str, min_hold: timedelta | None = None) -> bool:
        return await asyncio.to_thread(self.sync.release, name, holder, min_hold)

    async def steal(
        self, name: str, ttl: timedelta, holder: str, older_than: timedelta = timedelta(0)
    ) -> int | None:
        return await asyncio.to_thread(self.sync.steal, name, ttl, holder, older_than)

    async def holds(self, name: str, holder: str, fence: int) -> bool:
        return await asyncio.to_thread(self.sync.holds, name, holder, fence)

    async def status(self, name: str | None = None) -> list[LeaseRow]:
        return await asyncio.to_thread(self.sync.status, name)

    async def counters(self, name: str | None = None) -> list[CounterRow]:
        """Per name (all when None): grants, takeovers, steals and releases."""
        return await asyncio.to_thread(self.sync.counters, name)

    async def history(
        self,
        name: str | None = None,
        since: datetime | timedelta | None = None,
        max_rows: int = 100,
    ) -> list[LeaseEvent]:
        """Recorded events, newest first."""
        return await asyncio.to_thread(self.sync.history, name, since, max_rows)

    async def prune_history(self, older_than: timedelta) -> int:
        """Delete the events older than ``older_than``; returns how many."""
        return await asyncio.to_thread(self.sync.prune_history, older_than)


def set_history(conn: sqlite3.Connection, setting: str) -> None:
    """Set what the file's history records: ``rare`` (the default), ``all`` or ``none``.

    SQLite has no session settings: this is the row ``history`` of the table
    ``pylease_settings``, for every connection to the file (PostgreSQL's
    ``pylease.history`` can also be set per role or session).

    :raises InvalidArgument: another value.
    """
    if setting not in HISTORY_SETTINGS:
        raise InvalidArgument(
            f"pylease: pylease.history must be rare, all or none, not {setting!r}",
            parameter="pylease.history",
        )
    backend = SqliteBackend(conn)
    with backend.transaction() as locked:
        locked.execute(
            "INSERT OR REPLACE INTO pylease_settings (name, value) VALUES ('history', ?)",
            (setting,),
        )


if TYPE_CHECKING:

    def _implements_the_protocols(conn: sqlite3.Connection) -> tuple[Backend, AsyncBackend]:
        return SqliteBackend(conn), AsyncSqliteBackend(conn)
