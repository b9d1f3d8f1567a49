"""The lease operations on a SQLite connection: one statement of ``sql/sqlite/`` each."""

from __future__ import annotations

import dataclasses
import functools
import json
import sqlite3
import typing
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pylease import _operations
from pylease._backend import Backend
from pylease._backend_async import AsyncBackend
from pylease._operations import COUNT, FLAG, GRANT, READ, VALUE, Operation
from pylease._resources import data_dir
from pylease._rows import Json, Renewal
from pylease.errors import DatabaseUnavailable, FenceExhausted, InvalidArgument
from pylease.sqlite._connection import DEFAULT_BUSY_TIMEOUT
from pylease.sqlite._errors import _errors, _where
from pylease.sqlite._migrator import _SHARED_LOCK, _statements

#: The operations' names, each the file ``sql/sqlite/<name>.sql``.
OPERATIONS = tuple(op.name for op in _operations.OPERATIONS)
#: The files run beside them: a writer's waiting claims, with SQLite's queue of waiting
#: writers (contract 5.2), and a reader's release, after release.sql or
#: release_tenure.sql found no exclusive tenure of its holder.
COMPANIONS = ("claim_queued", "claim_queued_new", "release_shared")

#: The values of the history setting (the row 'history' of pylease_settings).
HISTORY_SETTINGS = ("rare", "all", "none")


@functools.cache
def _sql(operation: str) -> tuple[str, ...]:
    """The statements of ``sql/sqlite/<operation>.sql``, exactly as other languages run them:
    in order, in one transaction, with the same parameters; the last one answers."""
    script = (data_dir("sql", "sqlite") / f"{operation}.sql").read_text(encoding="utf-8")
    return tuple(_statements(script))


def _run(conn: sqlite3.Connection, operation: str, params: Mapping[str, Any]) -> list[Any]:
    *checks, answer = _sql(operation)
    for statement in checks:
        conn.execute(statement, params)
    return conn.execute(answer, params).fetchall()


# Backends --------------------------------------------------------------------


def _when(unix_seconds: float) -> datetime:
    return datetime.fromtimestamp(unix_seconds, UTC)


class SqliteBackend(Backend):
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
        self,
        operation: str,
        params: Mapping[str, Any],
        name: str | None,
        *,
        durable: bool = True,
        otherwise: tuple[str, Mapping[str, Any]] | None = None,
    ) -> list[Any]:
        """Run ``operation``'s file in one write transaction; when it answers no row and
        ``otherwise`` names another file (and its parameters), that one too, in the same."""

        def run(conn: sqlite3.Connection) -> list[Any]:
            rows = _run(conn, operation, params)
            if rows or otherwise is None:
                return rows
            return _run(conn, *otherwise)

        with self._session(name) as conn:
            if conn.in_transaction:
                return run(conn)
            restore: int | None = None
            if not durable:
                level = int(conn.execute("PRAGMA synchronous").fetchone()[0])
                if level > 1:
                    restore = level
                    conn.execute("PRAGMA synchronous = NORMAL")
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    rows = run(conn)
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
            return _run(conn, operation, params)

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

    def _call(self, op: Operation, params: tuple[Any, ...], name: str | None) -> Any:
        special = _SPECIAL.get(op.name)
        if special is not None:
            return special(self, op, params)
        return self._plain(op, params, name)

    def _plain(self, op: Operation, params: tuple[Any, ...], name: str | None) -> Any:
        named = _named(op, params)
        if op.kind is READ:
            rows = self._read(op.name, named, name)
        else:
            rows = self._write(op.name, named, name, durable=op.kind is GRANT)
        answer = op.answer
        if answer is VALUE:
            return rows[0][0] if rows else None
        if answer is FLAG:
            return bool(rows) and bool(rows[0][0])
        if answer is COUNT:
            return len(rows)
        if answer is tuple:
            return rows
        assert isinstance(answer, type)
        convert = _converters(answer)
        if not convert:
            return [answer(*row) for row in rows]
        result = []
        for row in rows:
            values = list(row)
            for i, f in convert:
                values[i] = f(values[i])
            result.append(answer(*values))
        return result


def _seconds(span: timedelta) -> float:
    return span.total_seconds()


def _unix(moment: datetime) -> float:
    return moment.timestamp()


