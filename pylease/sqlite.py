"""The SQLite backend: the semantics of the SQL API on one host, in one file.

Each operation is the one statement of ``sql/sqlite/<operation>.sql``, run as it
stands with named parameters, so programs in other languages can run the same
files. Every time comes from SQLite's clock inside the statement (unix seconds,
millisecond resolution). A write runs alone in a ``BEGIN IMMEDIATE``
transaction: SQLite's write lock decides every race, and is held only for that
statement and its commit (a busy claim changes nothing, so its commit writes
nothing).

Durability, as on PostgreSQL: WAL with ``synchronous = FULL``, so a committed
claim, renewal or steal survives a power cut (a lost claim could hand its fence
out twice); a release commits with ``NORMAL`` (a lost release only keeps the
lease until its expiry). A crash never corrupts the file.

Limits: one host only. SQLite's locks are not trustworthy on network
filesystems; :func:`connect` refuses the ones it recognizes in ``/proc/mounts``
(NFS, SMB/CIFS, sshfs, 9p, ...), but cannot see through every remote mount.
There is no NOTIFY: waiters poll.
"""

from __future__ import annotations

import asyncio
import functools
import getpass
import json
import math
import os
import re
import socket
import sqlite3
import threading
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pylease import _arguments, _validate
from pylease._backend import AsyncBackend, Backend, CounterRow, LeaseEvent, LeaseRow, Renewal
from pylease._resources import data_dir
from pylease.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    FenceExhausted,
    InvalidArgument,
    PyleaseError,
    SchemaMissing,
)

__all__ = [
    "DEFAULT_BUSY_TIMEOUT",
    "NETWORK_FILESYSTEMS",
    "AsyncSqliteBackend",
    "SqliteBackend",
    "check_filesystem",
    "connect",
    "default_path",
    "filesystem_type",
    "migrate",
    "path_of",
    "set_history",
]

#: Seconds a statement waits for another connection's write lock before failing.
DEFAULT_BUSY_TIMEOUT = 5.0

#: Filesystem types (``/proc/mounts``) on which SQLite's file locks cannot be trusted.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb",
        "smb2",
        "smb3",
        "smbfs",
        "fuse.sshfs",
        "sshfs",
        "9p",
        "afs",
        "ncpfs",
        "coda",
        "ceph",
        "fuse.ceph",
        "glusterfs",
        "fuse.glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
        "vboxsf",
        "davfs",
        "fuse.davfs2",
        "fuse.s3fs",
        "fuse.rclone",
        "fuse.gcsfuse",
        "fuse.juicefs",
    }
)

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

_MIGRATION_TABLE = "_yoyo_migration"
# yoyo's own bookkeeping tables (its internal schema version 2), so that
# `yoyo apply sqlite:///...` and pylease agree on what is applied.
_YOYO_TABLES = (
    'CREATE TABLE IF NOT EXISTS "_yoyo_migration" ("migration_hash" VARCHAR(64), '
    '"migration_id" VARCHAR(255), "applied_at_utc" TIMESTAMP, PRIMARY KEY ("migration_hash"))',
    'CREATE TABLE IF NOT EXISTS "_yoyo_log" ("id" VARCHAR(36), "migration_hash" VARCHAR(64), '
    '"migration_id" VARCHAR(255), "operation" VARCHAR(10), "username" VARCHAR(255), '
    '"hostname" VARCHAR(255), "comment" VARCHAR(255), "created_at_utc" TIMESTAMP, '
    'PRIMARY KEY ("id"))',
    'CREATE TABLE IF NOT EXISTS "_yoyo_version" ("version" INT NOT NULL PRIMARY KEY, '
    '"installed_at_utc" TIMESTAMP)',
)
_SQL_UTC_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"

# SQLite's primary result codes that pylease tells apart.
_BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT = 5, 6, 8, 10, 11
_FULL, _CANTOPEN, _PROTOCOL, _NOTADB = 13, 14, 15, 26

# Serializes connections that connect() did not open (they carry no lock of their own).
_SHARED_LOCK = threading.RLock()


class _Connection(sqlite3.Connection):
    """A connection opened by :func:`connect`: it knows its path and serializes its threads."""

    pylease_path: str
    pylease_busy_timeout: float

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pylease_lock = threading.RLock()


