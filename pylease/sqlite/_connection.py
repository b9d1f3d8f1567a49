"""Opening a SQLite lease file: WAL, FULL sync, bounded waits, migrated on first use."""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
from typing import Any

from pylease.errors import ConfigurationError, InvalidArgument
from pylease.sqlite._errors import _errors
from pylease.sqlite._locations import _prepare, default_path, path_of
from pylease.sqlite._migrator import migrate

#: Seconds a statement waits for another connection's write lock before failing.
DEFAULT_BUSY_TIMEOUT = 5.0


class _Connection(sqlite3.Connection):
    """A connection opened by :func:`connect`: it knows its path and serializes its threads."""

    pylease_path: str
    pylease_busy_timeout: float

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pylease_lock = threading.RLock()


# Connections -----------------------------------------------------------------


def _journal_mode_wal(conn: sqlite3.Connection, busy_timeout: float) -> str:
    """``PRAGMA journal_mode = WAL``, retried for up to ``busy_timeout`` seconds.

    While another connection holds the write lock of a file not yet in WAL mode (two
    processes opening a new file at once: one is migrating it), SQLite answers the
    change with SQLITE_BUSY at once, without its busy handler.
    """
    deadline = time.monotonic() + busy_timeout
    pause = 0.005
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            code = getattr(exc, "sqlite_errorcode", None)
            busy = isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_BUSY
            if not busy or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


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
            mode = _journal_mode_wal(conn, busy_timeout)
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