def _jsonable(value: Any) -> Any:
    # Called by the JSON encoder only for what JSON lacks: a list's strings cost nothing.
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, datetime):
        return value.timestamp()
    raise TypeError(f"pylease: cannot pass {type(value).__name__} to SQLite")


def _json(values: Any) -> str:
    return json.dumps(values, default=_jsonable)


# How a parameter's value reaches the SQLite files: spans as seconds, times as unix
# seconds, lists as JSON arrays; every other value as it is.
_TO_SQLITE: dict[type[Any], Callable[[Any], Any]] = {
    timedelta: _seconds,
    datetime: _unix,
    list: _json,
    tuple: _json,
}


_PLAIN = frozenset((str, int, float, bytes, type(None)))


def _named(op: Operation, params: tuple[Any, ...]) -> dict[str, Any]:
    named = {}
    for key, value in zip(op.sqlite, params, strict=True):
        kind = type(value)
        convert = _TO_SQLITE.get(kind)
        if convert is not None:
            value = convert(value)
        elif kind not in _PLAIN:
            value = _subclass_value(value)
        named[key] = value
    return named


def _subclass_value(value: Any) -> Any:
    # A subclass of timedelta or datetime (pendulum's, say), or a list's.
    for base, convert in _TO_SQLITE.items():
        if isinstance(value, base):
            return convert(value)
    return value


