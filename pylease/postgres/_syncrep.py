"""Commits a synchronous standby may not have: how pylease tells, and refuses to count them.

A commit whose wait for a synchronous standby is cancelled (``pg_cancel_backend``, a
driver's or a pooler's cancel) is not rolled back: PostgreSQL reports success with a
WARNING (01000, "canceling wait for synchronous replication due to user request").
The write is then on the primary alone and a failover may lose it, so a grant or a
renewal answered so must not count. See docs/high-availability.md.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from pylease.errors import DatabaseUnavailable


class _Warnings:
    """The WARNINGs a server sent while one statement ran (read in the handler: a
    notice's Diagnostic is freed once the handler returns)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, diag: pg_errors.Diagnostic) -> None:
        if diag.severity_nonlocalized == "WARNING":
            self.seen.append(diag.message_primary or "")


class confirmed:  # lower case: it reads as a function, ``with confirmed(conn, name):``
    """Raise DatabaseUnavailable after the block if the server answered it with a WARNING.

    Wrap each statement of a grant or renewal (claim, steal, renew*); the lease
    functions raise no WARNING of their own, so any WARNING there means the commit
    may not be on the standby. (A class: it wraps every grant on the hot path.)
    """

    __slots__ = ("conn", "name", "seen")

    def __init__(
        self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], name: str | None
    ) -> None:
        self.conn = conn
        self.name = name
        self.seen = _Warnings()

    def __enter__(self) -> None:
        self.conn.add_notice_handler(self.seen)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.conn.remove_notice_handler(self.seen)
        if exc is None and self.seen.seen:
            raise DatabaseUnavailable(
                f"pylease: the server committed with a WARNING ({self.seen.seen[0]}): a commit"
                " whose wait for a synchronous standby was cancelled may be lost in a"
                " failover, so it does not count",
                name=self.name,
            )
