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

from pylease.sqlite._backend import (
    COMPANIONS,
    HISTORY_SETTINGS,
    OPERATIONS,
    AsyncSqliteBackend,
    SqliteBackend,
    set_history,
)
from pylease.sqlite._backend import _sql as _sql  # the statements, as tests read them
from pylease.sqlite._connection import DEFAULT_BUSY_TIMEOUT, connect
from pylease.sqlite._locations import (
    NETWORK_FILESYSTEMS,
    check_filesystem,
    default_path,
    filesystem_type,
    path_of,
)
from pylease.sqlite._migrator import migrate

__all__ = [
    "COMPANIONS",
    "DEFAULT_BUSY_TIMEOUT",
    "HISTORY_SETTINGS",
    "NETWORK_FILESYSTEMS",
    "OPERATIONS",
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
