"""The caller's transaction: is one open where a lease block ends, and when has it ended.

A block's protected writes may still be uncommitted when the block ends: a Django
``transaction.atomic()`` (or ``ATOMIC_REQUESTS``) around it, a SQLAlchemy session or
connection in a transaction, a psycopg connection with a transaction open, a
``sqlite3.Connection`` inside one. Released then, on pylease's own connection, the lease
could be granted to the next holder before those writes commit, and it would read the
old state. So the lease is kept (renewed by the keeper) until that transaction ends, by
commit or rollback, and only then released; pylease never joins it.

:func:`watch` is asked at the block's end, on the block's own thread, with the target
the user passed (before :func:`pylease._orm.adapt`). It answers None when no transaction
of the caller is open there, else a :data:`Watch`: a function without I/O that the
keeper polls, from its own thread or task, which answers

- None while the transaction is open;
- True once it has ended (committed or rolled back): release now;
- False when it ended in a way nobody can know (the connection broke, perhaps while its
  COMMIT was on the way): the lease is not released but left to expire.

Each target is watched through what tells its transaction apart from the next one, so
that a transaction that ends and another that begins between two polls still counts as
ended: a SQLAlchemy transaction object, a Django ``on_commit`` entry (dropped by Django on
a rollback, run on a commit); a bare psycopg or sqlite3 connection has no such thing and
is watched until it is idle again. A SQLAlchemy ``Engine`` or a URL shows no transaction
of the caller: pass the ``Connection`` or ``Session`` whose transaction holds the writes.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pylease._targets import in_event_loop, is_psycopg

if TYPE_CHECKING:
    import psycopg

logger = logging.getLogger("pylease")

# How often a deferred lease's watch is asked whether the caller's transaction ended:
# the delay between its commit and the release.
TX_POLL = 0.02
# How long a finalizer on a thread of the caller's waits for the keeper to release a
# collected lease (so the name is free when the collection returns); never on a
# thread of pylease's own, never past a release that cannot reach the database.
GIVE_BACK_WAIT = 2.0
# How long a finalizer waits for the keeper's lock to wake it (it may run anywhere).
WAKE_WAIT = 0.5

# None: still open; True: ended, release; False: ended unknowably, let the lease expire.
Watch = Callable[[], bool | None]


def watch(target: object) -> Watch | None:
    """How to tell that the caller's transaction open now has ended; None if none is open."""
    if is_psycopg(target):
        return _psycopg(target)
    if isinstance(target, sqlite3.Connection):
        return _sqlite(target)
    for cls in type(target).__mro__:
        if cls.__module__.startswith("sqlalchemy."):
            return _sqlalchemy(target)
        if cls.__module__.startswith("django."):
            return _django(target)
    return None


def owner(target: object) -> object:
    """The object whose transactions :func:`watch` watches for ``target``: a later block
    of the same name on it, in this thread, takes a deferred lease back."""
    for cls in type(target).__mro__:
        if cls.__module__.startswith("sqlalchemy."):
            return getattr(target, "sync_session", None) or getattr(
                target, "sync_connection", target
            )
        if cls.__module__.startswith("django."):
            if in_event_loop():
                return None
            from django.db import connections

            # django.db.connection is one proxy for every thread: its thread's wrapper.
            return connections[getattr(target, "alias", "default")]
    return target