@functools.cache
def _sql(operation: str) -> str:
    """The statement of ``sql/sqlite/<operation>.sql``, exactly as other languages run it."""
    return (data_dir("sql", "sqlite") / f"{operation}.sql").read_text(encoding="utf-8")


# Locations -------------------------------------------------------------------


def default_path() -> Path:
    """The embedded default database: ``$XDG_STATE_HOME/pylease/leases.sqlite3``.

    ``~/.local/state/pylease/leases.sqlite3`` when ``XDG_STATE_HOME`` is unset
    (or not absolute, as the XDG spec asks). Read from the environment at each
    call; creates nothing: :func:`connect` creates the directory, user-only.
    """
    state = os.environ.get("XDG_STATE_HOME", "")
    base = Path(state) if os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "pylease" / "leases.sqlite3"


def path_of(location: str | os.PathLike[str]) -> Path:
    """The file a location names: a ``sqlite:///relative`` or ``sqlite:////absolute``
    URL (percent-decoded), or a plain path (``~`` expanded).

    :raises ConfigurationError: another URL scheme, a host, a query, or no path.
    """
    text = os.fspath(location)
    if not isinstance(text, str) or not text:
        raise ConfigurationError("pylease: a SQLite location must be a non-empty path or URL")
    if text.startswith("sqlite:") or "://" in text:
        parts = urllib.parse.urlsplit(text)
        hint = "use sqlite:///relative/path or sqlite:////absolute/path"
        if parts.scheme != "sqlite":
            raise ConfigurationError(f"pylease: not a SQLite URL: {parts.scheme}://...; {hint}")
        if parts.netloc or not parts.path.startswith("/") or parts.path == "/":
            raise ConfigurationError(f"pylease: malformed SQLite URL {text!r}: {hint}")
        if parts.query or parts.fragment:
            raise ConfigurationError(
                f"pylease: SQLite URLs take no options ({text!r}); pass busy_timeout to connect()"
            )
        return Path(urllib.parse.unquote(parts.path[1:]))
    return Path(text).expanduser()


