# The source of pylease/_waiting.py: tools/async_to_sync.py writes it from this file.
"""Waiting for released leases: one LISTEN connection per database, shared by every waiter.

A release sends ``NOTIFY pylease, '<name>'``. Rather than a LISTEN connection per
waiting lease (30 waiting threads held 30 connections, and every release woke them
all into a claim), the waiters of a process (on an event loop: of that loop) share
one :class:`AsyncHub` per database: a connection LISTENing on ``pylease`` and a
reader that hands each notification to the waiters of that name only.

Within a process the waiters of one name queue in arrival order and only the
first of them (the *head*) claims again on a notification; the next one takes
its place when it leaves, with the lease (it waits for the next notification) or
without it (it claims at once). So a release costs one claim per waiting process,
not one per waiting thread.

Across processes, a release still wakes one claim per waiting process unless the
schema has the queue of waiting processes (migration 0005): then the head of each
process queues its process in ``pylease_waiters`` (:func:`join_queue`), and only the
process at the head of that queue claims on a release; leaving it wakes the next
process with ``NOTIFY pylease_waiters``. The others claim only on their poll
interval, the safety net for a queued process that vanished (its row expires,
since it is refreshed only while its process waits).

A waiter's claims after its first are one statement each (:func:`claim`): granted,
the process leaves the queue of waiting processes in the claim's own transaction
(a round trip less between the release and the block); busy, the same statement
reads the status row that stood in the way (the holder's expiry, which paces the
waiter). A busy claim still writes nothing: ``lease_unwait`` and ``lease_status``
run only on their side of the answer, and a busy claim's commit never waits for a
WAL flush (one that met the winner's claim on the row holds a row lock until it
commits, and the winner's fenced writes wait for that). A head that claimed in
vain less than STATUS_FRESH ago leaves the status out (lease_status, an SQL
function planned at every call, costs several busy claims of server time, and a
busy name's head claims again at every release); it reads it again once that is
over, or once the expiry it knows is past.

When the listener's connection is lost, every head is woken to claim once and
polls until the reader has LISTENed again (with backoff); a release missed
meanwhile is found by that claim. Behind a pooler in transaction mode, where
LISTEN succeeds but nothing is ever delivered, the heads' expiry-aware polling
is what finds a free lease, as it always was.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import weakref
from collections import deque
from datetime import UTC, datetime, timedelta
from typing import Any, LiteralString

import psycopg
from psycopg.rows import tuple_row

from pylease._acompat import AEvent, ALock, AMutex, AWorker, asleep, aspawn, monotonic
from pylease._backend_async import AsyncBackend
from pylease._held import default_holder
from pylease._links_async import AsyncLink
from pylease._operations import GRANT, LeaseRow, Operation
from pylease.errors import PyleaseError, SchemaMissing
from pylease.postgres._backend_async import AsyncPostgresBackend, wrap_errors
from pylease.postgres._conninfo import CHANNEL, LISTEN_APP, own_conninfo

logger = logging.getLogger("pylease")

# An idle listener stays open this long for the next wait: a worker that cycles
# through a busy lease would otherwise connect once per wait.
LINGER = 2.0
# How often the reader, between notifications, looks whether it is still needed.
TICK = 0.25
# Backoff between attempts to LISTEN again after the connection was lost.
FIRST_RELISTEN = 0.05
MAX_RELISTEN = 5.0
# A waiter that meets an unreachable or read-only server (a failover) tries again
# after this pause (jittered), doubling up to MAX_OUTAGE, until its wait's deadline.
FIRST_OUTAGE = 0.05
MAX_OUTAGE = 1.0
# The longest sleep of a waiter that is not first in line of its process.
NAP = 60.0
# A head's busy claim reads the status with it at most this often (see the docstring).
STATUS_FRESH = 1.0
# A process's row in the queue of waiting processes expires this long after it was
# last refreshed; it is refreshed every third of that while the process waits.
WAITER_TTL = 30.0
QUEUE_CHANNEL = "pylease_waiters"
WAIT: LiteralString = "SELECT lease_wait(%s, %s, %s)"
UNWAIT: LiteralString = "SELECT lease_unwait(%s, %s, %s)"
# A waiter's claim (see the module's docstring). OFFSET 0 keeps each subquery whole:
# lease_claim runs once, and lease_status behind a one-time filter, only when busy.
_STATUS_COLUMNS: LiteralString = (
    "s.name, s.holder, s.fence, s.acquired_at, s.renewed_at, s.expires_at, s.held, s.state, s.ttl"
)
_CLAIMED: LiteralString = " FROM (SELECT lease_claim(%s, %s, %s) AS fence OFFSET 0) AS c"
# A busy claim that met the winner's claim on the lease's row waited for it, then
# locked the row's new version to recheck it: its transaction has an xid, and its
# commit would wait for a WAL flush while the winner's fenced writes (lease_holds)
# wait for its lock. Busy, it granted nothing: its commit need not be durable.
_BUSY_NO_FLUSH: LiteralString = (
    "CASE WHEN c.fence IS NULL THEN set_config('synchronous_commit', 'off', true) END, "
)
_STATUS: LiteralString = (
    " LEFT JOIN LATERAL (SELECT * FROM lease_status(%s) WHERE c.fence IS NULL AND %s OFFSET 0)"
    " AS s ON true"
)
# Grants: run as every claim is (a grant counts only once durable, see _postgres_async).
CLAIM = Operation(
    "claim_waiting",
    GRANT,
    "SELECT c.fence, NULL, " + _BUSY_NO_FLUSH + _STATUS_COLUMNS + _CLAIMED + _STATUS,
    (),
    tuple,
)
# The same for a process queued in pylease_waiters (the function exists): on a
# grant it leaves the queue there and then, waking the next process.
CLAIM_QUEUED = Operation(
    "claim_queued",
    GRANT,
    "SELECT c.fence, CASE WHEN c.fence IS NOT NULL THEN lease_unwait(%s, %s, true) END, "
    + _BUSY_NO_FLUSH
    + _STATUS_COLUMNS
    + _CLAIMED
    + _STATUS,
    (),
    tuple,
)

# Guards every hub's queues and state: changed without awaiting in between.
_mutex = AMutex()

# What a waiter saw before its first claim: (hub, its listen epoch, notifications heard).
Mark = tuple[object, int, int]


class AsyncWaiter:
    """One waiting lease's place in the queue of its name."""

    def __init__(self, hub: AsyncHub, name: str) -> None:
        self.hub = hub
        self.name = name
        self._event = AEvent()
        # Set with the event when the waiter should claim (a release, a lost
        # listener), left unset when it only became the head.
        self._retry = False
        # For the head: its process's place in the queue of waiting processes. None:
        # not queued there; False: queued behind another process; True: first.
        self.db_head: bool | None = None
        self.refresh_at = 0.0
        # True once a granted claim took the process out of that queue (see claim()).
        self.left = False

    @property
    def head(self) -> bool:
        """True while this waiter is the first of its name in this process."""
        with _mutex:
            queue = self.hub.queues.get(self.name)
            return queue is not None and queue[0] is self

    @property
    def listening(self) -> bool:
        """True while the shared listener is LISTENing."""
        return self.hub.conn is not None

    @property
    def join_due(self) -> bool:
        """True when the head should queue its process, or refresh its row."""
        return self.hub.db_queue and (self.db_head is None or monotonic() >= self.refresh_at)

    @property
    def behind(self) -> bool:
        """True while another process is ahead of this one in the queue of waiting
        processes, and the listener would tell when that changes."""
        return self.db_head is False and self.hub.conn is not None

    def wake(self, retry: bool) -> None:
        """Called with the mutex held."""
        self._retry = self._retry or retry
        self._event.set()

    async def sleep(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; True when the waiter should claim again."""
        woken = await _wait(self._event, timeout)
        with _mutex:
            self._event.clear()
            retry, self._retry = self._retry, False
        return retry or not woken


class AsyncHub:
    """The LISTEN connection to one database and the waiters it wakes, by name."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.queues: dict[str, deque[AsyncWaiter]] = {}
        self.conn: psycopg.AsyncConnection[Any] | None = None
        # Bumped at every LISTEN, and at every notification heard: a waiter compares
        # them with what it saw before its first claim.
        self.epoch = 0
        self.heard = 0
        self.closing = False
        self.worker: AWorker | None = None
        self.idle_since = monotonic()
        self._open_lock = ALock()
        # This process in the queue of waiting processes; False once the schema is
        # found to lack it (before migration 0005).
        self.token = default_holder()
        self.db_queue = True

    async def start(self) -> None:
        """LISTEN now (once), so that no release after this call goes unheard."""
        async with self._open_lock:
            if self.worker is not None:
                return
            try:
                conn = await self._open()
            except psycopg.Error as exc:
                logger.info("pylease: cannot LISTEN, waiters poll until it works: %s", exc)
            else:
                # The waiters queued meanwhile claim after this (see enter()).
                self._listening(conn, wake=False)
            self.worker = aspawn(self._run, name="pylease-listen")

    async def _open(self) -> psycopg.AsyncConnection[Any]:
        conn = await psycopg.AsyncConnection.connect(
            own_conninfo(self.conninfo, LISTEN_APP), autocommit=True, prepare_threshold=None
        )
        try:
            await conn.execute("LISTEN " + CHANNEL)
            await conn.execute("LISTEN " + QUEUE_CHANNEL)
        except BaseException:
            await conn.close()
            raise
        return conn

    def _listening(self, conn: psycopg.AsyncConnection[Any], *, wake: bool = True) -> None:
        with _mutex:
            self.conn = conn
            self.epoch += 1
            if wake:
                # A release may have gone unheard while nobody listened.
                self._wake_heads()

    def _wake_heads(self) -> None:
        """Called with the mutex held."""
        for queue in self.queues.values():
            queue[0].wake(retry=True)

    def _dispatch(self, channel: str, payload: str) -> None:
        with _mutex:
            self.heard += 1
            if channel == QUEUE_CHANNEL:
                # {"name": ..., "waiter": ..., "claim": ...}: the process now first
                # in line, and whether to claim at once (the one before left without
                # the lease) or on the next release (it left with it; notifications
                # come in commit order, so that release's comes after this one).
                try:
                    turn = json.loads(payload)
                    name, waiter, claim = str(turn["name"]), turn["waiter"], bool(turn["claim"])
                except (ValueError, KeyError, TypeError):
                    return
                queue = self.queues.get(name)
                if waiter == self.token and queue:
                    queue[0].db_head = True
                    queue[0].wake(retry=claim)
                return
            queue = self.queues.get(payload)
            # A process behind another in the queue of waiting processes leaves
            # this release to the one ahead.
            if queue and queue[0].db_head is not False:
                queue[0].wake(retry=True)

    def _done(self) -> bool:
        """True (and the hub leaves the registry) once nobody waited for LINGER seconds."""
        with _mutex:
            if self.queues or monotonic() - self.idle_since < LINGER:
                return False
            self.closing = True
            hubs = _hubs()
            if hubs.get(self.conninfo) is self:
                del hubs[self.conninfo]
            return True

    async def _run(self) -> None:
        backoff = FIRST_RELISTEN
        try:
            while not self._done():
                conn = self.conn
                if conn is None:
                    await asleep(backoff * random.uniform(0.8, 1.2))
                    if self._done():
                        return
                    try:
                        conn = await self._open()
                    except psycopg.Error as exc:
                        logger.info("pylease: cannot LISTEN again yet: %s", exc)
                        backoff = min(backoff * 2, MAX_RELISTEN)
                        continue
                    backoff = FIRST_RELISTEN
                    self._listening(conn)
                    continue
                try:
                    async for notify in conn.notifies(timeout=TICK):
                        self._dispatch(notify.channel, notify.payload)
                except psycopg.Error as exc:
                    logger.info("pylease: the LISTEN connection was lost, waiters poll: %s", exc)
                    with _mutex:
                        self.conn = None
                        self._wake_heads()
                    await _close(conn)
        finally:
            with _mutex:
                conn, self.conn = self.conn, None
            if conn is not None:
                await _close(conn)


async def _close(conn: psycopg.AsyncConnection[Any]) -> None:
    # Closing a broken connection: nothing is left to tell.
    with contextlib.suppress(psycopg.Error):
        await conn.close()


async def _call(b: AsyncBackend, query: LiteralString, params: tuple[Any, ...], name: str) -> Any:
    assert isinstance(b, AsyncPostgresBackend)
    with wrap_errors(name):
        async with b.conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(query, params)
            row = await cur.fetchone()
    assert row is not None
    return row[0]


async def join_queue(link_: AsyncLink, waiter: AsyncWaiter) -> None:
    """Queue the head's process in the queue of waiting processes, or refresh its row."""
    hub, name = waiter.hub, waiter.name
    if not hub.db_queue:
        return
    ttl = timedelta(seconds=WAITER_TTL)
    try:
        first = await link_.run(
            lambda b: _call(b, WAIT, (name, hub.token, ttl), name), name=name, retry=True
        )
    except SchemaMissing:
        # Before migration 0005: every waiting process claims on a release.
        logger.info("pylease: no queue of waiting processes in this schema (migration 0005)")
        hub.db_queue = False
        return
    with _mutex:
        # A NOTIFY naming this process may have come while the answer was on its way.
        waiter.db_head = bool(first) or bool(waiter.db_head)
        waiter.refresh_at = monotonic() + WAITER_TTL / 3


async def claim(
    link_: AsyncLink, waiter: AsyncWaiter, ttl: timedelta, holder: str, *, status: bool
) -> tuple[int | None, list[LeaseRow] | None]:
    """Claim for a waiter, in one statement: (fence, None) when granted, else (None,
    the status rows if ``status``, else None).

    Granted while its process is queued in pylease_waiters, the claim also takes it
    out (as :func:`leave_queue` would, with the lease), in the same transaction.
    """
    name = waiter.name
    queued = waiter.db_head is not None
    tail: tuple[Any, ...] = (name, ttl, holder, name, status)
    if queued:
        op, params = CLAIM_QUEUED, (name, waiter.hub.token, *tail)
    else:
        op, params = CLAIM, tail

    async def run(b: AsyncBackend) -> list[tuple[Any, ...]]:
        assert isinstance(b, AsyncPostgresBackend)
        rows: list[tuple[Any, ...]] = await b._call(op, params, name)
        return rows

    row = (await link_.run(run, name=name, retry=True))[0]
    fence = row[0]
    if fence is not None:
        if queued:
            waiter.left = True
        return fence, None
    if not status:
        return None, None
    return None, [] if row[3] is None else [LeaseRow(*row[3:])]


async def leave_queue(link_: AsyncLink, waiter: AsyncWaiter, *, granted: bool) -> None:
    """Take the process out of the queue of waiting processes, waking the next one."""
    if waiter.db_head is None or waiter.left:
        return
    hub, name = waiter.hub, waiter.name
    waiter.db_head = None
    try:
        await link_.run(lambda b: _call(b, UNWAIT, (name, hub.token, granted), name), name=name)
    except PyleaseError as exc:
        # Its row expires by itself: the next process only waits a little longer.
        logger.info("pylease: could not leave the queue of waiters of %r: %s", name, exc)


def status_due(read_at: float, expires_at: datetime | None) -> bool:
    """Whether a head's claim should read the status, last read at ``read_at``
    (monotonic) and then showing a holder until ``expires_at`` (None: none)."""
    if expires_at is None or monotonic() - read_at >= STATUS_FRESH:
        return True
    return expires_at <= datetime.now(UTC)


def mark(conninfo: str) -> Mark | None:
    """What a waiter sees before its first claim (None: nobody listens yet)."""
    with _mutex:
        hub = _hubs().get(conninfo)
        if hub is None or hub.conn is None:
            return None
        return hub, hub.epoch, hub.heard


async def enter(conninfo: str, name: str, seen: Mark | None) -> tuple[AsyncWaiter, bool]:
    """Queue a waiter for ``name``, LISTENing first if nobody does yet.

    Returns the waiter and whether it must claim at once: only a head that may have
    missed a release since ``seen`` (taken before its first, busy claim) must.
    """
    with _mutex:
        hubs = _hubs()
        hub = hubs.get(conninfo)
        if hub is None or hub.closing:
            hub = hubs[conninfo] = AsyncHub(conninfo)
        waiter = AsyncWaiter(hub, name)
        queue = hub.queues.setdefault(name, deque())
        queue.append(waiter)
    if hub.worker is None:
        await hub.start()
    with _mutex:
        head = hub.queues[name][0] is waiter
        unchanged = seen == (hub, hub.epoch, hub.heard) and hub.conn is not None
    return waiter, head and not unchanged


def leave(waiter: AsyncWaiter, *, granted: bool) -> None:
    """Take ``waiter`` out of its queue; the next one becomes the head.

    The next claims at once unless ``waiter`` leaves with the lease (then only the
    next release can free it).
    """
    hub = waiter.hub
    with _mutex:
        queue = hub.queues.get(waiter.name)
        if queue is None or waiter not in queue:
            return
        was_head = queue[0] is waiter
        queue.remove(waiter)
        if not queue:
            del hub.queues[waiter.name]
            if not hub.queues:
                hub.idle_since = monotonic()
        elif was_head:
            queue[0].wake(retry=not granted)


def waiters(name: str | None = None) -> int:
    """How many leases of this process (event loop) wait now, for ``name`` or any."""
    with _mutex:
        return sum(
            len(queue)
            for hub in _hubs().values()
            for key, queue in hub.queues.items()
            if name is None or key == name
        )


if True:  # ASYNC
    _registries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, AsyncHub]] = (
        weakref.WeakKeyDictionary()
    )

    def _hubs() -> dict[str, AsyncHub]:
        """The hubs of the running event loop, by conninfo."""
        loop = asyncio.get_running_loop()
        found = _registries.get(loop)
        if found is None:
            found = _registries[loop] = {}
        return found

    async def _wait(event: asyncio.Event, timeout: float) -> bool:
        try:
            await asyncio.wait_for(event.wait(), max(timeout, 0.0))
        except TimeoutError:
            return False
        return True

else:
    _registry: dict[str, AsyncHub] = {}

    def _hubs() -> dict[str, AsyncHub]:
        """The hubs of this process, by conninfo."""
        return _registry

    def _wait(event: AEvent, timeout: float) -> bool:
        return event.wait(max(timeout, 0.0))

    def _after_fork() -> None:
        # A forked child has no reader thread: its waiters start a hub of their own
        # (and the mutex may have been held by a thread the child does not have).
        global _registry, _mutex
        _registry = {}
        _mutex = AMutex()

    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork)