def _psycopg(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> Watch | None:
    # libpq's PQTRANS_IDLE, asked first: every block's exit on a connection asks.
    if conn.closed or conn.pgconn.transaction_status == 0:
        return None  # no transaction of the caller's is open (nor a statement running)
    from psycopg.pq import ConnStatus, TransactionStatus  # loaded: conn is psycopg's

    idle, unknown = int(TransactionStatus.IDLE), int(TransactionStatus.UNKNOWN)
    ok = int(ConnStatus.OK)
    pgconn = conn.pgconn

    def ended() -> bool | None:
        # Read on the keeper's thread: libpq's status fields, no I/O, no lock.
        status = int(pgconn.transaction_status)
        if pgconn.status != ok or status == unknown:
            # Closed by its owner: the server rolled back. Broken: perhaps with its
            # COMMIT on the way, and nobody can know whether that landed.
            return not conn.broken
        return True if status == idle else None

    return ended


def _sqlite(conn: sqlite3.Connection) -> Watch | None:
    try:
        if not conn.in_transaction:
            return None
    except sqlite3.ProgrammingError:  # closed
        return None

    def ended() -> bool | None:
        try:
            return None if conn.in_transaction else True
        except sqlite3.ProgrammingError:
            return True  # closed: SQLite rolled its transaction back

    return ended


def _sqlalchemy(target: Any) -> Watch | None:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

    if isinstance(target, AsyncSession):
        target = target.sync_session
    if isinstance(target, AsyncConnection):
        target = target.sync_connection
    if isinstance(target, (Session, Connection)):
        # The transaction object itself: once inactive it stays so, whatever the
        # session or connection begins next.
        tx = target.get_transaction()
        if tx is not None and tx.is_active:
            return lambda: None if tx.is_active else True
    if isinstance(target, Connection) and not target.closed:
        driver = target.connection.driver_connection
        if is_psycopg(driver):
            return _psycopg(driver)
    return None


def _django(target: Any) -> Watch | None:
    if getattr(target, "vendor", None) is None or in_event_loop():
        # In an event loop no transaction of Django's can be open on this thread, and
        # pylease reached the database by its settings (pylease._orm).
        return None
    from django.db import connections

    # django.db.connection is a proxy to the calling thread's wrapper: the wrapper
    # itself, so the keeper reads this thread's state.
    wrapper = connections[target.alias]
    if wrapper.in_atomic_block:
        return _on_commit(wrapper)
    conn = wrapper.connection
    if is_psycopg(conn):
        return _psycopg(conn)  # manual transaction management (autocommit off)
    return None


def _on_commit(wrapper: Any) -> Watch:
    """Django runs an ``on_commit`` entry after the commit and drops it on a rollback
    (of the transaction, or of a savepoint the entry was registered in, whose writes
    are gone with it): either way, once it has left the list the transaction ended."""
    ran: list[bool] = []

    def committed() -> None:
        ran.append(True)

    try:
        wrapper.on_commit(committed, robust=True)
    except TypeError:  # pragma: no cover - Django before 4.2 has no robust
        wrapper.on_commit(committed)

    def ended() -> bool | None:
        if ran:
            return True
        pending = wrapper.run_on_commit
        if any(entry[1] is committed for entry in list(pending)):
            return None
        return True

    return ended


class Deferred:
    """A lease the keeper releases later: once ``watch`` says the caller's transaction
    has ended, or at once (``watch`` None: its Held was collected)."""

    def __init__(
        self,
        ticket: Any,
        source: Any,
        watch: Watch | None,
        min_hold: Any,
        link: Any,
        *,
        owner: object = None,
        renew: Any = None,
    ) -> None:
        self.owner = owner
        self.ticket = ticket
        self.source = source
        self.renew = renew
        self.watch = watch
        self.min_hold = min_hold
        self.link = link

    def matches(self, name: str, holder: str | None, owner: object) -> bool:
        """Whether a new block of ``name`` on ``owner`` may take this lease back."""
        ticket = self.ticket
        return (
            owner is not None
            and self.owner is owner
            and ticket.name == name
            and holder in (None, ticket.holder)
            and not ticket.abandoned
            and ticket.error() is None
        )

    def ended(self) -> bool | None:
        """The watch's answer: None while open; True release; False let it expire."""
        if self.watch is None:
            return True
        try:
            return self.watch()
        except Exception:
            # What cannot be known is never taken for an end: the expiry frees it.
            name = self.ticket.name
            logger.exception("watching the caller's transaction of lease %r failed", name)
            return False

    def before_release(self, verdict: bool) -> bool:
        """Log why it is given back; False when it must not be (left to expire)."""
        name = self.ticket.name
        if self.ticket.abandoned and self.ticket.kind == "member":
            logger.warning(
                "member %r of group %r was abandoned (its group block collected before it"
                " was left): leaving",
                self.ticket.holder,
                name,
            )
        elif self.ticket.abandoned:
            logger.warning(
                "lease %r was abandoned (its Held collected inside its block): releasing it",
                name,
            )
        elif not verdict:
            logger.warning(
                "lease %r: the connection of the transaction it was kept for broke, so"
                " whether that transaction committed is unknown: it is left to expire",
                name,
            )
        return verdict

    def after_release(self, ours: bool) -> None:
        if not ours and not self.ticket.abandoned:
            # Its block had ended well: the writes it protected may have committed after
            # another holder was granted the lease. Loud, since nothing else can say it.
            logger.error(
                "lease %r was lost before the transaction its block ended in had ended: the"
                " writes of that transaction may have committed while another holder had"
                " the lease (its ttl was too short for the transaction, or it was stolen)",
                self.ticket.name,
            )


def take_ended(deferred: list[Deferred]) -> list[tuple[Deferred, bool]]:
    """Take the leases whose wait is over out of ``deferred``, with the watch's verdict."""
    ended = []
    for entry in list(deferred):
        verdict = entry.ended()
        if verdict is not None:
            deferred.remove(entry)
            ended.append((entry, verdict))
    return ended
