"""Commits a synchronous standby may not have: how pylease tells, and refuses to count them.

A commit whose wait for a synchronous standby is cancelled (``pg_cancel_backend``, a
driver's or a pooler's cancel) is not rolled back: PostgreSQL reports success with a
WARNING (01000, "canceling wait for synchronous replication due to user request").
The write is then on the primary alone and a failover may lose it, so a grant or a
renewal answered so must not count. See docs/high-availability.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def confirmed(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], name: str | None
) -> Iterator[None]:
    """Raise DatabaseUnavailable after the block if the server answered it with a WARNING.

    Wrap each statement of a grant or renewal (claim, steal, renew*); the lease
    functions raise no WARNING of their own, so any WARNING there means the commit
    may not be on the standby.
    """
    seen = _Warnings()
    conn.add_notice_handler(seen)
    try:
        yield
    finally:
        conn.remove_notice_handler(seen)
    if seen.seen:
        raise DatabaseUnavailable(
            f"pylease: the server committed with a WARNING ({seen.seen[0]}): a commit whose "
            "wait for a synchronous standby was cancelled may be lost in a failover, so it "
            "does not count",
            name=name,
        )