def _span(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def _optional(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else convert(value)


# SQLite's numbers (and JSON text) as a row class's field types (its INTEGERs are ints
# already).
_BY_TYPE: dict[Any, Callable[[Any], Any]] = {
    datetime: _when,
    timedelta: _span,
    bool: bool,
    datetime | None: _optional(_when),
    timedelta | None: _optional(_span),
    Json: _optional(json.loads),
}


_CONVERTERS: dict[type[Any], tuple[tuple[int, Callable[[Any], Any]], ...]] = {}


def _converters(row: type[Any]) -> tuple[tuple[int, Callable[[Any], Any]], ...]:
    """The columns of a row class whose SQLite value needs converting to the field's type
    (times from unix seconds, spans from seconds, ...), each with its conversion."""
    convert = _CONVERTERS.get(row)
    if convert is None:
        hints = typing.get_type_hints(row)
        fields = dataclasses.fields(row)
        convert = tuple(
            (i, _BY_TYPE[hints[f.name]]) for i, f in enumerate(fields) if hints[f.name] in _BY_TYPE
        )
        _CONVERTERS[row] = convert
    return convert


def _renewals(
    backend: SqliteBackend, op: Operation, params: tuple[Any, ...]
) -> list[tuple[str, bool]] | list[Renewal]:
    """``renew_many``/``renew_each``: the files answer only for the leases renewed; the
    backends answer for each lease asked for, in order."""
    names, holders = params[0], params[1]
    if not names:
        return []
    named = _named(op, params)
    renewed = {(row[0], row[1]): row for row in backend._write(op.name, named, None)}
    if op.name == "renew_many":
        return [(n, (n, h) in renewed) for n, h in zip(names, holders, strict=True)]
    result = []
    for n, h in zip(names, holders, strict=True):
        row = renewed.get((n, h))
        if row is None:
            result.append(Renewal(n, False, None, None))
        else:
            result.append(Renewal(n, True, _when(row[2]), _when(row[3])))
    return result


def _released_all(
    backend: SqliteBackend, op: Operation, params: tuple[Any, ...]
) -> list[tuple[str, bool]]:
    """``release_all``: the file answers only for the leases given back; the backends
    answer for each name, in order."""
    names = params[0]
    freed = {row[0] for row in backend._write(op.name, _named(op, params), None, durable=False)}
    return [(n, n in freed) for n in names]


def _released_permits(backend: SqliteBackend, op: Operation, params: tuple[Any, ...]) -> bool:
    """``permit_release``: the file answers one row per slot freed, with the number of
    slots its holder was granted; the release was whole when each equals the count."""
    rows = backend._write(op.name, _named(op, params), params[0], durable=False)
    return bool(rows) and all(row[0] == len(rows) for row in rows)


def _released(backend: SqliteBackend, op: Operation, params: tuple[Any, ...]) -> bool:
    """``release``/``release_tenure``: a holder with no exclusive tenure to give back may
    be a reader, whose share release_shared.sql gives back in the same transaction."""
    named = _named(op, params)
    share = {"name": named["name"], "holder": named["holder"], "fence": named.get("fence")}
    rows = backend._write(
        op.name, named, params[0], durable=False, otherwise=("release_shared", share)
    )
    return bool(rows) and bool(rows[0][0])


def _renewed(backend: SqliteBackend, op: Operation, params: tuple[Any, ...]) -> bool:
    """``renew``: a row came back (its fence: a reader's epoch may be 0)."""
    return bool(backend._write(op.name, _named(op, params), params[0]))


# The trigger's message is a literal: the limits come from the call and the file.
_OTHER_LIMIT = "pylease: max_permits differs from the limit of this semaphore"


def _claimed_permits(backend: SqliteBackend, op: Operation, params: tuple[Any, ...]) -> Any:
    """``permit_claim``: a claim naming another limit is told both, as on PostgreSQL."""
    name, asked = params[0], params[1]
    try:
        return backend._plain(op, params, name)
    except InvalidArgument as exc:
        if str(exc) != _OTHER_LIMIT:
            raise
        with backend._session(name) as conn:
            row = conn.execute(
                "SELECT max_permits FROM pylease_names WHERE name = ?", (name,)
            ).fetchone()
        stored = "another" if row is None else row[0]
        raise InvalidArgument(
            f"pylease: max_permits {asked} differs from the limit {stored} of this semaphore",
            parameter="max_permits",
            name=name,
        ) from exc


def _claimed_all(backend: SqliteBackend, op: Operation, params: tuple[Any, ...]) -> Any:
    """``claim_all``: a name whose fences are exhausted is named, as on PostgreSQL."""
    try:
        return backend._plain(op, params, None)
    except FenceExhausted as exc:
        with backend._session(None) as conn:
            row = conn.execute(
                "SELECT min(name) FROM pylease_leases WHERE fence = 9223372036854775807"
                " AND name IN (SELECT value FROM json_each(?))",
                (_json(params[0]),),
            ).fetchone()
        if row is None or row[0] is None:
            raise
        raise FenceExhausted(
            f"pylease: lease {row[0]!r} has used every fence (2^63-1): it cannot be granted again",
            name=row[0],
        ) from exc.__cause__


# The operations whose SQLite file answers otherwise than the PostgreSQL function.
_SPECIAL: dict[str, Callable[[SqliteBackend, Operation, tuple[Any, ...]], Any]] = {
    "renew_many": _renewals,
    "renew_each": _renewals,
    "release_all": _released_all,
    "release_all_tenure": _released_all,
    "permit_release": _released_permits,
    "permit_release_tenure": _released_permits,
    "permit_claim": _claimed_permits,
    "permit_claim_new": _claimed_permits,
    "claim_all": _claimed_all,
    "claim_all_new": _claimed_all,
    "renew": _renewed,
    "release": _released,
    "release_tenure": _released,
}


class AsyncSqliteBackend(AsyncBackend):
    """The same operations, awaitable: each runs in a worker thread (``asyncio.to_thread``)."""

    def __init__(self, conn: sqlite3.Connection | SqliteBackend) -> None:
        self.sync = conn if isinstance(conn, SqliteBackend) else SqliteBackend(conn)
        self.conn = self.sync.conn

    async def _call(self, op: Operation, params: tuple[Any, ...], name: str | None) -> Any:
        import asyncio  # here: the sync backend's users never load it

        running = asyncio.ensure_future(asyncio.to_thread(self.sync._call, op, params, name))
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            # A cancelled caller may close the connection next, and closing a sqlite3
            # connection under a statement another thread runs crashes the interpreter:
            # the cancellation goes on only once the statement is done (a statement is
            # bounded by the busy timeout).
            await _finished(running)
            raise


async def _finished(running: Any) -> None:
    """Wait until ``running`` is done, through any further cancellation."""
    import asyncio

    while not running.done():
        try:
            await asyncio.shield(running)
        except asyncio.CancelledError:
            continue
        except Exception:  # the caller was cancelled: this is not its error to raise
            return
    if not running.cancelled():
        running.exception()  # retrieved, so that asyncio does not log it as lost


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