def _unescape_mount(field: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def filesystem_type(path: str | os.PathLike[str], mounts: str | None = None) -> str | None:
    """The type of the filesystem holding ``path``, from ``/proc/mounts`` (or ``mounts``).

    None when it cannot be told (no ``/proc``, as on macOS).
    """
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    target = os.path.realpath(path)
    best: tuple[str, str] | None = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape_mount(fields[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        # The longest mount point wins; of equal ones the last, which shadows the others.
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fields[2])
    return best[1] if best else None


def check_filesystem(path: str | os.PathLike[str], mounts: str | None = None) -> None:
    """Refuse a filesystem where SQLite's locks cannot be trusted (network filesystems).

    :raises ConfigurationError: ``path`` is on NFS, SMB/CIFS, sshfs, 9p, or another
        type of :data:`NETWORK_FILESYSTEMS`.
    """
    fstype = filesystem_type(path, mounts)
    if fstype is None:
        return
    if fstype in NETWORK_FILESYSTEMS or fstype.startswith(("nfs", "smb", "cifs")):
        raise ConfigurationError(
            f"pylease: {os.fspath(path)} is on a {fstype} filesystem, where SQLite's file "
            "locks cannot be trusted (two hosts could hold one lease): put the SQLite file "
            "on a local disk, or use PostgreSQL"
        )


def _make_private_dirs(directory: Path) -> None:
    missing: list[Path] = []
    current = directory
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for part in reversed(missing):
        try:
            part.mkdir(mode=0o700)
        except FileExistsError:
            continue
        except OSError as exc:
            raise ConfigurationError(
                f"pylease: cannot create the state directory {part}: {exc.strerror}"
            ) from exc
        os.chmod(part, 0o700)


def _prepare(path: Path) -> None:
    """Loud checks before SQLite gets to create or open anything."""
    path = path.absolute()
    directory = path.parent
    if path == default_path().absolute():
        _make_private_dirs(directory)
    if not directory.is_dir():
        raise ConfigurationError(
            f"pylease: the directory {directory} does not exist: create it first "
            "(pylease creates only the directory of its default database)"
        )
    check_filesystem(path)  # the file's own target too, when it is a symlink
    if path.is_dir():
        raise ConfigurationError(f"pylease: {path} is a directory, not a SQLite file")
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        raise ConfigurationError(
            f"pylease: the SQLite file {path} is read-only for this user: "
            "claiming a lease writes to it"
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigurationError(
            f"pylease: the directory {directory} is not writable: SQLite keeps "
            f"{path.name}-wal and {path.name}-shm beside the database"
        )


# Errors ----------------------------------------------------------------------


def _translate(exc: sqlite3.Error, name: str | None, where: str) -> PyleaseError:
    message = " ".join(str(exc).split())
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if isinstance(exc, sqlite3.IntegrityError) and message.startswith("pylease: fences exhausted"):
        # The trigger's message is a literal: the name comes from the call.
        return FenceExhausted(
            f"pylease: lease {name!r} has used every fence (2^63-1): it cannot be granted again",
            name=name,
        )
    if isinstance(exc, sqlite3.IntegrityError) and message.startswith("pylease: "):
        parameter = message.removeprefix("pylease: ").split(" ", 1)[0]
        return InvalidArgument(message, parameter=parameter, name=name)
    if "no such table: pylease_leases" in message:
        return SchemaMissing(
            f"pylease: the pylease schema is not installed in {where}: open it with "
            "pylease.sqlite.connect(), or call pylease.sqlite.migrate(conn)",
            name=name,
        )
    if primary in (_BUSY, _LOCKED):
        return DatabaseUnavailable(
            f"pylease: the SQLite database {where} stayed locked by another writer "
            f"for longer than the busy timeout ({message})",
            name=name,
        )
    if primary == _READONLY:
        return ConfigurationError(
            f"pylease: the SQLite database {where} is read-only ({message})", name=name
        )
    if primary in (_CORRUPT, _NOTADB):
        return DatabaseUnavailable(
            f"pylease: {where} is not a SQLite database, or it is corrupt ({message}); "
            "move it aside: pylease creates a new one",
            name=name,
        )
    if primary in (_IOERR, _FULL, _CANTOPEN, _PROTOCOL):
        return DatabaseUnavailable(
            f"pylease: cannot use the SQLite database {where} ({message})", name=name
        )
    if isinstance(exc, sqlite3.ProgrammingError) and "thread" in message:
        return ConfigurationError(
            "pylease: this sqlite3 connection was opened with check_same_thread=True, but "
            "pylease uses it from other threads (heartbeat, asyncio): open it with "
            "pylease.sqlite.connect(), or with check_same_thread=False",
            name=name,
        )
    if isinstance(exc, sqlite3.ProgrammingError) and "closed" in message:
        return DatabaseUnavailable(f"pylease: the SQLite connection is closed ({message})")
    return PyleaseError(f"pylease: {type(exc).__name__}: {message}", name=name)


@contextmanager
def _errors(name: str | None, where: str) -> Iterator[None]:
    """Map sqlite3 errors to pylease errors, keeping the driver error as ``__cause__``."""
    try:
        yield
    except sqlite3.Error as exc:
        raise _translate(exc, name, where) from exc


def _where(conn: sqlite3.Connection) -> str:
    known: str | None = getattr(conn, "pylease_path", None)
    if known is not None:
        return known
    try:
        for _seq, schema, file in conn.execute("PRAGMA database_list").fetchall():
            if schema == "main":
                return str(file) or ":memory:"
    except sqlite3.Error:
        pass
    return "(this connection's database)"


# Migrations ------------------------------------------------------------------


def _statements(script: str) -> list[str]:
    """Split a SQL script into statements (triggers included), dropping bare comments."""
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    rest = "\n".join(
        line for line in buffer.splitlines() if line.strip() and not line.strip().startswith("--")
    )
    if rest:
        raise ConfigurationError(f"pylease: an incomplete SQL statement ends a migration: {rest}")
    return statements


@functools.cache
def _migrations() -> tuple[tuple[str, tuple[str, ...]], ...]:
    folder = data_dir("migrations", "sqlite")
    files = sorted(p for p in folder.glob("*.sql") if not p.name.endswith(".rollback.sql"))
    return tuple(
        (p.name.removesuffix(".sql"), tuple(_statements(p.read_text(encoding="utf-8"))))
        for p in files
    )


def _applied(conn: sqlite3.Connection) -> set[str]:
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (_MIGRATION_TABLE,)
    ).fetchone()
    if exists is None:
        return set()
    return {row[0] for row in conn.execute(f'SELECT migration_id FROM "{_MIGRATION_TABLE}"')}


def _who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def migrate(conn: sqlite3.Connection) -> list[str]:
    """Apply every pending migration of ``migrations/sqlite/``; returns the ids applied.

    All of them in one ``BEGIN IMMEDIATE`` transaction, so that processes opening a
    new file at once serialize on SQLite's write lock and a migrator killed halfway
    leaves nothing behind. They are recorded in yoyo's own tables (yoyo's lock
    table, which a killed process would leave behind, is not needed), so
    ``yoyo apply``/``yoyo rollback`` with a ``sqlite:///`` URL agree with pylease.
    A database whose migrations are all applied costs one read.

    :raises DatabaseUnavailable: another writer held the file for longer than the
        busy timeout, or the file is not a SQLite database.
    """
    from yoyo.migrations import get_migration_hash

    migrations = _migrations()
    wanted = {migration_id for migration_id, _ in migrations}
    where = _where(conn)
    lock = getattr(conn, "pylease_lock", _SHARED_LOCK)
    with lock, _errors(None, where):
        if wanted <= _applied(conn):
            return []
        conn.execute("BEGIN IMMEDIATE")
        try:
            for ddl in _YOYO_TABLES:
                conn.execute(ddl)
            conn.execute(f"INSERT OR IGNORE INTO _yoyo_version VALUES (2, {_SQL_UTC_NOW})")
            done = _applied(conn)
            applied: list[str] = []
            for migration_id, statements in migrations:
                if migration_id in done:
                    continue
                for statement in statements:
                    conn.execute(statement)
                migration_hash = get_migration_hash(migration_id)
                conn.execute(
                    f"INSERT INTO _yoyo_migration VALUES (?, ?, {_SQL_UTC_NOW})",
                    (migration_hash, migration_id),
                )
                conn.execute(
                    "INSERT INTO _yoyo_log (id, migration_hash, migration_id, operation, "
                    "username, hostname, comment, created_at_utc) "
                    f"VALUES (?, ?, ?, 'apply', ?, ?, 'pylease.sqlite.migrate', {_SQL_UTC_NOW})",
                    (str(uuid.uuid4()), migration_hash, migration_id, _who(), socket.gethostname()),
                )
                applied.append(migration_id)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return applied


# Connections -----------------------------------------------------------------


def connect(
    location: str | os.PathLike[str] | None = None,
    *,
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
) -> sqlite3.Connection:
    """Open (creating and migrating on first use) a SQLite lease database.

    :param location: a ``sqlite:///relative/path`` or ``sqlite:////absolute/path``
        URL, a plain path, or None for :func:`default_path` (whose directory is
        created, user-only). Other directories must exist: pylease creates none.
    :param busy_timeout: seconds a statement waits for another process's write
        lock before raising :class:`DatabaseUnavailable`; every wait is bounded.
    :returns: a connection in autocommit mode (``isolation_level=None``), WAL,
        usable from any thread (pylease serializes its own use of it).
    :raises ConfigurationError: a missing directory, a read-only file or directory,
        a network filesystem, a malformed URL.
    :raises DatabaseUnavailable: a corrupt file, or one locked by a long writer.
    """
    if (
        isinstance(busy_timeout, bool)
        or not isinstance(busy_timeout, int | float)
        or not math.isfinite(busy_timeout)
        or busy_timeout <= 0
    ):
        raise InvalidArgument(
            "pylease: busy_timeout must be a positive number of seconds", parameter="busy_timeout"
        )
    path = default_path() if location is None else path_of(location)
    memory = str(path) == ":memory:"
    if not memory:
        # Absolute, so that a second connection to the same file (the heartbeat's)
        # opens the same file whatever the working directory is by then.
        path = path.absolute()
        _prepare(path)
    where = str(path)
    with _errors(None, where):
        conn = sqlite3.connect(
            where,
            timeout=busy_timeout,
            isolation_level=None,
            check_same_thread=False,
            factory=_Connection,
        )
    assert isinstance(conn, _Connection)
    conn.pylease_path = where
    conn.pylease_busy_timeout = float(busy_timeout)
    try:
        with _errors(None, where):
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if not memory and str(mode).lower() != "wal":
                raise ConfigurationError(
                    f"pylease: SQLite refused WAL mode for {where} (journal_mode is {mode})"
                )
            conn.execute("PRAGMA synchronous = FULL")
        migrate(conn)
    except BaseException:
        conn.close()
        raise
    return conn


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
